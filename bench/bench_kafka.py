"""Kafka through the engine beside a raw confluent-kafka consume-and-produce loop.

1 million 100-byte records over 6 partitions, against ``KAFKA_BOOTSTRAP_SERVERS`` or a local
broker started for the run (tests/support/local_kafka/kafka_local.py on a free port, stopped after):

(a) Kafka -> map -> Kafka, at-least-once;
(b) Kafka -> with_native_timestamps -> tumbling 10 s window count per key -> Kafka,
    exactly-once with 1 s snapshots;
raw: one consumer reading the 6 partitions in batches and producing every record to another
topic (the best a single Python process does with the same client).

Each figure is input records per second, from job submission until every record is through
(a: all records in the output topic; b: a committed snapshot holds the offsets of all
records, read through the source's ``group.id`` commits).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import uuid
from pathlib import Path

from .report import line

N = int(os.environ.get("BENCH_KAFKA_RECORDS", 1_000_000))
PARTITIONS = 6
KEYS = 100
VALUE = b"x" * 100


def _kafka_local():
    path = Path(__file__).resolve().parent.parent / "tests" / "support" / "local_kafka" / "kafka_local.py"
    spec = importlib.util.spec_from_file_location("kafka_local", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kafka_local"] = mod
    spec.loader.exec_module(mod)
    return mod


def _topic(admin, partitions: int) -> str:
    from confluent_kafka.admin import NewTopic

    name = f"bench-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            return name
        time.sleep(0.1)
    raise TimeoutError(name)


def _fill(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                  "batch.num.messages": 10_000, "queue.buffering.max.messages": 1_000_000})
    base = 1_700_000_000_000
    keys = [f"k{i}".encode() for i in range(KEYS)]
    for i in range(N):
        while True:
            try:
                p.produce(topic, VALUE, keys[i % KEYS], partition=i % PARTITIONS,
                          timestamp=base + i)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def _output_count(consumer, topic: str, partitions: int) -> int:
    from confluent_kafka import TopicPartition

    return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
               for p in range(partitions))


def raw_loop(bootstrap: str, tin: str) -> float:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    tout = _topic(AdminClient({"bootstrap.servers": bootstrap}), PARTITIONS)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False})
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                  "batch.num.messages": 10_000, "queue.buffering.max.messages": 500_000})
    t0 = time.perf_counter()
    c.assign([TopicPartition(tin, i, -2) for i in range(PARTITIONS)])
    seen = 0
    produce = p.produce
    while seen < N:
        msgs = c.consume(2048, 0.5)
        for m in msgs:
            while True:
                try:
                    produce(tout, m.value(), m.key())
                    break
                except BufferError:
                    p.poll(0.05)
        seen += len(msgs)
        p.poll(0)
    p.flush(120)
    elapsed = time.perf_counter() - t0
    c.close()
    return N / elapsed


def engine_map(bootstrap: str, tin: str) -> float:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

    from jetwake import JobConfig, Member, Pipeline, Sinks, Sources

    tout = _topic(AdminClient({"bootstrap.servers": bootstrap}), PARTITIONS)
    props = {"bootstrap.servers": bootstrap}
    pl = Pipeline()
    (pl.read_from(Sources.kafka(tin, props))
       .map(lambda kv: (kv[0], kv[1]))
       .write_to(Sinks.kafka(tout, props)))
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    with Member() as m:
        t0 = time.perf_counter()
        job = m.new_job(pl, JobConfig(processing_guarantee="at_least_once",
                                      snapshot_interval_ms=1000))
        deadline = time.monotonic() + 600
        while _output_count(probe, tout, PARTITIONS) < N:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the map job did not write {N} records in 600 s")
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        job.cancel()
    probe.close()
    return N / elapsed


def engine_window(bootstrap: str, tin: str) -> float:
    from confluent_kafka.admin import AdminClient

    from jetwake import (
        AggregateOperations, JobConfig, Member, Pipeline, Sinks, Sources, WindowDefinition,
    )

    from confluent_kafka import Consumer, TopicPartition

    tout = _topic(AdminClient({"bootstrap.servers": bootstrap}), PARTITIONS)
    props = {"bootstrap.servers": bootstrap}
    group = f"bench-{uuid.uuid4().hex[:8]}"
    pl = Pipeline()
    (pl.read_from(Sources.kafka(tin, {**props, "group.id": group}))
       .with_native_timestamps(60_000)
       .window(WindowDefinition.tumbling(10_000))
       .group_by(lambda kv: kv[0])
       .aggregate(AggregateOperations.counting())
       .write_to(Sinks.kafka(tout, props, key_fn=lambda r: r.key,
                             value_fn=lambda r: f"{r.end}:{r.result}",
                             value_serializer="str")))
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    tps = [TopicPartition(tin, p) for p in range(PARTITIONS)]
    with Member() as m:
        t0 = time.perf_counter()
        job = m.new_job(pl, JobConfig(processing_guarantee="exactly_once",
                                      snapshot_interval_ms=1000))
        # done when a committed snapshot holds every record: the source commits the offsets
        # of each committed snapshot to its group.id
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            done = sum(max(tp.offset, 0) for tp in probe.committed(tps, timeout=10))
            if done >= N:
                break
            time.sleep(0.05)
        else:
            raise TimeoutError(f"the window job did not get through {N} records in 600 s")
        elapsed = time.perf_counter() - t0
        job.cancel()
    probe.close()
    return N / elapsed


def main() -> None:
    from confluent_kafka.admin import AdminClient

    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    kl = port = None
    if not bootstrap:
        kl = _kafka_local()
        port = kl.free_port()
        bootstrap = kl.start_broker(port)
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        tin = _topic(admin, PARTITIONS)
        _fill(bootstrap, tin)
        raw = raw_loop(bootstrap, tin)
        a = engine_map(bootstrap, tin)
        line(f"kafka->map->kafka at-least-once ({N // 1000}k)", a, raw, "records",
             "raw consume+produce")
        b = engine_window(bootstrap, tin)
        line(f"kafka->window count->kafka exactly-once ({N // 1000}k)", b, raw, "records",
             "raw consume+produce")
    finally:
        if kl is not None:
            kl.stop_broker(port)


if __name__ == "__main__":
    main()
