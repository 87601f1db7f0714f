"""Workloads A and B of ``python -m bench kafka-peers`` as a Bytewax dataflow, written as
Bytewax's documentation shows (``bytewax.connectors.kafka.operators`` input and output,
``op.map``, ``windowing.count_window`` with an ``EventClock`` and a ``TumblingWindower``), run
as ``python -m bytewax.run`` runs a flow (one worker, no recovery: Bytewax offers no
exactly-once Kafka sink). Runs with the Python of the virtual environment the benchmark made
for Bytewax; only the standard library, Bytewax and ``kafka_spec.py`` are imported.

    python kafka_peer_bytewax.py A|B --bootstrap ... --input ... --output ... --report ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timedelta, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_spec as spec  # noqa: E402

import bytewax.operators as op  # noqa: E402
from bytewax.connectors.kafka import KafkaSinkMessage  # noqa: E402
from bytewax.connectors.kafka import operators as kop  # noqa: E402
from bytewax.dataflow import Dataflow  # noqa: E402
from bytewax.operators.windowing import EventClock, TumblingWindower, count_window  # noqa: E402
from bytewax.run import cli_main  # noqa: E402

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def build(args: argparse.Namespace) -> Dataflow:
    first = spec.FirstRecord(args.report)
    brokers = [args.bootstrap]
    flow = Dataflow("bench")
    # B ends its input at the end of the topic (tail=False): see below
    inp = kop.input("in", flow, brokers=brokers, topics=[args.input], tail=args.workload == "A")
    op.inspect("errors", inp.errs).then(op.raises, "crash-on-error")
    enrich = spec.enrich
    if args.workload == "A":
        def transform(msg):
            if not first.seen:
                first.mark()
            value = json.dumps(enrich(json.loads(msg.value)), separators=(",", ":"))
            return KafkaSinkMessage(msg.key, value.encode())
        out = op.map("enrich", inp.oks, transform)
    else:
        def key(msg):
            if not first.seen:
                first.mark()
            return msg.key.decode()

        def event_time(msg):  # the record's timestamp: (type, ms since the epoch)
            return EPOCH + timedelta(milliseconds=msg.timestamp[1])

        # Bytewax's EventClock keeps a watermark per key and advances it with system time
        # after each key's latest event. Replaying a backlog whose event time runs faster than
        # Bytewax reads it would make most records late (dropped), so the system clock is held
        # still (now_getter): a key's window closes when the key's next window starts, and
        # the last windows at the end of the input (tail=False), when Bytewax flushes every
        # window. Each key's records come from one partition, in order: nothing is late.
        clock = EventClock(ts_getter=event_time, wait_for_system_duration=timedelta(0),
                           now_getter=lambda: EPOCH)
        windower = TumblingWindower(length=timedelta(milliseconds=spec.WINDOW_MS),
                                    align_to=EPOCH)
        counts = count_window("count", inp.oks, clock, windower, key)

        def result(item):
            k, (window_id, count) = item
            start = window_id * spec.WINDOW_MS
            value = spec.window_value(start, start + spec.WINDOW_MS, count)
            return KafkaSinkMessage(k.encode(), json.dumps(value).encode())
        out = op.map("result", counts.down, result)
    kop.output("out", out, brokers=brokers, topic=args.output)
    return flow


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=["A", "B"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--report", required=True)
    args = ap.parse_args()
    # what `python -m bytewax.run` does without recovery: a 10 s epoch, one worker
    cli_main(build(args), workers_per_process=1, epoch_interval=timedelta(seconds=10),
             recovery_config=None)


if __name__ == "__main__":
    main()
