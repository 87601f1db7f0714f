"""Conformance over Kafka: the Spark backfill, a backfill handed over to a streaming job at a
random offset of each partition, and a streaming member, each against the reference model
(tests/reference/) in its streaming mode.

Hypothesis draws a spec for a streaming job (``scenarios(streaming=True)``: no batch
``aggregate``, which emits at the end of a stream) and per-partition inputs; each source's
partitions go into a fresh topic of as many partitions, and ``with_timestamps`` runs in the
Kafka source, per partition (``reference/kafka_runtimes.py``). Every sink, every late-events
sink and the late-event counts must equal what ``run_model(spec, inputs, bounded=False)``
says a streaming job has emitted once it has read everything (windows and ttl states up to
the final watermark; the backfill emits exactly that by the end of its input,
docs/backfill.md). The backfill counts late events over all stages, so runs that involve it are
compared on the total. Where the input keeps to the lag, no event may be late.

One broker, one Spark session and one member serve every example. The default budget is small
(a Spark run takes a few seconds); ``JETWAKE_CONFORMANCE_EXAMPLES=N`` (``make conformance``)
runs ``N`` examples of the member's tests and ``N // 3`` of each Spark test.

What is not compared, and why
-----------------------------
*Early window results* (``early_results_period``, emitted on wall-clock time): a backfill
closes each window in one step and emits its final result only (docs/backfill.md). The specs
have none.

Already outside what the model determines, so nothing is excluded for them: ``merge`` /
co-aggregation of two timestamped inputs, where the backfill judges no event late (the model
calls an event beyond the lag there late or on time only when every watermark the member
could have had agrees, and on time is then the only determinate answer).

Differences the suite found in the backfill, each fixed and kept below as a hand-written
example (with a predicate that checks the example still has the shape):

- ``ttl_evicted_by_another_partition``: ``map_stateful`` evicted a key of one Kafka partition
  at the watermark of another partition's record (one watermark per Spark task of the keyed
  shuffle), above any watermark a member could have had.
- ``a_partition_unread_at_the_split``: a hand-off whose backfill read nothing of a partition
  (or of a whole source) computed its watermark without it, so the streaming job found that
  partition's records late.
- ``a_dropped_record_moved_the_watermark``: the watermark a window or ttl stage met was
  computed from the records that reached the stage, so a record a stateless stage before it
  dropped did not move it, as it moves the member's source's.
- ``late_at_a_ttl_stage``: a ttl stage over Kafka judged no record late.
"""

from __future__ import annotations

import os
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, note, settings, strategies as st
from hypothesis.errors import InvalidArgument

from jetwake import Member
from jetwake.engine.core.partitioning import partition_of

from reference.generate import joined_backlogs, model_of, scenarios, skewed_partitions
from reference.kafka_runtimes import (
    KafkaEnv, a_dropped_record_moved_the_watermark, a_partition_unread_at_the_split, comparable,
    late_at_a_ttl_stage, run_backfill_then_stream, run_on_member_kafka, run_on_spark, splits,
    ttl_evicted_by_another_partition,
)
from reference.model import expected_run, run_model
from reference.result import RunResult, difference
from support.spark_fixtures import spark_runner  # noqa: F401 - a fixture

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.kafka]

EXAMPLES = int(os.environ.get("JETWAKE_CONFORMANCE_EXAMPLES") or 0)


def budget(default: int, share: int = 1) -> Callable[[Callable], Callable]:
    """``default`` examples, or ``JETWAKE_CONFORMANCE_EXAMPLES // share``; the test's timeout
    grows with them (an example takes a few seconds, shrinking a failure many examples). A
    timeout that interrupted a Spark call would leave the session's Py4J gateway unusable for
    every later test."""
    n = max(1, EXAMPLES // share) if EXAMPLES else default
    hypothesis = settings(max_examples=n, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.filter_too_much,
                                                 HealthCheck.data_too_large,
                                                 HealthCheck.function_scoped_fixture])
    return lambda test: pytest.mark.timeout(300 + 30 * n)(hypothesis(test))


@pytest.fixture(scope="module")
def stream_env(kafka_bootstrap):
    """The broker and one member for every example."""
    with Member(local_parallelism=2) as member:
        yield KafkaEnv(kafka_bootstrap, member)


@pytest.fixture(scope="module")
def kafka_env(stream_env, spark_runner):  # noqa: F811 - the fixture
    """The same, and the session's Spark runner."""
    return KafkaEnv(stream_env.bootstrap, stream_env.member, spark_runner)


def several_partitions(scenario: tuple) -> bool:
    """With a small budget, every example reads a topic of several partitions."""
    return EXAMPLES > 0 or all(len(parts) > 1
                               for parts in scenario[1]["partitions"].values())


def streaming_scenarios(**kw):
    return scenarios(streaming=True, **kw).filter(several_partitions)


