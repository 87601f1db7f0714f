"""The Kafka source and sinks against a real broker: formats, start positions, projection,
restore with another parallelism, partitions added while running, poison records, a broker
restart, and the property checks."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from operator import attrgetter

import msgpack
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from jetwake import JobConfig, JobStatus, Member, Pipeline, Sinks, Sources
from jetwake.connectors.kafka.properties import KafkaConfigError
from jetwake.connectors.kafka.sink import check_transaction_timeout
from jetwake.connectors.kafka.source import owner_of_partition, projection_column

from support.kafka_job import Proc, Reader, check_exactly_once, produce
from support.ordered_producer import ordered_producer
from support.restores import restored_snapshots, wait_for_a_new_snapshot
from support.waiting import poll_until, stays_true, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def read_all(bootstrap: str, topic: str, n: int, timeout: float = 30.0,
             committed: bool = True) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed" if committed else "read_uncommitted"})
    c.subscribe([topic])
    out = []

    def enough() -> bool:
        out.extend(m for m in c.consume(1000, 0.3) if not m.error())
        return len(out) >= n
    try:
        # the callers compare what came with what they expected: no failure here
        poll_until(enough, timeout=timeout, interval=0)
    finally:
        c.close()
    return out


# --- without a broker ------------------------------------------------------------------------

def test_property_checks():
    with pytest.raises(KafkaConfigError, match="bootstrap.servers"):
        Sources.kafka("t", {})
    with pytest.raises(KafkaConfigError, match="enable.auto.commit"):
        Sources.kafka("t", {"bootstrap.servers": "x:1", "enable.auto.commit": "true"})
    with pytest.raises(KafkaConfigError, match="transactional.id"):
        Sinks.kafka("t", {"bootstrap.servers": "x:1", "transactional.id": "mine"})
    with pytest.raises(KafkaConfigError, match="jetwake.nope"):
        Sources.kafka("t", {"bootstrap.servers": "x:1", "jetwake.nope": 1})
    with pytest.raises(ValueError, match="dead_letter_topic"):
        Sources.kafka("t", {"bootstrap.servers": "x:1"}, on_error="dead_letter")
    with pytest.raises(ValueError, match="deserializer"):
        Sources.kafka("t", {"bootstrap.servers": "x:1"}, value_deserializer="yaml")
    with pytest.raises(ValueError, match="start"):
        Sources.kafka("t", {"bootstrap.servers": "x:1"}, start="middle")
    with pytest.raises(KafkaConfigError, match="transaction.timeout.ms"):
        check_transaction_timeout(20_000, 10_000)
    assert check_transaction_timeout(None, 10_000) >= 40_000


def test_jet_partition_assignment_formula():
    # every partition has exactly one owner; two topics start at spread-out processors
    owners = [owner_of_partition(0, p, 2, 4) for p in range(6)]
    assert owners == [0, 1, 2, 3, 0, 1]
    assert [owner_of_partition(1, p, 2, 4) for p in range(3)] == [2, 3, 0]


def test_only_an_attrgetter_of_one_record_field_is_read_as_a_column():
    assert [projection_column(attrgetter(f)) for f in ("value", "key", "offset", "headers")] \
        == ["value", "key", "offset", "headers"]
    for other in (attrgetter("value.n"), attrgetter("key", "value"), attrgetter("nope"),
                  lambda r: r.value, None):
        assert projection_column(other) is None


# --- with the broker -------------------------------------------------------------------------

def test_a_projection_of_one_field_gives_that_field_of_each_record(kafka_bootstrap,
                                                                   kafka_topic):
    tin, tout = kafka_topic(partitions=2), kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap}
    p = ordered_producer(kafka_bootstrap)
    for i in range(20):
        p.produce(tin, key=str(i).encode(), value=json.dumps({"n": i}).encode())
    p.flush()
    pl = Pipeline()
    values = pl.read_from(Sources.kafka(tin, props, value_deserializer="json",
                                        projection=attrgetter("value")))
    keys = pl.read_from(Sources.kafka(tin, props, key_deserializer="str",
                                      projection=attrgetter("key")))
    values.map(lambda v: ["value", v["n"]]).merge(keys.map(lambda k: ["key", int(k)])) \
        .write_to(Sinks.kafka(tout, props, value_serializer="json"))
    with Member() as m:
        job = m.new_job(pl)
        out = read_all(kafka_bootstrap, tout, 40)
        job.cancel()
    assert sorted(json.loads(m.value()) for m in out) == \
        sorted([kind, i] for kind in ("key", "value") for i in range(20))


def test_formats_projection_and_start(kafka_bootstrap, kafka_topic, caplog):
    caplog.set_level(logging.DEBUG, logger="jetwake.kafka")
    tin, tout, tproj = kafka_topic(partitions=3), kafka_topic(partitions=1), kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap}
    p = ordered_producer(kafka_bootstrap)
    for i in range(50):
        p.produce(tin, key=msgpack.packb(i), value=json.dumps({"n": i}).encode(),
                  headers=[("h", b"x")])
    p.flush()
    pl = Pipeline()
    src = pl.read_from(Sources.kafka(tin, props, key_deserializer="msgpack",
                                     value_deserializer="json"))
    src.map(lambda kv: (str(kv[0]), kv[1]["n"] * 10)).write_to(
        Sinks.kafka(tout, props, key_serializer="str", value_serializer="json"))
    pl2 = Pipeline()
    pl2.read_from(Sources.kafka(tin, props, value_deserializer="json",
                                projection=lambda r: (r.topic, r.partition, r.offset,
                                                      r.timestamp > 0, r.value["n"],
                                                      [(k, v.decode()) for k, v in r.headers]))) \
       .write_to(Sinks.kafka(tproj, props, value_fn=lambda x: x, value_serializer="json"))
    with Member() as m:
        j1 = m.new_job(pl, JobConfig(processing_guarantee="at_least_once",
                                     snapshot_interval_ms=200))
        j2 = m.new_job(pl2)
        out = read_all(kafka_bootstrap, tout, 50)
        proj = read_all(kafka_bootstrap, tproj, 50)
        j1.cancel()
        j2.cancel()
    assert sorted((m.key().decode(), json.loads(m.value())) for m in out) == \
        sorted((str(i), i * 10) for i in range(50))
    rows = [json.loads(m.value()) for m in proj]
    assert sorted(r[4] for r in rows) == list(range(50))
    assert all(r[0] == tin and r[3] and r[5] == [["h", "x"]] for r in rows)
    assert len({(r[1], r[2]) for r in rows}) == 50

    # start="latest" skips what is there; a timestamp starts at the records from that time
    tl = kafka_topic(partitions=2)
    produce(kafka_bootstrap, tl, 0, 20)
    time.sleep(0.1)
    t_mid = int(time.time() * 1000)
    time.sleep(0.1)
    produce(kafka_bootstrap, tl, 20, 30)
    for start, expect, low in (("earliest", 50, 0), (t_mid, 30, 20), ("latest", 10, 50)):
        out_t = kafka_topic()
        pl3 = Pipeline()
        pl3.read_from(Sources.kafka(tl, props, start=start)).write_to(Sinks.kafka(out_t, props))
        with Member() as m:  # one processor per vertex: one source processor
            caplog.clear()
            job = m.new_job(pl3)
            if start == "latest":
                # the source processor has resolved "latest" to offsets, and logged what it reads
                wait_until(lambda: " reads [" in caplog.text,
                           what="the source to resolve its start offsets")
                produce(kafka_bootstrap, tl, 50, 10)
            got = read_all(kafka_bootstrap, out_t, expect, timeout=20)
            got += read_all(kafka_bootstrap, out_t, expect + 100, timeout=1.0)[len(got):]
            job.cancel()
        values = sorted(int(m.value()) for m in got)
        assert values == list(range(low, low + expect)), (start, values[:5], len(values))


def test_at_least_once_sink_writes_everything_through_a_full_producer_queue(kafka_bootstrap,
                                                                           kafka_topic):
    """A producer queue of 10 records refuses most of every chunk: the sink keeps the rest,
    leaves its inbox waiting, and writes it all as room frees up (nothing here waits)."""
    tin, tout = kafka_topic(partitions=2), kafka_topic()
    produce(kafka_bootstrap, tin, 0, 3000)
    props = {"bootstrap.servers": kafka_bootstrap}
    pl = Pipeline()
    pl.read_from(Sources.kafka(tin, props)).write_to(
        Sinks.kafka(tout, {**props, "queue.buffering.max.messages": 10}))
    with Member() as m:
        job = m.new_job(pl, JobConfig(processing_guarantee="at_least_once",
                                      snapshot_interval_ms=200))
        got = read_all(kafka_bootstrap, tout, 3000)
        records_out = sum(v.get("records_out", 0) for v in job.metrics().values())
        job.cancel()
    assert sorted(int(m.value()) for m in got) == list(range(3000))
    assert records_out == 3000


def test_restore_with_another_parallelism(kafka_bootstrap, kafka_topic, tmp_path):
    tin, tout = kafka_topic(partitions=5), kafka_topic(partitions=2)
    total = 8_000
    produce(kafka_bootstrap, tin, 0, total // 2)
    data = str(tmp_path / "member")
    reader = Reader(kafka_bootstrap, tout)
    proc = Proc(data, kafka_bootstrap, tin, tout, "--interval-ms", "200")
    try:
        proc.start("--parallelism", "3", wait_ready=True)
        reader.wait_for(total // 2, 60)
        wait_for_a_new_snapshot(data)
        proc.kill()
        produce(kafka_bootstrap, tin, total // 2, total // 2)
        proc.start("--parallelism", "1")   # 3 processors per vertex -> 1
        reader.wait_for(total, 60)
        reader.poll(1.5)
        wait_for_a_new_snapshot(data)
        proc.kill()
        print(proc.stderr_tail)
        produce(kafka_bootstrap, tin, total, total // 2)
        proc.start("--parallelism", "2")   # and up again
        reader.wait_for(total + total // 2, 60)
        reader.poll(1.5)
    finally:
        proc.kill()
        reader.close()
    print(proc.stderr_tail)
    check_exactly_once(reader.records, total + total // 2)
    # both restarts went on from a snapshot, each with another number of processors
    assert len(restored_snapshots(data)) >= 2, restored_snapshots(data)


def test_partition_added_while_running(kafka_bootstrap, kafka_topic, caplog):
    caplog.set_level(logging.INFO, logger="jetwake.kafka")
    tin, tout = kafka_topic(partitions=2), kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap, "jetwake.partition.discovery.ms": 300}
    produce(kafka_bootstrap, tin, 0, 100)
    pl = Pipeline()
    pl.read_from(Sources.kafka(tin, props)).write_to(
        Sinks.kafka(tout, {"bootstrap.servers": kafka_bootstrap}))
    with Member(local_parallelism=2) as m:
        job = m.new_job(pl, JobConfig(processing_guarantee="exactly_once",
                                      snapshot_interval_ms=200))
        assert len(read_all(kafka_bootstrap, tout, 100)) == 100
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.create_partitions([NewPartitions(tin, 5)])[tin].result(30)
        # the source's processors found the new partitions (each logs those it reads)
        wait_until(lambda: all(f"('{tin}', {part})" in caplog.text for part in (2, 3, 4)),
                   what="the source to find partitions 2, 3 and 4")
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        for part in (2, 3, 4):
            for i in range(20):
                p.produce(tin, value=f"new-{part}-{i}".encode(), partition=part)
        p.flush()
        got = read_all(kafka_bootstrap, tout, 160)
        job.cancel()
    values = [m.value().decode() for m in got]
    assert len(values) == 160 and len(set(values)) == 160
    assert sum(v.startswith("new-") for v in values) == 60


def test_poison_record_fails_the_job_with_its_position(kafka_bootstrap, kafka_topic):
    tin, tout = kafka_topic(), kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap}
    p = ordered_producer(kafka_bootstrap)
    p.produce(tin, value=b'{"ok": 1}')
    p.produce(tin, value=b"not json {")
    p.flush()
    pl = Pipeline()
    pl.read_from(Sources.kafka(tin, props, value_deserializer="json")).write_to(
        Sinks.kafka(tout, props, value_serializer="json"))
    with Member() as m:
        job = m.new_job(pl, JobConfig(processing_guarantee="at_least_once"))
        with pytest.raises(Exception) as ei:
            job.join(timeout=30)
        assert job.status == JobStatus.FAILED
    msg = str(ei.value)
    assert f"topic {tin!r}" in msg and "partition 0" in msg and "offset 1" in msg, msg


def test_poison_records_go_to_the_dead_letter_topic(kafka_bootstrap, kafka_topic):
    tin, tout, dlq = kafka_topic(partitions=2), kafka_topic(), kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap}
    p = ordered_producer(kafka_bootstrap)
    for i in range(30):
        p.produce(tin, value=(b"{bad" if i % 10 == 3 else json.dumps(i).encode()),
                  partition=i % 2)
    p.flush()
    pl = Pipeline()
    pl.read_from(Sources.kafka(tin, props, value_deserializer="json", on_error="dead_letter",
                               dead_letter_topic=dlq)) \
      .write_to(Sinks.kafka(tout, props, value_serializer="json"))
    with Member() as m:
        job = m.new_job(pl, JobConfig(processing_guarantee="exactly_once",
                                      snapshot_interval_ms=200))
        good = read_all(kafka_bootstrap, tout, 27)
        bad = read_all(kafka_bootstrap, dlq, 3)
        wait_until(lambda: sum(v.get("dead_letters", 0) for v in job.metrics().values()) == 3,
                   timeout=10, what="the dead-letter count")
        job.cancel()
    assert sorted(json.loads(m.value()) for m in good) == [i for i in range(30) if i % 10 != 3]
    assert [m.value() for m in bad] == [b"{bad"] * 3
    for m_ in bad:
        h = dict(m_.headers())
        assert b"JSONDecodeError" in h["jetwake.error"]
        assert h["jetwake.topic"] == tin.encode()
        assert int(h["jetwake.offset"]) >= 0 and int(h["jetwake.partition"]) in (0, 1)


def test_broker_unavailable_at_start_gives_a_clear_message():
    pl = Pipeline()
    pl.read_from(Sources.kafka("t", {"bootstrap.servers": "127.0.0.1:1",
                                     "jetwake.startup.timeout.ms": 1500})) \
      .write_to(Sinks.logger())
    with Member() as m:
        with pytest.raises(Exception, match="did not answer within 2 s|did not answer"):
            m.new_job(pl)


def _restart_broker(kl, port: int, down_seconds: float) -> None:
    """Stops the broker process (SIGTERM) and starts it again on the same data."""
    state = json.loads((kl.run_dir(port) / "state.json").read_text())
    pid = state["nodes"][0]["pid"]
    cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:-1]
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not kl._pid_alive(pid), timeout=30, interval=0.1,
               what="the broker to stop")
    time.sleep(down_seconds)  # how long the broker is away is the experiment
    log = open(kl.run_dir(port) / "broker-1.log", "ab")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, close_fds=True, cwd=kl.run_dir(port))
    state["nodes"][0]["pid"] = proc.pid
    (kl.run_dir(port) / "state.json").write_text(json.dumps(state))
    (kl.run_dir(port) / "kafka.pid").write_text(f"{proc.pid}\n")


def test_broker_restart_while_a_job_runs(tmp_path):
    """A private broker is stopped and started again under a running exactly-once job: the
    source and the sink retry, and the output is still exactly once."""
    from support.kafka_broker import private_broker

    with private_broker() as (kl, port, bootstrap):
        total = 6_000
        produce(bootstrap, "in", 0, total // 2)
        data = str(tmp_path / "member")
        proc = Proc(data, bootstrap, "in", "out", "--interval-ms", "300")
        reader = Reader(bootstrap, "out")
        try:
            proc.start(wait_ready=True)
            reader.wait_for(total // 2, 60)
            feeder = threading.Thread(target=produce, args=(bootstrap, "in", total // 2,
                                                             total // 2), daemon=True)
            _restart_broker(kl, port, down_seconds=3.0)
            feeder.start()
            assert kl.broker_ready(bootstrap, 60)
            reader.wait_for(total, 90)
            reader.poll(1.5)
            assert proc.alive(), "the member process died"
        finally:
            proc.kill()
            reader.close()
        print("\n".join(x for x in proc.stderr_tail.splitlines() if "rdkafka" not in x))
        check_exactly_once(reader.records, total)


def test_native_timestamps_follow_per_partition_watermarks(kafka_bootstrap, kafka_topic):
    """One source processor reads a partition far ahead in event time and one far behind:
    the watermark is the one behind, so windows wait for it and none of its records is late
    (a single watermark from the highest timestamp would have made them all late)."""
    from collections import Counter

    from jetwake import AggregateOperations, WindowDefinition

    topic = kafka_topic(partitions=2)
    producer = ordered_producer(kafka_bootstrap)
    # (a record timestamp of 0 means "unset" to the producer: start further on)
    ahead = list(range(100_000, 110_000, 10))
    behind = list(range(100_000, 101_000, 10))
    for ts in ahead:
        producer.produce(topic, key=b"ahead", value=b"x", partition=0, timestamp=ts)
    for ts in behind:
        producer.produce(topic, key=b"behind", value=b"x", partition=1, timestamp=ts)
    producer.flush(30)

    p = Pipeline()
    (p.read_from(Sources.kafka(topic, {"bootstrap.servers": kafka_bootstrap},
                               key_deserializer="str"))
      .with_native_timestamps(allowed_lag=0)
      .window(WindowDefinition.tumbling(100))
      .group_by(lambda kv: kv[0])
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.list("windows")))
    # windows close up to the partition behind: its last record is at 100990
    closed = [("ahead", ts) for ts in ahead if ts < 100_900] + \
             [("behind", ts) for ts in behind if ts < 100_900]
    with Member(local_parallelism=1) as m:  # one processor reads both partitions
        job = m.new_job(p)
        results = m.get_list("windows")
        wait_until(lambda: sum(r.result for r in results) >= len(closed), timeout=60,
                   what="the windows before the partition behind")
        # nothing later closes while that partition holds the watermark
        stays_true(lambda: sum(r.result for r in results) == len(closed), seconds=1.0,
                   what="no window after the partition behind closing")
        late = sum(v.get("late_events", 0) for v in job.metrics().values())
        got = Counter()
        for r in results:
            got[(r.start, r.key)] += r.result
        job.cancel()
    assert late == 0
    assert got == Counter(((ts // 100) * 100, key) for key, ts in closed)


def test_a_source_reports_each_partitions_lag_behind_the_end_of_the_log(kafka_bootstrap,
                                                                         kafka_topic):
    from confluent_kafka import TopicPartition

    from jetwake.engine.server.metrics import kafka_consumer_lag

    tin = kafka_topic(partitions=2)
    produce(kafka_bootstrap, tin, 0, 3000)
    ends = {}
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": uuid.uuid4().hex})
    for part in (0, 1):
        ends[part] = c.get_watermark_offsets(TopicPartition(tin, part), timeout=10)[1]
    c.close()
    held = threading.Event()

    def hold(x):  # the job takes a record, then waits: the source stops behind the end
        held.wait(30)
        return x

    pl = Pipeline()
    pl.read_from(Sources.kafka(tin, {"bootstrap.servers": kafka_bootstrap})).map(hold) \
        .write_to(Sinks.list("out"))
    with Member() as m:
        job = m.new_job(pl)

        def source_lags():
            for share in m.participant.running():
                for t in share.execution.tasklets if share.execution else ():
                    lags = t.processor.partition_lag()
                    if lags and any(p["lag"] is not None for p in lags):
                        return t.processor, lags
            return None
        processor, lags = wait_until(source_lags, what="a partition's lag behind its end")
        assert sorted(p["partition"] for p in lags) == [0, 1]
        for p in lags:  # a partition nothing was fetched from yet has no known end or lag
            assert p["end"] in (None, ends[p["partition"]])
            if p["lag"] is not None:
                assert p["lag"] == p["end"] - p["position"] and 0 <= p["lag"] <= p["end"]
        assert sum(ends.values()) == 3000
        assert 0 <= kafka_consumer_lag(processor) <= 3000  # the source may still be reading
        held.set()
        job.cancel()
