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
import json
import logging
import uuid

from quixstreams import Application
from quixstreams.models import TopicConfig

from bench.nexmark import peers as nx
from bench.nexmark.kafka_input import is_end_marker


def build(app: Application, query: str, progress: nx.Progress, output: str,
          partitions: int, topic_prefix: str = "") -> None:
    """Adds ``query``'s dataframe to ``app``: bids in (a topic of ``partitions`` partitions,
    keyed by auction), JSON records out to ``output``."""

    def event_time(value, headers, timestamp, timestamp_type) -> int:
        return value["date_time"]

    bids = app.topic(topic_prefix + nx.READS, value_deserializer="json", key_deserializer="str",
                     timestamp_extractor=event_time)
    sdf = app.dataframe(bids)
    lag = nx.LAG_MS

    if query in ("q0", "q1", "q2"):
        sdf = sdf.filter(lambda bid: not is_end_marker(bid)).update(progress.read)
    if query == "q0":
        pass
    elif query == "q1":
        sdf = sdf.apply(nx.q1_row)
    elif query == "q2":
        sdf = sdf.filter(nx.q2_keep).apply(nx.q2_row)
    elif query == "q5":
        # bids per auction (the topic's key) in hopping 10 s windows every 2 s (Flink's HOP;
        # Quix Streams' sliding_window is another kind: a window ending at every event) ...
        # (its records carry event times, the windows' starts: kept whatever their age)
        counts = app.topic(f"{output}-q5-counts", key_serializer="str", key_deserializer="str",
                           value_serializer="json", value_deserializer="json",
                           config=TopicConfig(num_partitions=1, replication_factor=1,
                                              extra_config={"retention.ms": "-1"}))
        per_auction = (sdf.update(progress.read_event)
                       .hopping_window(duration_ms=nx.Q5_SIZE_MS, step_ms=nx.Q5_SLIDE_MS,
                                       grace_ms=lag, on_late=progress.late)
                       .count().final(closing_strategy="partition"))
        per_auction = per_auction.apply(lambda w, key, ts, headers: [int(key), w["value"]],
                                        metadata=True)
        # ... then the top of each window over every auction, through a topic of one key
        # (group_by cannot be nested): the counts of one hopping window carry its start as
        # their timestamp, so a tumbling window of one step holds exactly them
        per_auction.update(lambda count: progress.relay(1)).to_topic(counts,
                                                                    key=lambda count: "all")
        # (each partition's end marker follows its last counts, which it closed)
        (sdf.filter(is_end_marker).update(lambda marker: progress.relay(1))
         .to_topic(counts, key=lambda marker: "all"))
        sdf = (app.dataframe(counts).update(lambda count: progress.relay(-1))
               .filter(_last_marker(partitions), stateful=True))
        sdf = (sdf.tumbling_window(duration_ms=nx.Q5_SLIDE_MS,
                                   grace_ms=nx.QUIX_MIXED_GRACE_MS, on_late=progress.late)
               .reduce(reducer=_events_only(nx.q5_fold, nx.q5_first),
                       initializer=_first_event(nx.q5_first))
               .final(closing_strategy="partition"))
        sdf = sdf.apply(lambda w: nx.q5_rows(w["value"], w["start"]), expand=True)
    elif query == "q7":
        sdf = _regroup(sdf, lambda bid: "all", "q7-all", partitions).update(progress.read_event)
        sdf = (sdf.tumbling_window(duration_ms=nx.Q7_SIZE_MS, grace_ms=nx.QUIX_MIXED_GRACE_MS,
                                   on_late=progress.late)
               .reduce(reducer=_events_only(nx.q7_fold, nx.q7_first),
                       initializer=_first_event(nx.q7_first))
               .final(closing_strategy="partition"))
        sdf = sdf.apply(lambda w: nx.q7_rows(w["value"], w["end"]), expand=True)
    elif query == "q11":
        sdf = (_regroup(sdf, lambda bid: bid["bidder"], "q11-bidder", partitions)
               .update(progress.read_event))
        sdf = (sdf.session_window(inactivity_gap_ms=nx.Q11_GAP_MS,
                                  grace_ms=nx.QUIX_MIXED_GRACE_MS, on_late=progress.late)
               .count().final(closing_strategy="partition"))
        # Quix Streams' session ends one millisecond after its last event (exclusive)
        sdf = sdf.apply(lambda w, key, ts, headers:
                        nx.q11_row(key, w["value"], w["start"], w["end"] - 1), metadata=True)
    else:
        raise ValueError(f"peers_quix: no query {query!r}; it runs {nx.SUPPORTED['quix']}")
    sdf = sdf.apply(progress.wrote)
    sdf.to_topic(app.topic(output, key_serializer="json", value_serializer="json"))


# --- the end of the input ----------------------------------------------------------------------
# The topics end with one end marker per partition, whose event time is past every window: a
# window closes when its partition's event time passes its end, so the marker closes the last
# windows. A repartition (group_by) mixes the input's partitions, so each input partition's
# marker is sent to every partition of the repartition topic (a key per partition, by Kafka's
# default partitioner, which Quix Streams' producer uses), and a partition passes a marker on
# only when it has every input partition's: then no bid of the input can follow it.

def _regroup(sdf, key, name: str, partitions: int):
    """``sdf.group_by(key, name)`` with the end markers sent on as said above."""
    keys = _marker_keys(partitions)
    sdf = sdf.apply(lambda value: [dict(value, to=p) for p in range(partitions)]
                    if is_end_marker(value) else (value,), expand=True)
    sdf = sdf.group_by(lambda value: keys[value["to"]] if is_end_marker(value) else key(value),
                       name=name)
    return sdf.filter(_last_marker(partitions), stateful=True)


def _last_marker(partitions: int):
    """A stateful filter passing every event and only the last of ``partitions`` markers."""
    def keep(value, state) -> bool:
        if not is_end_marker(value):
            return True
        seen = state.get("end-markers", 0) + 1
        state.set("end-markers", seen)
        return seen == partitions
    return keep


def _first_event(initializer):
    """A window's initializer that leaves an end marker out (its window never closes)."""
    return lambda value: None if is_end_marker(value) else initializer(value)


def _events_only(reducer, initializer):
    """A window's reducer that leaves end markers out."""
    def reduce(acc, value):
        if is_end_marker(value):
            return acc
        return initializer(value) if acc is None else reducer(acc, value)
    return reduce


def _marker_keys(partitions: int) -> list[str]:
    """A key per partition of the repartition topic: ``keys[p]`` (JSON-serialised, as
    group_by writes keys) goes to partition ``p``."""
    keys: list[str | None] = [None] * partitions
    i = 0
    while None in keys:
        key = f"end-{i}"
        p = _murmur2(json.dumps(key).encode()) % partitions
        if keys[p] is None:
            keys[p] = key
        i += 1
    return keys  # type: ignore[return-value]


def _murmur2(data: bytes) -> int:
    """Kafka's default partitioner's hash (positive)."""
    m, h = 0x5BD1E995, (0x9747B28C ^ len(data)) & 0xFFFFFFFF
    n4 = len(data) // 4
    for i in range(n4):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = data[4 * n4:]
    if len(rest) >= 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if rest:
        h ^= rest[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h & 0x7FFFFFFF


def _partitions(bootstrap: str, topic: str) -> int:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return len(md.topics[topic].partitions)


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
    build(app, args.query, progress, args.output,
          _partitions(args.bootstrap, args.topic_prefix + nx.READS), args.topic_prefix)
    app.run()


if __name__ == "__main__":
    main()
