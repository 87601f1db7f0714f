"""The NEXMark events in Kafka, as a real system would receive them.

One topic per kind (``nexmark-person``, ``nexmark-auction``, ``nexmark-bid``, after an
optional prefix), JSON values, keyed by id (a bid by its auction, so one auction's bids
stay in one partition). :func:`fill` creates the topics and writes a run's events as fast
as the producer goes (for the throughput runs: the topics are filled before the job
starts, and the job reads them from the start); :class:`RateWriter` writes them at a fixed
rate, each record's Kafka timestamp its production time and each event's ``date_time``
the moment it was due (for the latency runs). Both keep the events, for the references.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.nexmark.events import AUCTION_TOPIC, BID_TOPIC, END_MARKER_FIELD, PERSON_TOPIC
from bench.nexmark.generator import Event, GeneratorConfig, generate

TOPICS = {"person": PERSON_TOPIC, "auction": AUCTION_TOPIC, "bid": BID_TOPIC}
DEFAULT_PARTITIONS = 4
END_MARKER_DELAY_MS = 24 * 3600 * 1000  # the markers' event time: a day after the last event
# lz4 measured best on this machine's loopback broker (docs/nexmark.md, "The events in
# Kafka"); idempotent, so a retried request can neither reorder a partition (the references
# follow the generated order) nor write an event twice
PRODUCER_SETTINGS = {"linger.ms": 20, "batch.size": 1_000_000, "compression.type": "lz4",
                     "queue.buffering.max.messages": 1_000_000,
                     "queue.buffering.max.kbytes": 1_048_576, "enable.idempotence": True}


@dataclass
class KafkaInput:
    """The topics of one run's input and the events written to them."""

    bootstrap: str
    prefix: str
    partitions: int
    events: list[tuple[str, Event]]
    write_s: float = 0.0
    counts: Counter = field(default_factory=Counter)
    end_markers: bool = True

    def topic(self, kind: str) -> str:
        return self.prefix + TOPICS[kind]

    def reads(self, kinds: Sequence[str]) -> int:
        """How many of the events are of ``kinds`` (what a query reading them consumes)."""
        return sum(self.counts[k] for k in kinds)

    def records(self, kinds: Sequence[str]) -> int:
        """How many records the topics of ``kinds`` hold: the events and the end markers."""
        return self.reads(kinds) + (self.partitions if self.end_markers else 0) * len(kinds)


def key_of(kind: str, event: Any) -> bytes:
    """The record key: a person's or auction's id, a bid's auction."""
    return str(event["auction"] if kind == "bid" else event["id"]).encode()


def end_marker(event_time_ms: int) -> dict:
    """The record that ends a topic's partition: no event, an event time past every window."""
    return {END_MARKER_FIELD: True, "date_time": event_time_ms}


def is_end_marker(record: Any) -> bool:
    return isinstance(record, dict) and END_MARKER_FIELD in record


def encode(event: Any) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def create_topics(bootstrap: str, prefix: str = "", partitions: int = DEFAULT_PARTITIONS,
                  replace: bool = False) -> None:
    """Creates the three topics (no retention by time: the events carry fixed event times);
    ``replace`` deletes any of the same names first."""
    from confluent_kafka.admin import AdminClient, NewTopic

    if partitions < 1:
        raise ValueError(f"create_topics(): partitions must be >= 1, got {partitions}")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [prefix + t for t in TOPICS.values()]
    if replace:
        existing = set(admin.list_topics(timeout=10).topics)
        doomed = [n for n in names if n in existing]
        if doomed:
            for fut in admin.delete_topics(doomed, operation_timeout=30).values():
                fut.result(60)
            _wait(lambda: not set(doomed) & set(admin.list_topics(timeout=10).topics),
                  f"topics {doomed} deleted")
    futures = admin.create_topics([NewTopic(n, partitions, 1, config={"retention.ms": "-1"})
                                   for n in names], operation_timeout=30)
    for name, fut in futures.items():
        try:
            fut.result(60)
        except Exception as e:  # recreated too soon after a delete: try once more
            if "already exists" not in str(e).lower() and "marked for deletion" not in str(e):
                raise
            time.sleep(1.0)
            admin.create_topics([NewTopic(name, partitions, 1,
                                          config={"retention.ms": "-1"})])[name].result(60)

    def ready() -> bool:
        md = admin.list_topics(timeout=5).topics
        return all(n in md and md[n].error is None and len(md[n].partitions) == partitions
                   and all(p.leader >= 0 for p in md[n].partitions.values()) for n in names)
    _wait(ready, f"topics {names} with a leader per partition")