def conforms(spec: dict, inputs: dict, run: RunResult) -> None:
    """``run`` equals the model's streaming result, or the test fails showing how."""
    expected = expected_run(model_of_stream(spec, inputs))
    diff = difference(comparable(expected, run), run)
    if diff:
        pytest.fail(diff)


def model_of_stream(spec: dict, inputs: dict):
    """The model's streaming result, noted for a failing example."""
    m = run_model(spec, inputs, bounded=False)
    try:
        note(f"model (streaming): final watermarks {m.final_watermark}, late {m.late_counts}")
    except InvalidArgument:
        return m  # not inside a hypothesis test: nothing to note
    model_of(spec, inputs)  # the bounded model's view of lateness and doubts
    return m


# --- property tests ------------------------------------------------------------------------------

@budget(3, 3)
@given(scenario=streaming_scenarios())
def test_the_spark_backfill_emits_what_a_streaming_job_has_emitted_at_the_end_of_the_input(
        kafka_env, scenario):
    spec, inputs = scenario
    conforms(spec, inputs, run_on_spark(spec, inputs, env=kafka_env))


@budget(4, 3)
@given(scenario=streaming_scenarios(), data=st.data())
def test_a_backfill_handed_over_to_a_streaming_job_at_any_offset_equals_one_streaming_job(
        kafka_env, scenario, data):
    spec, inputs = scenario
    split = data.draw(splits(inputs), label="split")
    conforms(spec, inputs, run_backfill_then_stream(spec, inputs, split, env=kafka_env))


@budget(2, 3)
@given(scenario=streaming_scenarios(beyond_lag=False), data=st.data())
def test_a_hand_off_of_an_input_that_keeps_to_the_lag_has_no_late_event(kafka_env, scenario,
                                                                         data):
    spec, inputs = scenario
    split = data.draw(splits(inputs), label="split")
    run = run_backfill_then_stream(spec, inputs, split, env=kafka_env)
    assert run.total_late == 0 and not any(run.late_items.values())
    conforms(spec, inputs, run)


@budget(5)
@given(scenario=streaming_scenarios())
def test_a_streaming_member_over_kafka_emits_what_the_model_says(stream_env, scenario):
    spec, inputs = scenario
    conforms(spec, inputs, run_on_member_kafka(spec, inputs, env=stream_env))


@budget(3)
@given(scenario=scenarios(streaming=True, one_partition=True))
def test_a_streaming_member_judges_events_beyond_the_lag_of_one_partition_as_the_model_does(
        stream_env, scenario):
    spec, inputs = scenario
    conforms(spec, inputs, run_on_member_kafka(spec, inputs, env=stream_env))


# --- hand-written examples -----------------------------------------------------------------------

def straddling() -> tuple[dict, dict]:
    """Two partitions, an event every 100 ms in each and a pause of 1 s after the twelfth;
    keyed tumbling windows of 1 s, sliding windows and sessions; lag 0."""
    parts = [[(100 * i + 50 * p + (1_000 if i > 12 else 0), f"k{p}", i, 100 * p + i)
              for i in range(1, 25)] for p in range(2)]
    spec = {"sources": [{"name": "a", "lag": 0}],
            "stages": [{"id": "t", "kind": "window", "inputs": ["a"],
                        "window": ["tumbling", 1_000], "keyed": True, "ops": ["count_sum"],
                        "late_sink": True},
                       {"id": "s", "kind": "window", "inputs": ["a"],
                        "window": ["sliding", 1_000, 250], "keyed": False, "ops": ["set"],
                        "late_sink": False},
                       {"id": "g", "kind": "window", "inputs": ["a"], "window": ["session", 150],
                        "keyed": True, "ops": ["count"], "late_sink": False}]}
    return spec, {"partitions": {"a": parts}, "build": []}


def test_a_window_straddling_the_hand_off_comes_out_whole(kafka_env):
    spec, inputs = straddling()
    # the backfill reads up to 600 and 750: the window [0, 1000) of each key, the sliding
    # windows around it and each key's first session are open at the hand-off
    run = run_backfill_then_stream(spec, inputs, {"a": [6, 7]}, env=kafka_env)
    assert kafka_env.backfills[-1].watermark == 600
    assert run.outputs["t"][("KeyedWindowResult", 0, 1_000, "k0", (9, 45))] == 1
    assert run.outputs["t"][("KeyedWindowResult", 0, 1_000, "k1", (9, 45))] == 1
    assert run.outputs["g"][("KeyedWindowResult", 100, 1_350, "k0", 12)] == 1
    assert run.total_late == 0
    conforms(spec, inputs, run)


