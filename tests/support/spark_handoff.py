"""The job of the Spark hand-off tests: records over two Kafka partitions, and a pipeline of
running counts, running sums and tumbling windows per key whose snapshot a backfill hands to a
streaming job."""

from __future__ import annotations

from jetwake import AggregateOperations as ops, Pipeline, Sinks, Sources, WindowDefinition
from support.ordered_producer import ordered_producer

KEYS = 50
BASE = 1_700_000_000_000
WINDOW = 1_000


def produce(bootstrap: str, topic: str, n: int) -> None:
    """Record i: key ``k{i % KEYS}``, value i, time BASE + i, in partition i % 2."""
    p = ordered_producer(bootstrap, {"linger.ms": 20})
    for i in range(n):
        while True:
            try:
                p.produce(topic, str(i).encode(), f"k{i % KEYS}".encode(), partition=i % 2,
                          timestamp=BASE + i)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def pipeline(bootstrap: str, topic: str) -> Pipeline:
    """The topic's records with their Kafka timestamps: running counts and sums per key into
    the lists "counts" and "sums", and counts per key and tumbling window into "windows"."""
    p = Pipeline()
    s = p.read_from(Sources.kafka(topic, {"bootstrap.servers": bootstrap},
                                  key_deserializer="str", value_deserializer="json"))
    t = s.with_native_timestamps(0)
    t.group_by(lambda kv: kv[0]).rolling_aggregate(ops.counting()).set_name("counts") \
        .write_to(Sinks.list("counts"))
    t.group_by(lambda kv: kv[0]).rolling_aggregate(ops.summing(lambda kv: kv[1])) \
        .set_name("sums").write_to(Sinks.list("sums"))
    t.window(WindowDefinition.tumbling(WINDOW)).group_by(lambda kv: kv[0]) \
        .aggregate(ops.counting()).set_name("windows").write_to(Sinks.list("windows"))
    return p