def _wait(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done in {timeout:.0f} s: {what}")
        time.sleep(0.1)


def producer(bootstrap: str, settings: dict | None = None) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, **(settings or PRODUCER_SETTINGS)})


def fill(bootstrap: str, config: GeneratorConfig, prefix: str = "",
         partitions: int = DEFAULT_PARTITIONS, settings: dict | None = None,
         replace: bool = False, end_markers: bool = True) -> KafkaInput:
    """Creates the topics and writes ``config``'s events into them as fast as it can, then
    (``end_markers``) one end marker per partition: a bounded input's end, which moves the
    watermark of a job reading it past every window (the queries drop the marker itself)."""
    events = list(generate(config))
    create_topics(bootstrap, prefix, partitions, replace)
    inp = KafkaInput(bootstrap, prefix, partitions, events,
                     counts=Counter(k for k, _ in events), end_markers=end_markers)
    p = producer(bootstrap, settings)
    topics = {k: inp.topic(k) for k in TOPICS}
    t0 = time.perf_counter()
    for i, (kind, event) in enumerate(events):
        while True:
            try:
                p.produce(topics[kind], encode(event), key_of(kind, event))
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    if end_markers:
        # after every event of its partition (the producer keeps a partition's order)
        at = max((e["date_time"] for _, e in events), default=config.start_ms)
        marker = encode(end_marker(at + END_MARKER_DELAY_MS))
        for topic in topics.values():
            for part in range(partitions):
                p.produce(topic, marker, b"end", partition=part)
    left = p.flush(120)
    inp.write_s = time.perf_counter() - t0
    if left:
        raise RuntimeError(f"fill(): {left} records not delivered in 120 s")
    return inp


class RateWriter:
    """Writes events at ``rate`` events/s on a thread, from ``start()`` for ``seconds`` (or
    until ``stop()``).

    Event ``n`` is due at ``t0 + n / rate``; its ``date_time`` is that moment (ms) and its
    record's Kafka timestamp the moment it was handed to the producer. :meth:`produced_at`
    maps an event time back to the production time of the first event due at or after it.
    """

    def __init__(self, bootstrap: str, prefix: str, rate: int, seconds: float,
                 seed: int = 1, partitions: int = DEFAULT_PARTITIONS) -> None:
        if rate < 1 or seconds <= 0:
            raise ValueError(f"RateWriter: rate and seconds must be positive, got {rate}, "
                             f"{seconds}")
        self.bootstrap, self.prefix, self.rate, self.seconds = bootstrap, prefix, rate, seconds
        self.seed, self.partitions = seed, partitions
        self.events: list[tuple[str, Event]] = []
        self.due_ms: list[int] = []
        self.sent_ms: list[int] = []
        self.behind_ms = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self.start_ms = 0
        self._thread = threading.Thread(target=self._run, name="nexmark-rate-writer",
                                        daemon=True)

    def start(self) -> "RateWriter":
        """Starts writing (the topics must exist: :func:`create_topics` with the same
        prefix). The events are generated as they are written."""
        self.start_ms = int(time.time() * 1000) + 300
        self._config = GeneratorConfig(int(self.rate * self.seconds), rate=self.rate,
                                       seed=self.seed, start_ms=self.start_ms)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            p = producer(self.bootstrap, {**PRODUCER_SETTINGS, "linger.ms": 1})
            topics = {k: self.prefix + TOPICS[k] for k in TOPICS}
            for kind, event in generate(self._config):
                if self._stop.is_set():
                    break
                due = event["date_time"]
                wait = due / 1000 - time.time()
                if wait > 0.001:
                    time.sleep(wait)
                now = int(time.time() * 1000)
                self.behind_ms = max(self.behind_ms, now - due)
                value, key = encode(event), key_of(kind, event)
                while True:
                    try:
                        p.produce(topics[kind], value, key, timestamp=now)
                        break
                    except BufferError:
                        p.poll(0.01)
                self.events.append((kind, event))
                self.due_ms.append(due)
                self.sent_ms.append(now)
                if len(self.sent_ms) % 200 == 0:
                    p.poll(0)
            p.flush(60)
        except BaseException as e:  # noqa: BLE001 - reported by join()
            self.error = e

    def stop(self) -> None:
        """Ends the writing early."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error

    def produced_at(self, event_time_ms: int) -> int | None:
        """The production time of the first event due at or after ``event_time_ms`` (None
        when no such event was written)."""
        i = bisect.bisect_left(self.due_ms, event_time_ms)
        return self.sent_ms[i] if i < len(self.sent_ms) else None
