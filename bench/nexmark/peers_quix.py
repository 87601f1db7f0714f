"""NEXMark q0, q1, q2, q5, q7 and q11 as a Quix Streams application, written as Quix Streams'
documentation shows (``Application``, ``app.topic`` with a ``timestamp_extractor`` for event
time, ``app.dataframe``, ``apply`` / ``filter`` / ``group_by``, ``hopping_window``,
``tumbling_window`` and ``session_window`` with ``count()`` / ``reduce()`` and ``final()``,
``to_topic``). Run by ``bench.nexmark.peers.run_peer`` with the Python of Quix Streams' own
virtual environment, from the repository's root:

    python -m bench.nexmark.peers_quix QUERY --bootstrap ... --output ... --events N
        --report FILE --state-dir DIR

Windows group by the Kafka message key, so a windowed query first re-keys the bids with
``group_by`` (through a repartition topic Quix Streams makes); a result over all the bids (the
top of q5's and q7's windows) groups by one constant key.
"""

from __future__ import annotations

import argparse
import logging
import uuid

from quixstreams import Application

from bench.nexmark import peers as nx


def build(app: Application, query: str, progress: nx.Progress, output: str,
          topic_prefix: str = "") -> None:
    """Adds ``query``'s dataframe to ``app``: bids in, JSON records out to ``output``."""

    def event_time(value, headers, timestamp, timestamp_type) -> int:
        return value["date_time"]

    bids = app.topic(topic_prefix + nx.READS, value_deserializer="json",
                     timestamp_extractor=event_time)
    sdf = app.dataframe(bids)
    lag = nx.LAG_MS

    if query in ("q0", "q1", "q2"):
        sdf = sdf.update(progress.read)   # (the counters run_peer reads: not the query's)
    if query == "q0":
        pass
    elif query == "q1":
        sdf = sdf.apply(nx.q1_row)
    elif query == "q2":
        sdf = sdf.filter(nx.q2_keep).apply(nx.q2_row)
    elif query == "q5":
        # bids per auction in hopping 10 s windows every 2 s (Flink's HOP; Quix Streams'
        # sliding_window is another kind: a window ending at every event) ...
        counts = app.topic(f"{output}-q5-counts", key_serializer="str", key_deserializer="str",
                           value_serializer="json", value_deserializer="json")
        per_auction = sdf.group_by("auction").update(progress.read)
        per_auction = (per_auction.hopping_window(duration_ms=nx.Q5_SIZE_MS,
                                                  step_ms=nx.Q5_SLIDE_MS, grace_ms=lag,
                                                  on_late=progress.late)
                       .count().final(closing_strategy="partition"))
        per_auction = per_auction.apply(lambda w, key, ts, headers: [key, w["value"]],
                                        metadata=True)
        # ... then the top of each window over every auction, through a topic of one key
        # (group_by cannot be nested): the counts of one hopping window carry its start as
        # their timestamp, so a tumbling window of one step holds exactly them
        per_auction.update(lambda count: progress.relay(1)).to_topic(counts,
                                                                    key=lambda count: "all")
        sdf = app.dataframe(counts).update(lambda count: progress.relay(-1))
        sdf = (sdf.tumbling_window(duration_ms=nx.Q5_SLIDE_MS, grace_ms=lag,
                                   on_late=progress.late)
               .reduce(reducer=nx.q5_fold, initializer=nx.q5_first)
               .final(closing_strategy="partition"))
        sdf = sdf.apply(lambda w: nx.q5_rows(w["value"], w["start"]), expand=True)
    elif query == "q7":
        sdf = sdf.group_by(lambda bid: "all", name="q7-all").update(progress.read)
        sdf = (sdf.tumbling_window(duration_ms=nx.Q7_SIZE_MS, grace_ms=lag,
                                   on_late=progress.late)
               .reduce(reducer=nx.q7_fold, initializer=nx.q7_first)
               .final(closing_strategy="partition"))
        sdf = sdf.apply(lambda w: nx.q7_rows(w["value"], w["end"]), expand=True)
    elif query == "q11":
        sdf = sdf.group_by("bidder").update(progress.read)
        sdf = (sdf.session_window(inactivity_gap_ms=nx.Q11_GAP_MS, grace_ms=lag,
                                  on_late=progress.late)
               .count().final(closing_strategy="partition"))
        # Quix Streams' session ends one millisecond after its last event (exclusive)
        sdf = sdf.apply(lambda w, key, ts, headers:
                        nx.q11_row(key, w["value"], w["start"], w["end"] - 1), metadata=True)
    else:
        raise ValueError(f"peers_quix: no query {query!r}; it runs {nx.SUPPORTED['quix']}")
    sdf = sdf.apply(progress.wrote)
    sdf.to_topic(app.topic(output, value_serializer="json"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("query", choices=nx.SUPPORTED["quix"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--events", type=int, required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--topic-prefix", default="")
    ap.add_argument("--state-dir", required=True)
    args = ap.parse_args()
    progress = nx.Progress(args.report, args.events)
    app = Application(broker_address=args.bootstrap,
                      consumer_group=f"nexmark-quix-{uuid.uuid4().hex[:8]}",
                      auto_offset_reset="earliest",
                      processing_guarantee=nx.QUIX_GUARANTEE,
                      commit_interval=nx.COMMIT_INTERVAL_S,
                      state_dir=args.state_dir,
                      loglevel=logging.WARNING)
    build(app, args.query, progress, args.output, args.topic_prefix)
    app.run()


if __name__ == "__main__":
    main()