def skewed_backlog() -> tuple[dict, dict]:
    """Five partitions after downtime, each 4 s of event time behind the previous one, with
    disorder within the lag: under one watermark over all of them, every record read after a
    later partition's would be late."""
    parts = skewed_partitions(5, 40, 30_000, 4_000)
    spec = {"sources": [{"name": "a", "lag": 60}],
            "stages": [{"id": "w", "kind": "window", "inputs": ["a"],
                        "window": ["sliding", 1_000, 500], "keyed": True, "ops": ["count_sum"],
                        "late_sink": True},
                       {"id": "r", "kind": "rolling", "inputs": ["a"], "op": "sum",
                        "keyed": True}]}
    return spec, {"partitions": {"a": parts}, "build": []}


def test_a_skewed_backlog_of_five_partitions_has_no_late_event_on_spark(kafka_env):
    spec, inputs = skewed_backlog()
    run = run_on_spark(spec, inputs, env=kafka_env)
    assert run.total_late == 0
    conforms(spec, inputs, run)


def test_a_skewed_backlog_handed_over_at_uneven_offsets_has_no_late_event(kafka_env):
    spec, inputs = skewed_backlog()
    # the fastest partition is read to its end by the backfill, the slowest barely started
    run = run_backfill_then_stream(spec, inputs, {"a": [40, 30, 20, 10, 1]}, env=kafka_env)
    assert run.total_late == 0
    conforms(spec, inputs, run)


# --- differences once found: backfill bugs ------------------------------------------------------------------

def _two_keys_in_one_task() -> tuple[str, str]:
    """Two keys the backfill's keyed shuffle (2 partitions) gives the same Spark task."""
    keys = [f"k{i}" for i in range(40)]
    b = next(k for k in keys[1:] if partition_of(k) % 2 == partition_of(keys[0]) % 2)
    return keys[0], b


def ttl_of_a_slow_partition() -> tuple[dict, dict]:
    """Key ``b`` of partition 1 (at time 0) meets its next event at 1200, its partition's
    watermark still 0 (lag 0); partition 0 reached 1010 meanwhile. A member's watermark is at
    most 0 when that event arrives (the lowest over the partitions), so ``b``'s state (last at
    0, ttl 100) is kept: the event's running sum is 2."""
    a, b = _two_keys_in_one_task()
    spec = {"sources": [{"name": "a", "lag": 0}],
            "stages": [{"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": 100,
                        "on_evict": False},
                       {"id": "w", "kind": "window", "inputs": ["a"], "window": ["tumbling", 10],
                        "keyed": False, "ops": ["count"], "late_sink": False}]}
    inputs = {"partitions": {"a": [[(0, a, 1, 0), (1000, a, 1, 1), (1010, a, 1, 2)],
                                   [(0, b, 1, 3), (1200, b, 1, 4)]]}, "build": []}
    return spec, inputs


def test_the_member_keeps_a_slow_partitions_ttl_state_as_the_model_says(stream_env):
    spec, inputs = ttl_of_a_slow_partition()
    assert ttl_evicted_by_another_partition(spec, inputs)
    run = run_on_member_kafka(spec, inputs, env=stream_env)
    assert run.outputs["ms"][(1200, _two_keys_in_one_task()[1], 2, 4)] == 1
    conforms(spec, inputs, run)


def test_the_backfill_keeps_a_slow_partitions_ttl_state(kafka_env):
    spec, inputs = ttl_of_a_slow_partition()
    conforms(spec, inputs, run_on_spark(spec, inputs, env=kafka_env))


def unread_partition() -> tuple[dict, dict, dict]:
    """Partition 0 reaches 5000; partition 1's one record, at 1000, is after the split."""
    spec = {"sources": [{"name": "a", "lag": 0}],
            "stages": [{"id": "w", "kind": "window", "inputs": ["a"],
                        "window": ["tumbling", 100], "keyed": True, "ops": ["count"],
                        "late_sink": True}]}
    inputs = {"partitions": {"a": [[(1000, "a", 1, 0), (5000, "a", 1, 1)],
                                   [(1000, "b", 1, 2)]]}, "build": []}
    return spec, inputs, {"a": [2, 0]}


def test_a_streaming_member_holds_the_watermark_for_a_partition_not_read_yet(stream_env):
    spec, inputs, _ = unread_partition()
    run = run_on_member_kafka(spec, inputs, env=stream_env)
    assert run.total_late == 0
    conforms(spec, inputs, run)


def test_a_hand_off_before_a_partitions_first_record_judges_none_of_it_late(kafka_env):
    spec, inputs, split = unread_partition()
    assert a_partition_unread_at_the_split(inputs, split)
    conforms(spec, inputs, run_backfill_then_stream(spec, inputs, split, env=kafka_env))


