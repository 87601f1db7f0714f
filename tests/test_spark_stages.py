"""The Spark backfill gives, stage by stage, the output an embedded member gives for the same
bounded input (property tests on generated inputs), and refuses what Spark cannot run."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from jetwake import (
    AggregateOperation, AggregateOperations as ops, Member, Pipeline, PipelineError, Sinks,
    Sources, TimestampError, WindowDefinition,
)
from jetwake.engine.processors.pass_through import PassThroughProcessor

from support.spark_fixtures import (  # noqa: F401 - spark_runner is a fixture
    canonical, run_on_member, run_on_spark, spark_runner,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration]

SETTINGS = settings(max_examples=3, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

# (key, value, event time): times mostly rising, some a little behind (late for small lags)
events = st.lists(st.tuples(st.integers(0, 4), st.integers(-50, 50), st.integers(-3, 12)),
                  min_size=0, max_size=60).map(
    lambda xs: [(k, v, max(0, sum(d for _, _, d in xs[:i + 1]))) for i, (k, v, _) in
                enumerate(xs)])


def same_output(runner, build, names, ordered=()):
    on_member = run_on_member(build, names)
    on_spark, result = run_on_spark(runner, build, names)
    for name in names:
        if name in ordered:
            assert on_spark[name] == on_member[name], name
        else:
            assert canonical(on_spark[name]) == canonical(on_member[name]), name
    return on_spark, result


def _key(e):
    return e[0]


def _value(e):
    return e[1]


def _time(e):
    return e[2]


@SETTINGS
@given(xs=events)
def test_stateless_stages_match_the_member(spark_runner, xs):
    def build(p):
        s = p.read_from(Sources.items(xs))
        s.map(lambda e: None if e[1] % 5 == 0 else (e[0], e[1] * 2)) \
            .filter(lambda e: e[1] > -20) \
            .flat_map(lambda e: [e] * (e[0] % 3)) \
            .write_to(Sinks.list("out"))
    same_output(spark_runner, build, ["out"])


@SETTINGS
@given(xs=events)
def test_grouped_and_keyless_aggregations_match_the_member(spark_runner, xs):
    no_combine = AggregateOperation(lambda: [], lambda a, e: a + [e[1]],
                                    finish=lambda a: sum(a))

    def build(p):
        s = p.read_from(Sources.items(xs))
        s.group_by(_key).aggregate(ops.summing(_value)).write_to(Sinks.list("sums"))
        s.aggregate(ops.counting()).write_to(Sinks.list("count"))
        s.group_by(_key).aggregate(no_combine).write_to(Sinks.list("no-combine"))
        s.aggregate(ops.max_by(_value)).write_to(Sinks.list("max"))
    same_output(spark_runner, build, ["sums", "count", "no-combine", "max"])


class _Arrivals(AggregateOperation):
    """An operation without combine whose result is the items in the order they arrived and
    the size of each chunk it was given, to show the calls it got."""

    def __init__(self):
        super().__init__(lambda: [], lambda a, e: a + [e[1]], finish=tuple)

    def accumulate_grouped(self, table, keys, items):
        for k, e in zip(keys, items):
            table[k] = table.get(k, []) + [e[1]]

    def accumulate_all(self, acc, items):
        return acc + [("chunk", len(items))] + [e[1] for e in items]


@pytest.mark.parametrize("n", [0, 1, 9_000])
def test_an_aggregation_without_combine_takes_the_member_s_calls_in_arrival_order(
        spark_runner, n):
    # keyed and keyless, of no items too: the member's one-stage step, a chunk at a time
    xs = [(i % 3, (i * 7) % 11, i) for i in range(n)]

    def build(p):
        s = p.read_from(Sources.items(xs))
        s.group_by(_key).aggregate(_Arrivals()).write_to(Sinks.list("keyed"))
        s.aggregate(_Arrivals()).write_to(Sinks.list("keyless"))
    on_spark, _ = run_on_spark(spark_runner, build, ["keyed", "keyless"])
    on_member = run_on_member(build, ["keyed", "keyless"])
    assert canonical(on_spark["keyed"]) == canonical(on_member["keyed"])
    assert dict(on_spark["keyed"]) == {k: tuple(v for kk, v, _ in xs if kk == k)
                                       for k in {k for k, _, _ in xs}}
    # where the chunks fall depends on how the member's inbox filled: the items and their
    # order do not
    (keyless,), (member_keyless,) = on_spark["keyless"], on_member["keyless"]
    assert [v for v in keyless if type(v) is int] == [v for _, v, _ in xs] \
        == [v for v in member_keyless if type(v) is int]
    chunks = [c[1] for c in keyless if type(c) is tuple]
    assert sum(chunks) == n and len(chunks) == -(-n // 4096)


@SETTINGS
@given(xs=events)
def test_distinct_sort_merge_and_hash_join_match_the_member(spark_runner, xs):
    names = [(k, f"name-{k}") for k in range(3)]

    def build(p):
        s = p.read_from(Sources.items(xs))
        s.map(_value).distinct().write_to(Sinks.list("distinct"))
        s.group_by(_key).distinct().write_to(Sinks.list("first-per-key"))
        s.sort(key=lambda e: (e[1], e[0], e[2])).write_to(Sinks.list("sorted"))
        s.map(_value).sort(reverse=True).write_to(Sinks.list("reversed"))
        s.merge(p.read_from(Sources.items(names))).write_to(Sinks.list("merged"))
        build_side = p.read_from(Sources.items(names))
        s.hash_join(build_side, _key, lambda e, n: (e, n)).write_to(Sinks.list("inner"))
        s.hash_join(build_side, _key, lambda e, n: (e, n), outer=True) \
            .write_to(Sinks.list("outer"))
    same_output(spark_runner, build,
                ["distinct", "first-per-key", "sorted", "reversed", "merged", "inner", "outer"],
                ordered=["sorted", "reversed"])


@SETTINGS
@given(xs=events)
def test_rolling_aggregate_and_map_stateful_match_the_member(spark_runner, xs):
    def build(p):
        s = p.read_from(Sources.items(xs))
        s.group_by(_key).rolling_aggregate(ops.to_list()).write_to(Sinks.list("rolling"))
        s.rolling_aggregate(ops.summing(_value)).write_to(Sinks.list("keyless"))

        def running(state, key, e):
            state.append(e[1])
            return key, len(state), sum(state)
        s.group_by(_key).map_stateful(list, running).write_to(Sinks.list("stateful"))
        # with event time from a source read in order, a key's items keep that order (not
        # their times'), and a ttl evicts at the watermarks the member's would meet
        t = s.with_timestamps(_time, 3)
        t.group_by(_key).rolling_aggregate(ops.to_list()).write_to(Sinks.list("timed"))
        t.group_by(_key).map_stateful(list, running, ttl=4,
                                      on_evict=lambda st, k, wm: ("evicted", k, len(st), wm)) \
            .write_to(Sinks.list("ttl"))
    same_output(spark_runner, build, ["rolling", "keyless", "stateful", "timed", "ttl"],
                ordered=["keyless"])


def test_a_key_s_items_keep_the_source_order_after_with_timestamps(spark_runner):
    def build(p):
        p.read_from(Sources.items([("k", "a", 30), ("k", "b", 10), ("k", "c", 20)])) \
            .with_timestamps(_time, 100).group_by(_key) \
            .rolling_aggregate(AggregateOperation(str, lambda acc, e: acc + e[1])) \
            .write_to(Sinks.list("joined"))
    on_spark, _ = same_output(spark_runner, build, ["joined"])
    assert sorted(on_spark["joined"]) == [("k", "a"), ("k", "ab"), ("k", "abc")]


def test_merged_timestamped_streams_drop_no_event_as_late(spark_runner):
    # behind its own stream's watermark, but the merged stream's watermark (the lower of the
    # two, which depends on how fast each was read) is not known to a backfill
    a = [("a", t) for t in (0, 10, 20, 5)]
    b = [("b", t) for t in (0, 1, 2)]
    p = Pipeline()
    left = p.read_from(Sources.items(a)).with_timestamps(lambda e: e[1], 0)
    right = p.read_from(Sources.items(b)).with_timestamps(lambda e: e[1], 0)
    left.merge(right).window(WindowDefinition.tumbling(10)).late_events_to(Sinks.list("late")) \
        .aggregate(ops.counting()).write_to(Sinks.list("counts"))
    with Member() as m:
        result = spark_runner.run(p, member=m)
        assert sorted(tuple(r) for r in m.get_list("counts")) == [(0, 10, 5), (10, 20, 1),
                                                                  (20, 30, 1)]
        assert list(m.get_list("late")) == []
    assert result.counters["late_events"] == 0


def test_a_files_sink_directory_holds_only_the_latest_run(spark_runner, tmp_path):
    out = tmp_path / "out"

    def run(items: list) -> None:
        p = Pipeline()
        p.read_from(Sources.items(items)).write_to(Sinks.files(str(out)))
        spark_runner.run(p)
    run([f"first-{i}" for i in range(5_000)])  # two tasks, two files
    run(["second"])                              # one task
    assert [f.read_text() for f in sorted(out.iterdir())] == ["second\n"]


def test_late_and_bad_events_go_to_their_side_sinks_unchanged(spark_runner):
    data = [("k", 0), ("k", "oops"), ("k", 5_000), ("k", 10), {"t": "not a time"}]

    def build(p):
        p.read_from(Sources.items(data)) \
            .with_timestamps(lambda e: e[1], 0, bad_events_to=Sinks.list("bad")) \
            .window(WindowDefinition.tumbling(1_000)).late_events_to(Sinks.list("late")) \
            .aggregate(ops.counting()).write_to(Sinks.list("out"))
    on_spark, result = same_output(spark_runner, build, ["bad", "late", "out"])
    assert on_spark["bad"] == [("k", "oops"), {"t": "not a time"}]
    assert on_spark["late"] == [("k", 10)]
    stages = result.counters["stages"]
    # each stage counted once, though the side outputs read their inputs a second time
    assert stages["items"] == {"items_in": 0, "items_out": 5}
    assert stages["list-sink-bad"] == {"items_in": 2, "items_out": 2}
    assert stages["list-sink-late"] == {"items_in": 1, "items_out": 1}
    assert result.counters["late_events"] == 1 and result.counters["bad_timestamps"] == 2


@SETTINGS
@given(xs=events, lag=st.integers(0, 6))
def test_windows_match_the_member_late_events_included(spark_runner, xs, lag):
    no_combine = AggregateOperation(lambda: 0, lambda a, e: a + e[1])

    def build(p):
        t = p.read_from(Sources.items(xs)).with_timestamps(_time, lag)
        t.window(WindowDefinition.tumbling(5)).group_by(_key).aggregate(ops.summing(_value)) \
            .write_to(Sinks.list("tumbling"))
        t.window(WindowDefinition.sliding(10, 5)).aggregate(ops.counting()) \
            .write_to(Sinks.list("sliding"))
        t.window(WindowDefinition.sliding(6, 3)).group_by(_key).aggregate(no_combine) \
            .write_to(Sinks.list("no-combine"))
        t.window(WindowDefinition.session(4)).group_by(_key).aggregate(ops.summing(_value)) \
            .write_to(Sinks.list("session"))
        # order-dependent accumulators: each window sees its events in arrival order
        t.window(WindowDefinition.session(3)).group_by(_key).aggregate(ops.to_list()) \
            .write_to(Sinks.list("session-list"))
        t.window(WindowDefinition.tumbling(6)).group_by(_key) \
            .aggregate(AggregateOperation(list, lambda a, e: a + [e[1]])) \
            .write_to(Sinks.list("no-combine-list"))
        other = p.read_from(Sources.items(xs[::2])).with_timestamps(_time, lag)
        t.window(WindowDefinition.tumbling(10)).group_by(_key) \
            .aggregate2(ops.counting(), other.group_by(_key), ops.summing(_value)) \
            .write_to(Sinks.list("co"))
    on_spark, result = same_output(spark_runner, build,
                                   ["tumbling", "sliding", "no-combine", "session", "co",
                                    "session-list", "no-combine-list"])
    assert result.watermark is not None


def test_files_parquet_and_json_lines_sources_match_the_member(spark_runner, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"k": i % 4, "v": i} for i in range(300)]
    (tmp_path / "lines").mkdir()
    for n in range(3):
        (tmp_path / "lines" / f"{n}.txt").write_text(
            "".join(f"line {n} {i}\n" for i in range(50)))
        with open(tmp_path / "lines" / f"{n}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows[n * 100:(n + 1) * 100])
    (tmp_path / "pq").mkdir()
    for n in range(2):
        pq.write_table(pa.Table.from_pylist(rows[n * 150:(n + 1) * 150]),
                       tmp_path / "pq" / f"part-{n}.parquet")

    def build(p):
        p.read_from(Sources.files(str(tmp_path / "lines" / "*.txt"))) \
            .write_to(Sinks.list("lines"))
        p.read_from(Sources.json_lines(str(tmp_path / "lines" / "*.jsonl"))) \
            .group_by(lambda r: r["k"]).aggregate(ops.summing(lambda r: r["v"])) \
            .write_to(Sinks.list("json"))
        p.read_from(Sources.parquet(str(tmp_path / "pq"))) \
            .group_by(lambda r: r["k"]).rolling_aggregate(ops.counting()) \
            .write_to(Sinks.list("parquet"))
    on_spark, _ = same_output(spark_runner, build, ["lines", "json", "parquet"])
    assert len(on_spark["lines"]) == 150
    assert sorted(on_spark["json"]) == [(k, sum(r["v"] for r in rows if r["k"] == k))
                                        for k in range(4)]


def test_files_and_map_sinks_write_what_the_member_writes(spark_runner, tmp_path):
    words = [f"w{i % 7}" for i in range(200)]
    with Member() as m:
        m.get_map("seed").put_all({f"w{i}": i for i in range(7)})
        p = Pipeline()
        counts = p.read_from(Sources.items(words)).group_by(lambda w: w) \
            .aggregate(ops.counting())
        counts.write_to(Sinks.map("counts"))
        counts.map(lambda kv: f"{kv[0]}={kv[1]}").write_to(Sinks.files(str(tmp_path / "out")))
        p.read_from(Sources.map("seed")).map(lambda kv: (kv[0], kv[1] * 10)) \
            .write_to(Sinks.map("scaled"))
        result = spark_runner.run(p, member=m)
        assert dict(m.get_map("counts").items()) == {f"w{i}": words.count(f"w{i}")
                                                    for i in range(7)}
        assert dict(m.get_map("scaled").items()) == {f"w{i}": i * 10 for i in range(7)}
    lines = [line for f in os.listdir(tmp_path / "out")
             for line in (tmp_path / "out" / f).read_text().splitlines()]
    assert sorted(lines) == sorted(f"w{i}={words.count(f'w{i}')}" for i in range(7))
    assert result.counters["stages"]["aggregate"] == {"items_in": 200, "items_out": 7}


def test_a_custom_transform_fails_before_spark_starts_naming_the_stage(spark_runner):
    p = Pipeline()
    p.read_from(Sources.items([1, 2])).custom_transform("my-processors", PassThroughProcessor) \
        .write_to(Sinks.noop())
    with pytest.raises(PipelineError, match="'my-processors' is a custom_transform"):
        spark_runner.run(p)


def test_a_function_that_raises_in_a_task_fails_the_run_naming_its_stage(spark_runner):
    from jetwake.connectors.spark import BackfillTaskError
    p = Pipeline()
    p.read_from(Sources.items(range(10))).map(lambda x: 10 // (x - 5)).set_name("divide") \
        .write_to(Sinks.list("out"))
    with Member() as m, pytest.raises(BackfillTaskError) as failed:
        spark_runner.run(p, member=m)
    assert str(failed.value) == ("stage 'divide' (map) failed in a Spark task: "
                                 "ZeroDivisionError: integer division or modulo by zero")
    assert failed.value.error_type == "ZeroDivisionError"
    # the worker's traceback points at the user's function
    assert "10 // (x - 5)" in failed.value.worker_traceback


def test_an_error_of_jetwake_in_a_task_is_raised_as_itself(spark_runner):
    p = Pipeline()
    p.read_from(Sources.items([(1, 10), (2, None)])).with_timestamps(lambda e: e[1], 0) \
        .write_to(Sinks.list("out"))
    with Member() as m, pytest.raises(TimestampError,
                                      match="cannot read the timestamp of item \\(2, None\\)"):
        spark_runner.run(p, member=m)


def test_an_unbounded_source_other_than_kafka_is_refused():
    from jetwake import SparkRunner
    p = Pipeline()
    p.read_from(Sources.map_journal("events")).write_to(Sinks.noop())
    # the check comes before any Spark session is started
    with pytest.raises(PipelineError, match="cannot be read by a backfill"):
        SparkRunner(master="local[1]").run(p, member=object())


def test_a_member_sink_without_member_is_refused():
    from jetwake import SparkRunner
    p = Pipeline()
    p.read_from(Sources.items([1])).write_to(Sinks.list("out"))
    with pytest.raises(PipelineError, match="pass member="):
        SparkRunner(master="local[1]").run(p)


def test_a_spark_master_that_is_not_there_fails_with_one_clear_message():
    import socket

    from jetwake import SparkRunner
    from jetwake.connectors.spark import SparkMasterError
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = Pipeline()
    p.read_from(Sources.items([1])).write_to(Sinks.noop())
    with pytest.raises(SparkMasterError, match=f"spark://127.0.0.1:{port} does not answer"):
        SparkRunner(master=f"spark://127.0.0.1:{port}").run(p)


def test_windows_over_several_spark_partitions_match_the_member_late_events_included(
        spark_runner):
    # enough events for two Spark partitions: the second one's watermarks start from the
    # highest time of the first, as the member's one reader of the list has it
    import random
    rnd = random.Random(5)
    xs = [(rnd.randrange(20), 1, i // 10 - rnd.randrange(40)) for i in range(6_000)]

    def build(p):
        # each window reads a timestamp stage of its own (the one-consumer path), and both
        # read one together (the shared path)
        for name in ("sliding", "session"):
            t = p.read_from(Sources.items(xs)).with_timestamps(_time, 12)
            w = WindowDefinition.sliding(20, 5) if name == "sliding" else \
                WindowDefinition.session(3)
            t.window(w).group_by(_key).aggregate(ops.counting()).write_to(Sinks.list(name))
        shared = p.read_from(Sources.items(xs)).with_timestamps(_time, 12)
        shared.window(WindowDefinition.tumbling(10)).aggregate(ops.counting()) \
            .write_to(Sinks.list("tumbling"))
        shared.window(WindowDefinition.sliding(20, 5)).group_by(_key) \
            .aggregate(ops.counting()).write_to(Sinks.list("shared"))
    on_spark, result = same_output(spark_runner, build,
                                   ["sliding", "session", "tumbling", "shared"])
    assert sorted(on_spark["shared"]) == sorted(on_spark["sliding"])
    for stage in ("timestamps", "window-aggregate"):
        assert result.counters["stages"][stage]["items_in"] == len(xs)
    assert result.counters["late_events"] > 0  # the disorder makes some events late
    assert len(on_spark["sliding"]) > 100
