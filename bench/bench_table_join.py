"""``join_table`` records/s beside a plain-Python dict join of the same data.

Run ``python -m bench table-join [--bootstrap HOST:PORT] [--records N] [--keys K]``.

1. The join processor alone (no broker): a table of K keys applied as changelog chunks, then
   N stream items joined in chunks of 4096, in memory and in RocksDB, beside a dict built from
   the same changelog and a list comprehension joining the same items.
2. The whole job on a member (a broker: ``--bootstrap``, else ``KAFKA_BOOTSTRAP_SERVERS``,
   else one started for the run with ``tests/support/local_kafka/kafka_local.py``): a
   compacted table topic of K keys and a stream topic of N records, ``join_table`` into a no-op
   sink, timed from the job's submission to its last joined item (the table's bootstrap
   included), beside a plain-Python consumer that reads the table topic into a dict, then the
   stream topic, joining each record.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

from jetwake.engine.core.processor import Inbox, Outbox, ProcessorContext
from jetwake.engine.processors.table_join import TableJoinProcessor, ready_markers

from .report import line, timer

RECORDS = 1_000_000
KEYS = 100_000
CHUNK = 4096


def _items(n: int, keys: int) -> list[tuple[str, int]]:
    # a key in ten misses the table
    return [(f"k{(i * 7919) % (keys + keys // 10)}", i) for i in range(n)]


def _changelog(keys: int) -> list[tuple[int, tuple[str, dict]]]:
    return [(0, (f"k{i}", {"v": i})) for i in range(keys)]


def _pair(item: Any, value: Any) -> tuple[Any, Any]:
    return item, value


def _first(item: Any) -> Any:
    return item[0]


def _processor_rate(items: list, changelog: list, state_dir: str | None) -> float:
    proc = TableJoinProcessor("bench", _first, _pair, "inner", False, True)
    proc.outbox = Outbox(1, capacity=1 << 30)
    ctx = ProcessorContext("bench", "bench", "join", 0, 0, 1, 1, 0, 1)
    if state_dir is not None:
        from jetwake.snapshot.state.rocksdb_backend import RocksDBStateBackend
        ctx.state_backend = "rocksdb"
        ctx.state_factory = lambda v, i, n: RocksDBStateBackend(os.path.join(state_dir, n))
    proc.init(ctx)
    for s in range(0, len(changelog), CHUNK):
        proc.process(1, Inbox(changelog[s:s + CHUNK]))
    proc.process(1, Inbox(list(ready_markers(0, 1))))
    with timer() as t:
        for s in range(0, len(items), CHUNK):
            proc.process(0, Inbox(items[s:s + CHUNK]))
            proc.outbox.drain()
    ctx.release_state()
    return len(items) / t[0]


def _dict_rate(items: list, changelog: list) -> float:
    table = {k: v for _, (k, v) in changelog}
    get = table.get
    with timer() as t:
        out = []
        for s in range(0, len(items), CHUNK):
            out = [(x, v) for x in items[s:s + CHUNK] if (v := get(x[0])) is not None]
    del out
    return len(items) / t[0]


def processor_alone(n: int, keys: int) -> None:
    items, changelog = _items(n, keys), _changelog(keys)
    baseline = _dict_rate(items, changelog)
    line(f"join_table processor, memory ({keys:,} keys)", _processor_rate(items, changelog, None),
         baseline, "items", "dict join")
    state_dir = tempfile.mkdtemp(prefix="bench-table-join-")
    try:
        line(f"join_table processor, RocksDB ({keys:,} keys)",
             _processor_rate(items, changelog, state_dir), baseline, "items", "dict join")
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


# --- the whole job against a broker -----------------------------------------------------------

def _broker(bootstrap: str | None) -> tuple[str, Any]:
    """A bootstrap address, and a function that stops the broker started for the run."""
    bootstrap = bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip() or None
    if bootstrap:
        return bootstrap, lambda: None
    from .bench_kafka_peers import _kafka_local
    kl = _kafka_local()
    port = kl.free_port()
    return kl.start_broker(port), lambda: kl.stop_broker(port)


def _topics(bootstrap: str, n: int, keys: int) -> tuple[str, str]:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    run = uuid.uuid4().hex[:8]
    table, stream = f"bench-table-{run}", f"bench-stream-{run}"
    for fut in admin.create_topics([
            NewTopic(table, 2, 1, config={"cleanup.policy": "compact"}),
            NewTopic(stream, 2, 1, config={"retention.ms": "-1"})]).values():
        fut.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "queue.buffering.max.messages": 1_000_000})

    def send(topic: str, k: str, v: bytes) -> None:
        while True:
            try:
                producer.produce(topic, v, k)
                return
            except BufferError:
                producer.poll(0.05)
    for i in range(keys):
        send(table, f"k{i}", json.dumps({"v": i}).encode())
    for k, i in _items(n, keys):
        send(stream, k, json.dumps({"n": i}).encode())
    if producer.flush(120):
        raise RuntimeError("the input was not acknowledged in 120 s")
    return table, stream


def _job_rate(bootstrap: str, table: str, stream: str, n: int) -> float:
    from jetwake import Member, Pipeline, Sinks, Sources

    props = {"bootstrap.servers": bootstrap}
    p = Pipeline()
    t = p.read_from(Sources.kafka_table(table, props, key_deserializer="str",
                                        value_deserializer="json"))
    (p.read_from(Sources.kafka(stream, props, key_deserializer="str", value_deserializer="json"))
      .join_table(t, _first, _pair, how="left").write_to(Sinks.noop()))
    with Member() as m:
        start = time.perf_counter()
        job = m.new_job(p)
        while True:
            stats = job.metrics().get("join-table", {})
            if stats.get("table_hits", 0) + stats.get("table_misses", 0) >= n:
                break
            time.sleep(0.005)
        elapsed = time.perf_counter() - start
        job.cancel()
    return n / elapsed


def _plain_rate(bootstrap: str, table: str, stream: str, n: int, keys: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    def reader(topic: str) -> Any:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                      "enable.auto.commit": False, "enable.partition.eof": False})
        c.assign([TopicPartition(topic, p, 0) for p in range(2)])
        return c
    start = time.perf_counter()
    values: dict = {}
    c = reader(table)
    while len(values) < keys:
        for m in c.consume(2048, 0.1):
            if not m.error():
                values[m.key().decode()] = json.loads(m.value())
    c.close()
    c = reader(stream)
    got = 0
    get = values.get
    while got < n:
        msgs = [m for m in c.consume(2048, 0.1) if not m.error()]
        got += len(msgs)
        [(m.key().decode(), json.loads(m.value()), get(m.key().decode())) for m in msgs]
    c.close()
    return n / (time.perf_counter() - start)


def whole_job(bootstrap: str | None, n: int, keys: int) -> None:
    address, stop = _broker(bootstrap)
    try:
        table, stream = _topics(address, n, keys)
        line(f"join_table job, member ({keys:,} keys)", _job_rate(address, table, stream, n),
             _plain_rate(address, table, stream, n, keys), "records", "consumer + dict join")
    finally:
        stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench table-join")
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--records", type=int, default=RECORDS)
    ap.add_argument("--keys", type=int, default=KEYS)
    args, _ = ap.parse_known_args(sys.argv[2:] if argv is None else argv)
    processor_alone(args.records, args.keys)
    whole_job(args.bootstrap, args.records // 4, args.keys)


if __name__ == "__main__":
    main(sys.argv[1:])
