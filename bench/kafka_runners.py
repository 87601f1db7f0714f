"""The raw confluent-kafka loops and the jetwake jobs of ``python -m bench kafka-peers``, each
run in a process of its own (``python -m bench.kafka_runners SYSTEM WORKLOAD ...``) so that
the benchmark reads its CPU time alone and ends it when the output is complete.

The raw loops are written as well as a user would write them: batched ``consume``, one
``produce`` per record into a producer that batches (``produce_batch`` measured no faster,
see docs/performance.md), librdkafka's fetch back-off off, and the JSON functions of the
library jetwake's ``"json"`` serializers use. Raw A is at-least-once (every second: flush the
producer, then commit the consumed offsets); raw B gives no guarantee.

The jetwake jobs use the connectors' and the member's defaults. To measure other settings
(each was used for a figure in docs/performance.md): ``BENCH_JETWAKE_SOURCE_PROPS`` and
``BENCH_JETWAKE_SINK_PROPS`` (JSON objects) add connector properties,
``BENCH_JETWAKE_COOPERATIVE_THREADS`` sets the member's cooperative threads,
``BENCH_GC_THRESHOLD`` sets the cyclic GC's thresholds in every runner ("701,10,10" for
CPython's own behaviour: the engine raises exactly "700,10,10", its default), and
``BENCH_GC_STATS`` (a file) has a runner write its collections and the time they took.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

from bench import kafka_spec as spec

# librdkafka settings of the raw loops, each chosen by measurement (docs/performance.md)
RAW_CONSUMER = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "fetch.queue.backoff.ms": 0,       # refetch at once when the local queue drains
}
RAW_PRODUCER = {
    "linger.ms": 5,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 1_000_000,
    "enable.idempotence": True,
}
RAW_BATCH = 1_000
COMMIT_INTERVAL_S = 1.0


def json_functions(lib: str) -> tuple[Any, Any]:
    """(loads, dumps -> bytes) of JSON library ``lib`` (the benchmark passes the one jetwake's
    "json" serializers use; the raw loops do not import jetwake, whose import would count as
    their start-up)."""
    if lib == "orjson":
        import orjson
        return orjson.loads, orjson.dumps
    if lib == "msgspec":
        import msgspec
        return msgspec.json.decode, msgspec.json.encode
    import json
    encode = json.JSONEncoder(separators=(",", ":")).encode
    return json.loads, lambda obj: encode(obj).encode()


def _clients(args: argparse.Namespace) -> tuple[Any, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": uuid.uuid4().hex,
                         **RAW_CONSUMER})
    consumer.assign([TopicPartition(args.input, p, OFFSET_BEGINNING)
                     for p in range(spec.PARTITIONS)])
    producer = Producer({"bootstrap.servers": args.bootstrap, **RAW_PRODUCER})
    return consumer, producer


def raw_a(args: argparse.Namespace) -> None:
    """Kafka -> JSON map -> Kafka, at-least-once."""
    loads, dumps = json_functions(args.json)
    enrich = spec.enrich
    first = spec.FirstRecord(args.report)
    consumer, producer = _clients(args)
    produce, poll, out = producer.produce, producer.poll, args.output
    next_commit = time.monotonic() + COMMIT_INTERVAL_S
    while True:
        msgs = consumer.consume(RAW_BATCH, 0.1)
        if msgs:
            first.mark()
            for m in msgs:
                while True:
                    try:
                        produce(out, dumps(enrich(loads(m.value()))), m.key())
                        break
                    except BufferError:
                        poll(0.01)
        poll(0)
        if time.monotonic() >= next_commit:
            producer.flush()
            consumer.commit(asynchronous=True)
            next_commit = time.monotonic() + COMMIT_INTERVAL_S


def raw_b(args: argparse.Namespace) -> None:
    """Kafka -> tumbling 1 s count per key -> Kafka, no guarantee: counts per window in
    Counters (C-level ``update`` when a batch falls in one window), a watermark per partition
    (records are in order within a partition), results written when it passes a window's
    end."""
    from confluent_kafka import Message

    _loads, dumps = json_functions(args.json)
    first = spec.FirstRecord(args.report)
    consumer, producer = _clients(args)
    produce, poll, out = producer.produce, producer.poll, args.output
    width = spec.WINDOW_MS
    windows: dict[int, Counter] = defaultdict(Counter)
    tops: dict[int, int] = {}
    while True:
        msgs = consumer.consume(RAW_BATCH, 0.1)
        if not msgs:
            poll(0)
            continue
        first.mark()
        keys = list(map(Message.key, msgs))
        starts = [t - t % width for _, t in map(Message.timestamp, msgs)]
        lo = min(starts)
        if lo == max(starts):
            windows[lo].update(keys)
        else:
            for s, k in zip(starts, keys):
                windows[s][k] += 1
        tops.update(zip(map(Message.partition, msgs), starts))  # in order: the last wins
        if len(tops) == spec.PARTITIONS:
            wm = min(tops.values())
            for s in sorted(w for w in windows if w + width <= wm):
                for k, c in windows.pop(s).items():
                    while True:
                        try:
                            produce(out, dumps(spec.window_value(s, s + width, c)), k)
                            break
                        except BufferError:
                            poll(0.01)
        poll(0)


def jetwake_job(args: argparse.Namespace) -> None:
    """The same workloads as a jetwake job, with the connectors' defaults."""
    import threading

    from jetwake import (
        AggregateOperations, JobConfig, Member, Pipeline, Sinks, Sources, WindowDefinition,
    )

    props = {"bootstrap.servers": args.bootstrap}
    # for trying other settings against the defaults: JSON objects of extra properties
    source_props = {**props, **json.loads(os.environ.get("BENCH_JETWAKE_SOURCE_PROPS", "{}"))}
    sink_props = {**props, **json.loads(os.environ.get("BENCH_JETWAKE_SINK_PROPS", "{}"))}
    enrich = spec.enrich
    p = Pipeline()
    if args.workload == "A":
        (p.read_from(Sources.kafka(args.input, source_props, value_deserializer="json"))
          .map(lambda kv: (kv[0], enrich(kv[1])))
          .write_to(Sinks.kafka(args.output, sink_props, value_serializer="json")))
    else:
        window_value = spec.window_value
        (p.read_from(Sources.kafka(args.input, source_props))
          .with_native_timestamps(0)
          .window(WindowDefinition.tumbling(spec.WINDOW_MS))
          .group_by(lambda kv: kv[0])
          .aggregate(AggregateOperations.counting())
          .write_to(Sinks.kafka(args.output, sink_props, key_fn=lambda r: r.key,
                                value_fn=lambda r: window_value(r.start, r.end, r.result),
                                value_serializer="json")))
    first = spec.FirstRecord(args.report)
    threads = int(os.environ.get("BENCH_JETWAKE_COOPERATIVE_THREADS", "0")) or None
    with Member(cooperative_threads=threads) as member:
        job = member.new_job(p, JobConfig(processing_guarantee=args.guarantee,
                                          snapshot_interval_ms=args.snapshot_interval_ms))

        def watch() -> None:  # the first record, from the source's metrics (not per record)
            while not first.seen:
                metrics = job.metrics()
                if any(m.get("records_in", 0) for m in metrics.values()):
                    first.mark()
                    return
                time.sleep(0.002)
        threading.Thread(target=watch, daemon=True).start()
        job.join()


