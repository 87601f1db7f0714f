"""NEXMark q0, q1, q2, q5, q7 and q11 as a Bytewax dataflow, written as Bytewax's documentation
shows (``bytewax.connectors.kafka.operators`` input and output, ``op.map``, ``op.filter``,
``op.key_on``, ``windowing.fold_window`` with an ``EventClock`` and a
``SlidingWindower``, ``TumblingWindower`` or ``SessionWindower``), run as ``python -m
bytewax.run`` runs a flow: one worker, no recovery (Bytewax offers no exactly-once Kafka sink).
Run by ``bench.nexmark.peers.run_peer`` with the Python of Bytewax's own virtual environment,
from the repository's root:

    python -m bench.nexmark.peers_bytewax QUERY --bootstrap ... --output ... --events N
        --report FILE [--state-dir DIR (unused)]

The input ends at the end of the bid topic (``tail=False``): Bytewax then closes every open
window, so the last windows are written too; the end markers the topics end with are dropped.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timedelta, timezone

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSinkMessage
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow
from bytewax.operators.windowing import (
    EventClock, SessionWindower, SlidingWindower, TumblingWindower, fold_window,
)
from bytewax.run import cli_main

from bench.nexmark import peers as nx
from bench.nexmark.kafka_input import is_end_marker

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def build(query: str, bootstrap: str, output: str, progress: nx.Progress,
          topic_prefix: str = "") -> Dataflow:
    """``query``'s dataflow: bids in, JSON records out to ``output``."""
    flow = Dataflow(f"nexmark-{query}")
    inp = kop.input("in", flow, brokers=[bootstrap], topics=[topic_prefix + nx.READS],
                    tail=False)
    op.inspect("errors", inp.errs).then(op.raises, "crash-on-error")

    def decode(msg):
        return json.loads(msg.value)

    def event(record) -> bool:  # the end markers are dropped: the input's end closes windows
        if is_end_marker(record):
            return False
        progress.read()
        return True

    bids = op.filter("events", op.map("decode", inp.oks, decode), event)

    def event_time(bid) -> datetime:
        return EPOCH + timedelta(milliseconds=bid["date_time"])

    # The EventClock keeps a watermark per key and advances it with system time after each
    # key's latest event. Replaying a backlog whose event time runs faster than Bytewax reads
    # it would make most records late, so the system clock is held still (now_getter) and
    # never wakes the flow (to_system_utc): a key's windows close when its events pass their
    # end by the lag, and every window at the end of the input.
    clock = EventClock(ts_getter=event_time,
                       wait_for_system_duration=timedelta(milliseconds=nx.LAG_MS),
                       now_getter=lambda: EPOCH, to_system_utc=lambda _: None)

    if query == "q0":
        out = bids
    elif query == "q1":
        out = op.map("to-euro", bids, nx.q1_row)
    elif query == "q2":
        out = op.map("row", op.filter("auction-123", bids, nx.q2_keep), nx.q2_row)
    elif query == "q5":
        # bid counts of every auction in sliding 10 s windows every 2 s, over all the bids
        # (one key), so that each window's top is known when the window closes
        def count_auction(counts: dict, bid) -> dict:
            counts[bid["auction"]] = counts.get(bid["auction"], 0) + 1
            return counts

        def merge(a: dict, b: dict) -> dict:
            for auction, n in b.items():
                a[auction] = a.get(auction, 0) + n
            return a

        windows = fold_window(
            "counts", op.key_on("all", bids, lambda bid: "all"), clock,
            SlidingWindower(length=timedelta(milliseconds=nx.Q5_SIZE_MS),
                            offset=timedelta(milliseconds=nx.Q5_SLIDE_MS), align_to=EPOCH),
            builder=dict, folder=count_auction, merger=merge)
        op.inspect("late", windows.late, progress.late)

        def top(item):
            _key, (window_id, counts) = item
            pairs = iter(counts.items())
            acc = nx.q5_first(list(next(pairs)))
            for pair in pairs:
                acc = nx.q5_fold(acc, list(pair))
            return nx.q5_rows(acc, window_id * nx.Q5_SLIDE_MS)

        out = op.flat_map("top", windows.down, top)
    elif query == "q7":
        windows = fold_window(
            "highest", op.key_on("all", bids, lambda bid: "all"), clock,
            TumblingWindower(length=timedelta(milliseconds=nx.Q7_SIZE_MS), align_to=EPOCH),
            builder=lambda: [-1, []], folder=nx.q7_fold, merger=nx.q7_merge)
        op.inspect("late", windows.late, progress.late)
        out = op.flat_map("highest-bids", windows.down, lambda item: nx.q7_rows(
            item[1][1], (item[1][0] + 1) * nx.Q7_SIZE_MS))
    elif query == "q11":
        def fold(acc: list, bid) -> list:  # [bids, first time, last time]
            t = bid["date_time"]
            return [acc[0] + 1, min(acc[1], t), max(acc[2], t)]

        def merge(a: list, b: list) -> list:
            return [a[0] + b[0], min(a[1], b[1]), max(a[2], b[2])]

        sessions = fold_window(
            "sessions", op.key_on("bidder", bids, lambda bid: str(bid["bidder"])), clock,
            SessionWindower(gap=timedelta(milliseconds=nx.Q11_GAP_MS)),
            builder=lambda: [0, 2**62, -1], folder=fold, merger=merge)
        op.inspect("late", sessions.late, progress.late)
        out = op.map("row", sessions.down,
                     lambda item: nx.q11_row(int(item[0]), *item[1][1]))
    else:
        raise ValueError(f"peers_bytewax: no query {query!r}; it runs "
                         f"{nx.SUPPORTED['bytewax']}")

    def encode(record) -> KafkaSinkMessage:
        progress.wrote(record)
        return KafkaSinkMessage(None, json.dumps(record, separators=(",", ":")).encode())

    kop.output("out", op.map("encode", out, encode), brokers=[bootstrap], topic=output)
    return flow


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("query", choices=nx.SUPPORTED["bytewax"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--events", type=int, required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--topic-prefix", default="")
    ap.add_argument("--state-dir")
    args = ap.parse_args()
    progress = nx.Progress(args.report, args.events)
    # what `python -m bytewax.run` does without recovery: a 10 s epoch, one worker
    cli_main(build(args.query, args.bootstrap, args.output, progress,
                   args.topic_prefix), workers_per_process=1,
             epoch_interval=timedelta(seconds=10), recovery_config=None)
    progress.flush(done=True)


if __name__ == "__main__":
    main()