def dropped_record() -> tuple[dict, dict]:
    """One partition, lag 0; the filter drops the record at 1000 (its value is a multiple of
    5), which moves the member's watermark to 1000 all the same: 500 is late."""
    spec = {"sources": [{"name": "a", "lag": 0}],
            "stages": [{"id": "f", "kind": "stateless", "inputs": ["a"],
                        "fn": "not_multiple_of_5"},
                       {"id": "w", "kind": "window", "inputs": ["f"],
                        "window": ["tumbling", 100], "keyed": False, "ops": ["count"],
                        "late_sink": True}]}
    inputs = {"partitions": {"a": [[(0, "k", 1, 0), (1000, "k", 5, 1), (500, "k", 1, 2),
                                    (1100, "k", 1, 3)]]}, "build": []}
    return spec, inputs


def test_a_record_a_filter_drops_moves_the_members_watermark(stream_env):
    spec, inputs = dropped_record()
    run = run_on_member_kafka(spec, inputs, env=stream_env)
    assert run.late_counts == {"w": 1}
    conforms(spec, inputs, run)


def test_a_record_a_filter_drops_moves_the_backfills_watermark(kafka_env):
    spec, inputs = dropped_record()
    conforms(spec, inputs, run_on_spark(spec, inputs, env=kafka_env))


def late_at_a_ttl() -> tuple[dict, dict]:
    """One partition, lag 0: the event at 1500 is more than the ttl (100) behind the watermark
    2000 the record before it set, so the ttl stage finds it late."""
    spec = {"sources": [{"name": "a", "lag": 0}],
            "stages": [{"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": 100,
                        "on_evict": True},
                       {"id": "w", "kind": "window", "inputs": ["a"], "window": ["tumbling", 10],
                        "keyed": False, "ops": ["count"], "late_sink": False}]}
    inputs = {"partitions": {"a": [[(1000, "k", 1, 0), (2000, "k", 1, 1), (1500, "k", 1, 2),
                                    (2100, "k", 1, 3)]]}, "build": []}
    return spec, inputs


def test_a_ttl_stage_over_kafka_judges_an_event_beyond_the_ttl_late_on_spark(kafka_env):
    spec, inputs = late_at_a_ttl()
    assert late_at_a_ttl_stage(spec, inputs)
    run = run_on_spark(spec, inputs, env=kafka_env)
    assert run.total_late == 2  # at the ttl stage and at the window
    conforms(spec, inputs, run)


def unread_source() -> tuple[dict, dict, dict]:
    """Two sources co-aggregated in one window; the backfill reads all of ``a`` (up to 5000)
    and nothing of ``b``, whose one record, at 1000, then comes to the streaming job."""
    spec = {"sources": [{"name": "a", "lag": 0}, {"name": "b", "lag": 0}],
            "stages": [{"id": "w", "kind": "window", "inputs": ["a", "b"],
                        "window": ["tumbling", 100], "keyed": True, "ops": ["count", "count"],
                        "late_sink": False}]}
    inputs = {"partitions": {"a": [[(1000, "a", 1, 0), (5000, "a", 1, 1)]],
                             "b": [[(1000, "a", 1, 2), (5000, "a", 1, 3)]]}, "build": []}
    return spec, inputs, {"a": [2], "b": [0]}


def test_a_hand_off_before_a_sources_first_record_closes_no_window_of_it(kafka_env):
    spec, inputs, split = unread_source()
    assert a_partition_unread_at_the_split(inputs, split)
    run = run_backfill_then_stream(spec, inputs, split, env=kafka_env)
    assert run.outputs["w"][("KeyedWindowResult", 1000, 1100, "a", (1, 1))] == 1
    conforms(spec, inputs, run)


def test_the_examples_have_the_shapes_they_are_named_for():
    """Each hand-written example above has the shape of the difference it once showed, and a
    near miss has not."""
    assert ttl_evicted_by_another_partition(*ttl_of_a_slow_partition())
    spec, inputs, split = unread_partition()
    assert a_partition_unread_at_the_split(inputs, split)
    assert not a_partition_unread_at_the_split(inputs, {"a": [0, 0]})
    assert not a_partition_unread_at_the_split(inputs, {"a": [1, 1]})
    assert late_at_a_ttl_stage(*late_at_a_ttl())
    spec, inputs = dropped_record()
    assert a_dropped_record_moved_the_watermark(spec, inputs)
    # the same records through a filter that keeps the one at 1000
    spec["stages"][0]["fn"] = "none_on_7"
    assert not a_dropped_record_moved_the_watermark(spec, inputs)


def test_joins_handed_over_mid_stream_give_every_pair_once(kafka_env):
    # split after 20 of each partition's 40 records: interval-join entries the hand-off
    # watermark has not expired and as-of left records still waiting go over in the snapshot
    spec, inputs = joined_backlogs()
    run = run_backfill_then_stream(spec, inputs, {"a": [20, 20, 20], "b": [20, 20, 20]},
                                   env=kafka_env)
    assert sum(run.outputs["ij"].values()) == 495
    conforms(spec, inputs, run)
