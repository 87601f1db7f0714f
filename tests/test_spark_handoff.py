"""The hand-off: a backfill on Spark exports a snapshot, a streaming job starts from it and reads
the rest, and together they give what one streaming job over everything gives; the snapshot's
entries have the shapes the processors' own snapshots have."""

from __future__ import annotations

from collections import Counter

import pytest

from jetwake import (
    BroadcastKey, JobConfig, Member, Pipeline, SnapshotError, Sinks, Sources,
)

from support.spark_fixtures import spark_runner  # noqa: F401
from support.spark_handoff import BASE, KEYS, WINDOW, pipeline, produce
from support.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.kafka]


def expected_windows(n: int) -> set:
    """Every window the streaming job closes once it has read all ``n`` records: the
    watermark is the lower of the two partitions' highest times (lag 0)."""
    wm = BASE + n - 2
    limit = wm - wm % WINDOW
    counts = Counter(((BASE + i) - (BASE + i) % WINDOW, f"k{i % KEYS}") for i in range(n))
    return {(s, s + WINDOW, k, c) for (s, k), c in counts.items() if s + WINDOW <= limit}


def test_backfill_then_stream_equals_one_streaming_job(spark_runner, kafka_bootstrap,
                                                        kafka_topic):
    n, cut = 200_000, 120_000
    topic = kafka_topic(partitions=2)
    produce(kafka_bootstrap, topic, n)
    per_key = n // KEYS
    all_counts = {(f"k{k}", c) for k in range(KEYS) for c in range(1, per_key + 1)}
    sums = {f"k{k}": sum(range(k, n, KEYS)) for k in range(KEYS)}
    want_windows = expected_windows(n)

    with Member() as m:
        # one streaming job over everything: the reference
        job = m.new_job(pipeline(kafka_bootstrap, topic))
        wait_until(lambda: len(m.get_list("counts")) >= n
                 and len(m.get_list("windows")) >= len(want_windows),
                   timeout=120, what="the streaming job")
        job.cancel()
        assert set(m.get_list("counts")) == all_counts
        assert {tuple(r) for r in m.get_list("windows")} == want_windows

    with Member() as m:
        result = spark_runner.run(pipeline(kafka_bootstrap, topic),
                                  until={topic: {0: cut // 2, 1: cut // 2}},
                                  export_snapshot="after-backfill", member=m)
        assert result.offsets == {topic: {0: cut // 2, 1: cut // 2}}
        # the slower partition's highest time, throttled to the window frames as the
        # streaming job's watermark is
        wm = BASE + cut - 2
        assert result.watermark == wm - wm % WINDOW
        backfilled = list(m.get_list("counts"))
        assert len(backfilled) == cut
        job = m.new_job(pipeline(kafka_bootstrap, topic),
                        JobConfig(initial_snapshot_name="after-backfill"))
        wait_until(lambda: len(m.get_list("counts")) >= n
                 and len(m.get_list("windows")) >= len(want_windows),
                   timeout=120, what="the resumed job")
        job.cancel()
        counts = list(m.get_list("counts"))
        # no record missing, none counted twice
        assert len(counts) == n and set(counts) == all_counts
        final_sums: dict = {}
        for k, s in m.get_list("sums"):
            final_sums[k] = max(s, final_sums.get(k, 0))
        assert final_sums == sums
        # the windows straddling the hand-off are complete, none is emitted twice
        windows = [tuple(r) for r in m.get_list("windows")]
        assert len(windows) == len(set(windows))
        assert set(windows) == want_windows


def shape(x):
    """The structure of a snapshot value: types, lengths and dict keys, not the values."""
    if isinstance(x, BroadcastKey):
        k = x.key
        return ("broadcast", k if isinstance(k, str) else k[0])
    if isinstance(x, dict):
        return ("dict", tuple(sorted((k, shape(v)) for k, v in x.items()
                                     if k != "offsets")))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(shape(v) for v in x))
    return type(x).__name__


def test_the_backfill_writes_the_entries_the_processors_snapshots_hold(
        spark_runner, kafka_bootstrap, kafka_topic):
    """Fails when a stateful processor's snapshot format drifts from what the backfill writes:
    the same pipeline's streaming snapshot and hand-off snapshot are compared vertex by vertex."""
    topic = kafka_topic(partitions=2)
    produce(kafka_bootstrap, topic, 2_000)

    def build() -> Pipeline:
        return pipeline(kafka_bootstrap, topic)

    with Member() as m:
        job = m.new_job(build(), JobConfig(processing_guarantee="at_least_once"))
        wait_until(lambda: len(m.get_list("counts")) >= 2_000, timeout=60, what="the streaming job")
        streamed = m.snapshot_store.read(job.export_snapshot("streamed"))
        job.cancel()
        spark_runner.run(build(), export_snapshot="backfilled", member=m)
        backfilled = m.snapshot_store.read(m.snapshot_store.get_export("backfilled"))
    assert backfilled, "the backfill wrote no state"
    for vertex, entries in backfilled.items():
        assert vertex in streamed, f"the backfill writes state of {vertex!r}, which the " \
                                   f"streaming job does not have ({sorted(streamed)})"
        theirs = {(shape(k) if isinstance(k, BroadcastKey) else "key", shape(v))
                  for k, v in streamed[vertex]}
        mine = {(shape(k) if isinstance(k, BroadcastKey) else "key", shape(v))
                for k, v in entries}
        assert mine <= theirs, f"{vertex}: the backfill writes {mine - theirs}, the " \
                               f"processors save {theirs}"
    for vertex in ("counts", "sums", "windows", "windows-accumulate"):
        assert vertex in backfilled


def test_a_snapshot_name_that_exists_fails_before_work(spark_runner, kafka_bootstrap,
                                                      kafka_topic):
    topic = kafka_topic(partitions=1)
    produce(kafka_bootstrap, topic, 10)
    with Member() as m:
        spark_runner.run(pipeline(kafka_bootstrap, topic), export_snapshot="taken", member=m)
        with pytest.raises(SnapshotError, match="'taken' exists already"):
            spark_runner.run(pipeline(kafka_bootstrap, topic), export_snapshot="taken",
                             member=m)


def test_a_missing_topic_and_an_until_before_start_fail_with_one_message(
        spark_runner, kafka_bootstrap, kafka_topic):
    from jetwake.connectors.kafka.spark import BackfillKafkaError
    with Member() as m:
        with pytest.raises(BackfillKafkaError, match="do not exist"):
            spark_runner.run(pipeline(kafka_bootstrap, "no-such-topic-for-backfill"), member=m)
        topic = kafka_topic(partitions=1)
        produce(kafka_bootstrap, topic, 10)
        p = Pipeline()
        p.read_from(Sources.kafka(topic, {"bootstrap.servers": kafka_bootstrap},
                                  start=BASE + 5)).write_to(Sinks.list("out"))
        with pytest.raises(ValueError, match="until lies before start"):
            spark_runner.run(p, until={topic: {0: 2}}, member=m)
        assert list(m.get_list("out")) == []


def test_a_stage_with_migrate_hands_off_its_state_unconverted_and_the_restore_converts_it(
        spark_runner, kafka_bootstrap, kafka_topic):
    """The backfill runs the new pipeline (migrate is not called there: it starts from no
    state); the streaming job's restore passes each handed-off state through migrate, which
    returns a state already in the new shape as it is."""
    n, cut = 2_000, 1_200
    topic = kafka_topic(partitions=2)
    produce(kafka_bootstrap, topic, n)

    def add(state, key, kv):
        state["sum"] += int(kv[1])
        return key, state["sum"]

    def upgrade(old):  # v1 kept [sum]; the backfill's states are v2's dicts already
        return old if isinstance(old, dict) else {"sum": old[0]}

    def totals():
        p = Pipeline()
        (p.read_from(Sources.kafka(topic, {"bootstrap.servers": kafka_bootstrap},
                                   key_deserializer="str", value_deserializer="json"))
          .group_by(lambda kv: kv[0])
          .map_stateful(lambda: {"sum": 0}, add, migrate=upgrade).set_name("totals")
          .write_to(Sinks.map("totals")))
        return p

    with Member() as m:
        spark_runner.run(totals(), until={topic: {0: cut // 2, 1: cut // 2}},
                         export_snapshot="with-migrate", member=m)
        job = m.new_job(totals(), JobConfig(initial_snapshot_name="with-migrate"))
        want = {f"k{k}": sum(range(k, n, KEYS)) for k in range(KEYS)}
        wait_until(lambda: dict(m.get_map("totals").items()) == want, timeout=60,
                   what="every key's total over both halves")
        assert job.metrics()["totals"]["migrated_keys"] == KEYS
        job.cancel()
