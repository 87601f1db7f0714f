"""Wrong arguments fail at the call, before anything runs, with a message that names the
problem and the fix."""

from __future__ import annotations

import pytest

from jetwake import (
    AggregateOperation, AggregateOperations as Ops, JobConfig, JobStatus, Member, Pipeline,
    PipelineError, Processor, Sinks, Sources,
)

TIMEOUT = 20


@pytest.fixture
def member():
    with Member(local_parallelism=2) as m:
        yield m


def stage():
    return Pipeline().read_from(Sources.items([1, 2, 3]))


# --- stage functions must be callables -----------------------------------------------------

@pytest.mark.parametrize("method", ["map", "filter", "flat_map", "group_by"])
def test_stage_method_rejects_a_non_callable(method):
    with pytest.raises(TypeError, match="callable") as e:
        getattr(stage(), method)("not a function")
    assert f"{method}()" in str(e.value)
    assert "str" in str(e.value)  # names what was passed


def test_sort_rejects_a_non_callable_key():
    with pytest.raises(TypeError, match=r"sort\(\) expects a callable"):
        stage().sort(key=42)


def test_rebalance_rejects_a_non_callable_key():
    with pytest.raises(TypeError, match=r"rebalance\(\) expects a callable"):
        stage().rebalance(key_fn="k")


@pytest.mark.parametrize("arg", ["key_fn", "join_fn", "build_key_fn", "build_value_fn"])
def test_hash_join_rejects_a_non_callable(arg):
    p = Pipeline()
    s = p.read_from(Sources.items([1]))
    build = p.read_from(Sources.items([(1, 2)]))
    kwargs = {"key_fn": lambda x: x}
    kwargs[arg] = 5
    with pytest.raises(TypeError, match="callable") as e:
        s.hash_join(build, **kwargs)
    assert arg in str(e.value)


def test_hash_join_rejects_a_build_side_that_is_not_a_stage():
    with pytest.raises(TypeError, match="expects a stage"):
        stage().hash_join([(1, 2)], lambda x: x)


def test_merge_rejects_a_stage_of_another_pipeline():
    with pytest.raises(PipelineError, match="another pipeline"):
        stage().merge(stage())


def test_aggregate_operations_reject_non_callables():
    for factory in (Ops.summing, Ops.averaging, Ops.min_by, Ops.max_by):
        with pytest.raises(TypeError, match="callable"):
            factory(3)
    with pytest.raises(TypeError, match="callable"):
        Ops.to_dict("k", lambda x: x)
    with pytest.raises(TypeError, match="create"):
        AggregateOperation(create=0, accumulate=lambda a, x: a)


def test_all_of_rejects_non_operations_and_no_operations():
    with pytest.raises(TypeError, match="argument 1"):
        Ops.all_of(Ops.counting(), len)
    with pytest.raises(ValueError, match="at least one"):
        Ops.all_of()


# --- sources and sinks ---------------------------------------------------------------------

def test_map_sink_rejects_an_empty_name():
    with pytest.raises(ValueError, match="non-empty name") as e:
        Sinks.map("")
    assert "Sinks.map()" in str(e.value)


def test_list_sink_rejects_none_as_name():
    with pytest.raises(ValueError, match="non-empty name") as e:
        Sinks.list(None)
    assert "Sinks.list()" in str(e.value) and "None" in str(e.value)


def test_map_sink_needs_both_key_and_value_functions():
    with pytest.raises(ValueError, match="both key_fn and value_fn"):
        Sinks.map("m", key_fn=lambda x: x)


def test_map_with_merging_needs_a_callable_merge_fn():
    with pytest.raises(TypeError, match="merge_fn"):
        Sinks.map_with_merging("m", "add")


def test_items_source_rejects_a_non_iterable():
    with pytest.raises(TypeError, match="iterable") as e:
        Sources.items(5)
    assert "int" in str(e.value)


def test_items_source_rejects_a_string():
    with pytest.raises(TypeError, match="iterable of items"):
        Sources.items("abc")


def test_files_source_on_a_missing_directory_fails_naming_it(tmp_path):
    missing = tmp_path / "no-such-dir"
    with pytest.raises(FileNotFoundError, match="does not exist") as e:
        Sources.files(str(missing / "*.txt"))
    assert "no-such-dir" in str(e.value)


def test_files_source_rejects_an_empty_pattern():
    with pytest.raises(ValueError, match="glob pattern"):
        Sources.files("")


def test_map_source_rejects_an_empty_name():
    with pytest.raises(ValueError, match="Sources.map"):
        Sources.map("  ")


# --- wiring ----------------------------------------------------------------------------------

def test_stage_after_a_sink_is_rejected_naming_the_sink():
    p = Pipeline()
    sink_stage = p.read_from(Sources.items([1])).write_to(Sinks.list("out"))
    with pytest.raises(PipelineError) as e:
        sink_stage.map(lambda x: x)
    msg = str(e.value)
    assert "list-sink-out" in msg and "sink" in msg
    assert "write_to() on that stage again" in msg  # the fix


def test_read_from_rejects_a_non_source():
    with pytest.raises(TypeError, match="expects a Source") as e:
        Pipeline().read_from([1, 2, 3])
    assert "Sources" in str(e.value) and "list" in str(e.value)


def test_write_to_rejects_a_non_sink():
    with pytest.raises(TypeError, match="expects a Sink") as e:
        stage().write_to("out.txt")
    assert "Sinks" in str(e.value) and "str" in str(e.value)


def test_aggregate_rejects_a_non_aggregate_operation():
    with pytest.raises(TypeError, match="AggregateOperation") as e:
        stage().aggregate(sum)
    assert "AggregateOperations" in str(e.value)


