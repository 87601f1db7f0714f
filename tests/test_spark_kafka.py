"""Kafka on Spark, record by record: where a backfill starts and stops reading (`start`,
`until` as a timestamp or as offsets), records that cannot be deserialized (`on_error`), and
`Sinks.kafka` from Spark tasks, idempotent or one transaction per task, with a task attempt
that fails half-way through its transaction and is retried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from jetwake import Client, Member, Pipeline, Sinks, Sources, SparkRunner
from jetwake.connectors.kafka.source import KafkaDeserializationError

from support.ordered_producer import ordered_producer
from support.spark_fixtures import spark_runner  # noqa: F401
from support.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.kafka]

BASE = 1_700_000_000_000
BIN = Path(sys.executable).parent


def produce_values(bootstrap: str, topic: str, values: list[bytes], partition: int = 0,
                   first_time: int = BASE) -> None:
    """``values`` into one partition, the i-th with record time ``first_time + i``."""
    p = ordered_producer(bootstrap, {"linger.ms": 5})
    for i, v in enumerate(values):
        while True:
            try:
                p.produce(topic, v, f"k{i}".encode(), partition=partition,
                          timestamp=first_time + i)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def read_all(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[bytes]:
    """Every value of ``topic`` a consumer with ``isolation`` sees, read up to the end."""
    from confluent_kafka import TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{os.getpid()}",
                  "isolation.level": isolation, "enable.auto.commit": False,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        values, at_end = [], set()
        while len(at_end) < len(parts):
            m = c.poll(10)
            assert m is not None, f"no end of partition reached in {topic!r}"
            if m.error():
                at_end.add(m.partition())
                continue
            values.append(m.value())
        return values
    finally:
        c.close()


def values_pipeline(bootstrap: str, topic: str, **source_options) -> Pipeline:
    p = Pipeline()
    p.read_from(Sources.kafka(topic, {"bootstrap.servers": bootstrap},
                              value_deserializer="json", **source_options)) \
        .map(lambda kv: kv[1]).write_to(Sinks.list("values"))
    return p


# ---- where reading starts and stops --------------------------------------------------------

def test_until_a_timestamp_stops_before_the_first_record_at_that_time(
        spark_runner, kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=1)
    produce_values(kafka_bootstrap, topic, [str(i).encode() for i in range(1_000)])
    with Member() as m:
        result = spark_runner.run(values_pipeline(kafka_bootstrap, topic), until=BASE + 600,
                                  member=m)
        assert sorted(m.get_list("values")) == list(range(600))
    assert result.offsets == {topic: {0: 600}}


def test_start_a_timestamp_and_until_offsets_read_the_range_between(
        spark_runner, kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=1)
    produce_values(kafka_bootstrap, topic, [str(i).encode() for i in range(1_000)])
    with Member() as m:
        result = spark_runner.run(values_pipeline(kafka_bootstrap, topic, start=BASE + 250),
                                  until={topic: {0: 700}}, member=m)
        assert sorted(m.get_list("values")) == list(range(250, 700))
    assert result.offsets == {topic: {0: 700}}
    assert result.counters["records_in"] == 450


def test_until_reads_offsets_from_a_json_file(spark_runner, kafka_bootstrap, kafka_topic,
                                              tmp_path):
    topic = kafka_topic(partitions=2)
    produce_values(kafka_bootstrap, topic, [str(i).encode() for i in range(100)], partition=0)
    produce_values(kafka_bootstrap, topic, [str(i).encode() for i in range(100, 200)],
                   partition=1)
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({topic: {"0": 10, "1": 30}}))
    with Member() as m:
        result = spark_runner.run(values_pipeline(kafka_bootstrap, topic), until=str(offsets),
                                  member=m)
        assert sorted(m.get_list("values")) == list(range(10)) + list(range(100, 130))
    assert result.offsets == {topic: {0: 10, 1: 30}}


def test_until_offsets_that_miss_a_partition_fail_naming_it(spark_runner, kafka_bootstrap,
                                                            kafka_topic):
    topic = kafka_topic(partitions=2)
    with Member() as m, pytest.raises(ValueError, match="no offset for partition 1"):
        spark_runner.run(values_pipeline(kafka_bootstrap, topic), until={topic: {0: 0}},
                         member=m)


# ---- records that cannot be deserialized ---------------------------------------------------

def test_undecodable_records_go_to_the_dead_letter_topic_and_are_counted(
        spark_runner, kafka_bootstrap, kafka_topic):
    topic, dead = kafka_topic(partitions=1), kafka_topic(partitions=1)
    values = [b"not json" if i % 10 == 3 else str(i).encode() for i in range(100)]
    produce_values(kafka_bootstrap, topic, values)
    with Member() as m:
        result = spark_runner.run(values_pipeline(kafka_bootstrap, topic, on_error="dead_letter",
                                                  dead_letter_topic=dead), member=m)
        assert sorted(m.get_list("values")) == [i for i in range(100) if i % 10 != 3]
    assert result.counters["dead_letters"] == 10
    assert result.counters["records_in"] == 100  # dead letters were read too
    assert read_all(kafka_bootstrap, dead) == [b"not json"] * 10


def test_an_undecodable_record_fails_the_run_naming_where_it_is(spark_runner, kafka_bootstrap,
                                                                 kafka_topic):
    topic = kafka_topic(partitions=1)
    produce_values(kafka_bootstrap, topic, [b"1", b"2", b"{oops", b"4"])
    with Member() as m, pytest.raises(KafkaDeserializationError,
                                      match=f"{topic}'?, partition 0, offset 2"):
        spark_runner.run(values_pipeline(kafka_bootstrap, topic), member=m)


# ---- Sinks.kafka from Spark tasks ----------------------------------------------------------

def _to_kafka(bootstrap: str, topic: str, n: int, exactly_once: bool) -> Pipeline:
    p = Pipeline()
    p.read_from(Sources.items(range(n))) \
        .write_to(Sinks.kafka(topic, {"bootstrap.servers": bootstrap},
                              value_fn=lambda i: str(i), exactly_once=exactly_once))
    return p


@pytest.mark.parametrize("exactly_once", [False, True], ids=["idempotent", "transactional"])
def test_the_kafka_sink_writes_every_item_once(spark_runner, kafka_bootstrap, kafka_topic,
                                               exactly_once):
    topic = kafka_topic(partitions=3)
    result = spark_runner.run(_to_kafka(kafka_bootstrap, topic, 20_000, exactly_once))
    got = sorted(int(v) for v in read_all(kafka_bootstrap, topic))
    assert got == list(range(20_000))
    assert result.counters["stages"][f"kafka-sink-{topic}"]["items_out"] == 20_000


# A Spark task writes items 0..N-1 of its partition in one transaction. Its first attempt fails
# half-way: after the records of its earlier chunks have reached the broker (the failing map
# waits until a read_uncommitted consumer sees them), so that only the retried attempt's
# fencing of the first one's transaction keeps them from being read twice.
RETRIED_TASK_FILE = '''
import sys, time
from jetwake import Pipeline, Sinks, Sources

servers, topic, n, fail_at, mark = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    int(sys.argv[4]), sys.argv[5]

def fail_on_first_attempt(i):
    from confluent_kafka import Consumer, TopicPartition
    from pyspark import TaskContext
    if i == fail_at and TaskContext.get().attemptNumber() == 0:
        c = Consumer({"bootstrap.servers": servers, "group.id": "peek",
                      "isolation.level": "read_uncommitted", "enable.auto.commit": False})
        c.assign([TopicPartition(topic, 0, 0)])
        seen, deadline = 0, time.monotonic() + 60
        while seen < 4096 and time.monotonic() < deadline:
            seen += len([m for m in c.consume(1000, 0.2) if not m.error()])
        c.close()
        with open(mark, "w") as f:
            f.write(str(seen))
        raise RuntimeError("the first attempt of this task fails half-way")
    return i

pipeline = Pipeline()
(pipeline.read_from(Sources.items(range(n)))
    .map(fail_on_first_attempt)
    .write_to(Sinks.kafka(topic, {"bootstrap.servers": servers, "linger.ms": 0},
                          value_fn=str, exactly_once=True)))
'''


def test_a_retried_task_fences_its_failed_attempt_and_each_item_is_read_once(
        kafka_bootstrap, kafka_topic, tmp_path):
    topic = kafka_topic(partitions=1)
    f = tmp_path / "retried.py"
    f.write_text(RETRIED_TASK_FILE)
    mark = tmp_path / "first-attempt"
    n = 3 * 4096
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    # local[1,2]: one core, and a failed task is tried twice; the items are one Spark partition
    # of three chunks, and the third chunk's first item fails the first attempt
    proc = subprocess.run([str(BIN / "jetwake"), "backfill", str(f), "--master", "local[1,2]",
                           "--conf", "spark.ui.enabled=false", "--", kafka_bootstrap, topic,
                           str(n), str(2 * 4096), str(mark)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(mark.read_text()) >= 4096, "the first attempt's records never reached the broker"
    # the aborted attempt's records are in the log ...
    assert len(read_all(kafka_bootstrap, topic, "read_uncommitted")) > n
    # ... and a read_committed consumer reads every item once
    assert sorted(int(v) for v in read_all(kafka_bootstrap, topic)) == list(range(n))


# ---- a member's map as a source, through its client ----------------------------------------

def test_a_map_source_is_read_from_the_member_through_its_client(spark_runner):
    with Member(port=0) as m, Client(m.address) as client:
        m.get_map("prices").put_all({f"item-{i}": i for i in range(5_000)})
        p = Pipeline()
        p.read_from(Sources.map("prices")).filter(lambda kv: kv[1] % 2 == 0) \
            .write_to(Sinks.map("even"))
        spark_runner.run(p, member=client)
        assert dict(m.get_map("even").items()) == {f"item-{i}": i for i in range(0, 5_000, 2)}


def test_a_runner_accepts_an_existing_spark_session(spark_runner):
    p = Pipeline()
    p.read_from(Sources.items(["a", "b", "a"])).write_to(Sinks.list("out"))
    with Member() as m:
        given = SparkRunner(spark=spark_runner.spark)
        given.run(p, member=m)
        assert sorted(m.get_list("out")) == ["a", "a", "b"]
        given.stop()  # a session it was given stays up for its owner
        assert given.spark is spark_runner.spark
        spark_runner.run(p, member=m)
        assert len(m.get_list("out")) == 6


def test_a_task_that_fails_aborts_its_transaction(spark_runner, kafka_bootstrap, kafka_topic):
    from jetwake.connectors.spark import BackfillTaskError
    topic = kafka_topic(partitions=1)

    def fail_late(i):
        if i == 3 * 4096:
            raise RuntimeError("the task fails after writing three chunks")
        return i
    p = Pipeline()
    p.read_from(Sources.items(range(4 * 4096))).map(fail_late) \
        .write_to(Sinks.kafka(topic, {"bootstrap.servers": kafka_bootstrap, "linger.ms": 0},
                              value_fn=str, exactly_once=True))
    with pytest.raises(BackfillTaskError, match="the task fails after writing three chunks"):
        spark_runner.run(p)
    # aborted, not left open: a read_committed consumer reaches the end at once (an open
    # transaction would hold it back until the broker's transaction timeout), and reads none
    # of the records the failing task (items 8192 on) wrote; the other task's committed, or
    # was killed with the job and fenced
    got = sorted(int(v) for v in read_all(kafka_bootstrap, topic))
    assert got in ([], list(range(2 * 4096)))


def test_records_of_keys_in_one_partition_keep_their_offset_order_across_the_hand_off(
        spark_runner, kafka_bootstrap, kafka_topic):
    from jetwake import AggregateOperations, JobConfig
    topic = kafka_topic(partitions=1)
    # times out of order within the lag: a key's state must follow the offsets, not the times
    times = [5, 3, 4, 8, 20, 18, 30, 25]
    p = ordered_producer(kafka_bootstrap)
    for i, t in enumerate(times):
        p.produce(topic, "abcdefgh"[i].encode(), b"k", partition=0, timestamp=BASE + t)
    assert p.flush(30) == 0

    def pipeline() -> Pipeline:
        pl = Pipeline()
        pl.read_from(Sources.kafka(topic, {"bootstrap.servers": kafka_bootstrap},
                                   key_deserializer="str", value_deserializer="str")) \
            .with_native_timestamps(allowed_lag=100).group_by(lambda kv: kv[0]) \
            .rolling_aggregate(AggregateOperations.to_list()) \
            .map(lambda kv: "".join(v for _, v in kv[1])).write_to(Sinks.list("seen"))
        return pl
    with Member() as m:
        spark_runner.run(pipeline(), until={topic: {0: 4}}, export_snapshot="half", member=m)
        assert sorted(m.get_list("seen")) == ["a", "ab", "abc", "abcd"]
        job = m.new_job(pipeline(), JobConfig(initial_snapshot_name="half"))
        wait_until(lambda: len(m.get_list("seen")) >= len(times), timeout=60, interval=0.1,
                   what=lambda: f"{len(times)} items seen ({sorted(m.get_list('seen'))})")
        job.cancel()
        assert sorted(m.get_list("seen"), key=len)[-1] == "abcdefgh"


def test_a_ttl_over_kafka_evicts_as_the_partition_s_time_passes_not_only_at_the_end(
        spark_runner, kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=1)
    n = 12_000
    # key "a" in records 0-999 and again from 9,000; between, 8,000 records (80 s) of other
    # keys: far more than the ttl, so a streaming job lets a's first state expire
    keys = ["a" if i < 1_000 or i >= 9_000 else f"filler-{i % 7}" for i in range(n)]
    p = ordered_producer(kafka_bootstrap, {"linger.ms": 5})
    for i, k in enumerate(keys):
        p.produce(topic, b"x", k.encode(), partition=0, timestamp=BASE + 10 * i)
    assert p.flush(60) == 0

    def count(state, key, item):
        state["n"] = state.get("n", 0) + 1
    pl = Pipeline()
    pl.read_from(Sources.kafka(topic, {"bootstrap.servers": kafka_bootstrap},
                               key_deserializer="str")) \
        .with_native_timestamps(allowed_lag=0).group_by(lambda kv: kv[0]) \
        .map_stateful(dict, count, ttl=2_000,
                      on_evict=lambda state, key, wm: ("evicted", key, state["n"])) \
        .write_to(Sinks.list("evicted"))
    with Member() as m:
        spark_runner.run(pl, until={topic: {0: n}}, export_snapshot="with-ttl", member=m)
        evicted = list(m.get_list("evicted"))
        # a's first state, evicted in the gap; the fillers, whose time ended before the cut
        assert [e for e in evicted if e[1] == "a"] == [("evicted", "a", 1_000)]
        assert sum(e[2] for e in evicted if e[1] != "a") == 8_000
        state = dict(m.snapshot_store.read(m.snapshot_store.get_export("with-ttl"))
                     ["map-stateful"])
        assert state["a"][0] == {"n": 3_000}


# ---- event time per partition ---------------------------------------------------------------

def _event_windows(bootstrap: str, topic: str) -> Pipeline:
    from jetwake import AggregateOperations, WindowDefinition
    p = Pipeline()
    (p.read_from(Sources.kafka(topic, {"bootstrap.servers": bootstrap},
                               value_deserializer="json"))
      .with_timestamps(lambda kv: kv[1]["ts"], allowed_lag=100)
      .window(WindowDefinition.tumbling(1_000))
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.list("windows")))
    return p


def _produce_json(bootstrap: str, topic: str, partition: int, times: list[int]) -> None:
    produce_values(bootstrap, topic, [json.dumps({"ts": t}).encode() for t in times],
                   partition=partition)


def test_a_backfill_judges_a_record_late_by_its_own_partition_as_a_member_does(
        spark_runner, kafka_bootstrap, kafka_topic):
    """One partition: the record 1.6 s behind the newest (lag 100, so its window [1 s, 2 s)
    has closed) is late on Spark exactly as on a member, and missing from its window."""
    topic = kafka_topic(partitions=1)
    times = [BASE + 10 * i for i in range(300)] + [BASE + 1_390] + \
        [BASE + 3_000 + 10 * i for i in range(300)]
    _produce_json(kafka_bootstrap, topic, 0, times)
    with Member() as m:
        result = spark_runner.run(_event_windows(kafka_bootstrap, topic), until="latest",
                                  member=m)
        spark = sorted((r.start, r.result) for r in m.get_list("windows"))
    with Member(local_parallelism=1) as m:
        job = m.new_job(_event_windows(kafka_bootstrap, topic))
        windows = m.get_list("windows")
        wait_for = [(s, n) for s, n in spark if s + 1_000 <= BASE + 5_990 - 100]
        wait_until(lambda: sorted((r.start, r.result) for r in windows) == wait_for,
                   timeout=60, interval=0.05,
                   what=lambda: f"the windows {wait_for}, not "
                   f"{sorted((r.start, r.result) for r in windows)}")
        member_late = sum(v.get("late_events", 0) for v in job.metrics().values())
        job.cancel()
    assert (result.counters.get("late_events", 0), member_late) == (1, 1)
    assert (BASE + 1_000, 100) in spark  # the late record at 1390 is not in [1000, 2000)


def test_a_backfill_of_partitions_apart_in_event_time_has_no_late_record(
        spark_runner, kafka_bootstrap, kafka_topic):
    """Three partitions 4 s apart, each in order within 40 ms (lag 100): none of their
    records is late, and the windows the backfill closes (those a streaming job would have
    closed by the end: up to the slowest partition's watermark) are whole."""
    topic = kafka_topic(partitions=3)
    counts: dict[int, int] = {}
    tops = []
    for part in range(3):
        times = [BASE + part * 4_000 + 10 * i - (i * 7) % 40 for i in range(500)]
        _produce_json(kafka_bootstrap, topic, part, times)
        tops.append(max(times))
        for t in times:
            counts[t - t % 1_000] = counts.get(t - t % 1_000, 0) + 1
    cut = min(tops) - 100
    expected = {s: n for s, n in counts.items() if s + 1_000 <= cut - cut % 1_000}
    with Member() as m:
        result = spark_runner.run(_event_windows(kafka_bootstrap, topic), until="latest",
                                  member=m)
        got = {r.start: r.result for r in m.get_list("windows")}
    assert result.counters.get("late_events", 0) == 0
    assert result.watermark == cut - cut % 1_000
    assert got == expected and len(expected) == 4