def _gc_stats(path: str) -> None:
    """Writes the cyclic GC's collections per generation and the seconds they took to
    ``path`` every half second."""
    import gc
    import threading

    spent = [0.0, 0.0, 0.0]
    count = [0, 0, 0]
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[info["generation"]] += time.perf_counter() - started[0]
            count[info["generation"]] += 1
    gc.callbacks.append(callback)

    def report() -> None:
        while True:
            time.sleep(0.5)
            with open(path, "w") as f:
                f.write(f"collections {count} seconds {[round(x, 3) for x in spent]} "
                        f"objects {len(gc.get_objects())}\n")
    threading.Thread(target=report, daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    if os.environ.get("BENCH_GC_THRESHOLD"):  # "700,10,10" is CPython's default
        import gc
        gc.set_threshold(*map(int, os.environ["BENCH_GC_THRESHOLD"].split(",")))
    if os.environ.get("BENCH_GC_STATS"):
        _gc_stats(os.environ["BENCH_GC_STATS"])
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("system", choices=["raw", "jetwake"])
    ap.add_argument("workload", choices=["A", "B"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--guarantee", default="at_least_once",
                    choices=["none", "at_least_once", "exactly_once"])
    ap.add_argument("--snapshot-interval-ms", type=int, default=1000)
    ap.add_argument("--json", default="msgspec", choices=["json", "orjson", "msgspec"],
                    help="the raw loops' JSON library")
    args = ap.parse_args(argv)
    if args.system == "raw":
        (raw_a if args.workload == "A" else raw_b)(args)
    else:
        jetwake_job(args)


if __name__ == "__main__":
    main(sys.argv[1:])