def test_grouped_aggregate_rejects_a_non_aggregate_operation():
    with pytest.raises(TypeError, match=r"group_by\(\).aggregate\(\)"):
        stage().group_by(lambda x: x).aggregate(Ops.counting)  # the factory, not its result


def test_custom_transform_rejects_a_processor_instance():
    with pytest.raises(TypeError, match="factory"):
        stage().custom_transform("c", Processor())


def test_set_local_parallelism_rejects_zero():
    with pytest.raises(ValueError, match="positive int"):
        stage().map(str).set_local_parallelism(0)


def test_set_name_rejects_a_name_already_used():
    p = Pipeline()
    s = p.read_from(Sources.items([1]))
    s.map(str).set_name("step")
    with pytest.raises(PipelineError, match="'step' is already used"):
        s.filter(bool).set_name("step")


# --- job configuration and submission ------------------------------------------------------

def test_job_config_rejects_an_unknown_processing_guarantee():
    with pytest.raises(ValueError, match="processing_guarantee") as e:
        JobConfig(processing_guarantee="exactly-once")
    assert "exactly_once" in str(e.value)  # lists the valid values


@pytest.mark.parametrize("interval", [0, -5, 1.5, "1000"])
def test_job_config_rejects_an_invalid_snapshot_interval(interval):
    with pytest.raises(ValueError, match="snapshot_interval_ms") as e:
        JobConfig(snapshot_interval_ms=interval)
    assert "positive int" in str(e.value)


def test_job_config_rejects_a_blank_name():
    with pytest.raises(ValueError, match="name"):
        JobConfig(name="  ")


def test_new_job_with_a_pipeline_without_sink_fails_before_running(member):
    p = Pipeline()
    p.read_from(Sources.items([1])).map(str)
    with pytest.raises(PipelineError, match="no sink") as e:
        member.new_job(p)
    assert "write_to" in str(e.value)
    assert member.jobs() == []


def test_new_job_with_an_empty_pipeline_fails(member):
    with pytest.raises(PipelineError, match="empty"):
        member.new_job(Pipeline())


def test_new_job_rejects_something_that_is_not_a_pipeline(member):
    with pytest.raises(TypeError, match="Pipeline or a DAG"):
        member.new_job([1, 2, 3])


def test_new_job_rejects_a_config_that_is_not_a_job_config(member):
    p = Pipeline()
    p.read_from(Sources.items([1])).write_to(Sinks.list("x"))
    with pytest.raises(TypeError, match="JobConfig"):
        member.new_job(p, {"name": "x"})


class Forever(Processor):
    def complete(self):
        return False


def test_duplicate_running_job_name_is_rejected(member):
    from jetwake import DAG
    dag = DAG()
    dag.new_vertex("forever", Forever, 1)
    job = member.new_job(dag, JobConfig(name="nightly"))
    try:
        p = Pipeline()
        p.read_from(Sources.items([1])).write_to(Sinks.list("x"))
        with pytest.raises(ValueError, match="'nightly' already exists") as e:
            member.new_job(p, JobConfig(name="nightly"))
        assert "choose another name or cancel" in str(e.value)
    finally:
        job.cancel()
    with pytest.raises(Exception):
        job.join(timeout=5)


def test_job_name_can_be_reused_after_the_job_ended(member):
    for _ in range(2):
        p = Pipeline()
        p.read_from(Sources.items([1])).write_to(Sinks.list("x"))
        member.new_job(p, JobConfig(name="daily")).join(timeout=TIMEOUT)
    assert list(member.get_list("x")) == [1, 1]


def test_map_sink_receiving_non_tuples_fails_the_job_naming_the_item(member):
    p = Pipeline()
    p.read_from(Sources.items(["just-a-string"])).write_to(Sinks.map("m"))
    job = member.new_job(p)
    with pytest.raises(TypeError) as e:
        job.join(timeout=TIMEOUT)
    msg = str(e.value)
    assert "'just-a-string'" in msg and "(key, value)" in msg
    assert "key_fn and value_fn" in msg  # the fix
    assert job.status is JobStatus.FAILED


def test_map_sink_receiving_a_three_tuple_fails_the_job(member):
    p = Pipeline()
    p.read_from(Sources.items([(1, 2, 3)])).write_to(Sinks.map("m"))
    with pytest.raises(TypeError, match=r"\(1, 2, 3\)"):
        member.new_job(p).join(timeout=TIMEOUT)


def test_unserializable_group_key_fails_the_job_naming_the_type(member):
    class Opaque:
        pass

    p = Pipeline()
    p.read_from(Sources.items([1, 2])).group_by(lambda x: Opaque()) \
        .aggregate(Ops.counting()).write_to(Sinks.list("x"))
    with pytest.raises(TypeError, match="register_type"):
        member.new_job(p).join(timeout=TIMEOUT)


def test_new_job_on_a_shut_down_member_is_refused():
    m = Member()
    m.shutdown()
    p = Pipeline()
    p.read_from(Sources.items([1])).write_to(Sinks.list("x"))
    with pytest.raises(RuntimeError, match="shut down"):
        m.new_job(p)


def test_member_rejects_invalid_parallelism():
    with pytest.raises(ValueError, match="local_parallelism"):
        Member(local_parallelism=0)


def test_source_leading_nowhere_fails_before_running_naming_its_vertex(member):
    p = Pipeline()
    p.read_from(Sources.items([1])).set_name("forgotten")
    p.read_from(Sources.items([2])).write_to(Sinks.list("x"))
    from jetwake import DagValidationError
    with pytest.raises(DagValidationError, match="'forgotten' is not connected"):
        member.new_job(p)
    assert list(member.get_list("x")) == []
