"""The Kafka source (Jet's ``StreamKafkaP``): a replayable stream whose offsets live in the
job's snapshots.

- Partitions are assigned to the processors of the whole job by Jet's formula: partition
  ``p`` of the ``i``-th topic belongs to global processor
  ``(i * max(1, total / len(topics)) + p) % total``. The consumer uses manual assignment, never
  a group rebalance, so every member agrees on who reads what without talking.
- Offsets (what to read next, per topic-partition) are saved at snapshot phase 1 under a
  ``BroadcastKey``: at restore every processor sees every saved offset and keeps the ones of
  the partitions it owns in the new layout, so a job resumes with another parallelism. With a
  ``group.id`` in the properties the offsets of each committed snapshot are also committed to
  that group (phase 2), only so that Kafka tooling shows the lag.
- Every ``jetwake.partition.discovery.ms`` the topics' metadata is read again; partitions
  added meanwhile are read from their beginning by their owner.
- Records are consumed in batches (``consume(num_messages, timeout=0)``) and emitted as one
  chunk of ``(timestamp, item)`` pairs: the pipeline unwraps them unless
  ``with_native_timestamps`` uses the record timestamps as event time.
- A chunk is read a column at a time, by C code: the deserializers map over the keys and the
  values (serde.deserialize_all), a projection's records are made by ``KafkaRecord`` (a msgspec
  Struct) over the columns, and a projection ``operator.attrgetter(field)`` (``"value"``,
  ``"key"``, ...) is that field's column, with no record made at all: then nothing in the
  source calls Python per record. The record timestamps are read only when the items carry
  them or a projection's records need them.
- A ``with_timestamps(fn, lag)`` or ``with_native_timestamps(lag)`` stage right after the
  source runs inside it (``PartitionedSource``): each partition's records go through the
  timestamp function and the watermark policy on their own, the source emits the lowest
  watermark of its partitions, and each partition's highest timestamp is saved with its offset
  (engine/processors/source_event_time.py).
- A record that cannot be deserialized (or projected) fails the job with its topic,
  partition and offset, or with ``on_error="dead_letter"`` is written to the dead-letter topic
  and counted (metric ``dead_letters``).

The processor is cooperative: it never waits. ``consume`` is called with a zero timeout (an
empty result is "no progress", and the worker backs off); the blocking calls are kept off the
worker: the cluster metadata and the start offsets are read in ``init()`` (which runs before
the job's tasklets are handed to the workers), and the periodic partition discovery runs on a
small thread of its own (:class:`MetadataPoller`). On a 2-core machine that made the Kafka
pipelines of ``python -m bench kafka-peers`` faster than the same source on a thread of its
own, whose GIL hand-offs to the workers cost more than its blocking ``consume`` saved
(docs/performance.md has both figures).
"""

from __future__ import annotations

import logging
import threading
import time
from itertools import compress, groupby
from operator import attrgetter, itemgetter, not_
from typing import Any, Callable, Sequence

from jetwake.engine.core.errors import JetwakeError, RestartableError
from jetwake.engine.core.partitioning import owner_of_partition
from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext
from jetwake.engine.processors.source_event_time import PartitionedSource, SourceEventTime
from jetwake.connectors.kafka.serde import RECORD_FIELDS, KafkaRecord, deserialize_all
from jetwake.connectors.kafka.client_log import with_client_log
from jetwake.connectors.kafka import reachability

__all__ = ["KafkaSourceProcessor", "KafkaSourceEntries", "KafkaSourceError",
           "KafkaDeserializationError", "MetadataPoller", "owner_of_partition"]

log = logging.getLogger("jetwake.kafka")

OFFSET_BEGINNING = -2
OFFSET_END = -1


class KafkaSourceEntries:
    """The snapshot entry of a Kafka source processor, one codec for the processor (which
    saves and restores it) and for the Spark backfill's hand-off (which writes it): under
    ``BroadcastKey(("kafka-source", processor index))``, ``offsets``
    ``[[topic, partition, next offset, highest event time or None], ...]`` and ``counts``,
    each topic's number of partitions when it was saved."""

    @staticmethod
    def offsets(index: int, offsets: list[list], counts: dict[str, int]) -> tuple[BroadcastKey,
                                                                                   dict]:
        return BroadcastKey(("kafka-source", index)), \
            {"offsets": offsets, "counts": [[t, n] for t, n in counts.items()]}

    @staticmethod
    def is_offsets(key: Any) -> bool:
        return type(key) is BroadcastKey and type(key.key) is tuple \
            and key.key[:1] == ("kafka-source",)

    @staticmethod
    def read(value: dict) -> tuple[list[list], list[list]]:
        """``(offsets, counts)`` of an entry."""
        return value["offsets"], value["counts"]


class KafkaSourceError(JetwakeError):
    """The Kafka source cannot run: a topic is missing, the brokers do not answer..."""


class KafkaDeserializationError(JetwakeError):
    """A record could not be deserialized or projected; the message names its topic,
    partition and offset."""


_ts = itemgetter(1)


class MetadataPoller:
    """Reads the cluster metadata every ``interval`` seconds on a daemon thread of its own
    and keeps the newest answer for the source to take. ``list_topics`` blocks for a network
    round trip, and up to its timeout while a broker is away: a cooperative processor must not
    wait for it."""

    def __init__(self, consumer: Any, interval: float, name: str, servers: str) -> None:
        self._consumer = consumer
        self._servers = servers
        self._interval = interval
        self._stopped = threading.Event()
        self._latest: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"jetwake-kafka-metadata-{name}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self._latest = self._consumer.list_topics(timeout=2.0)
                reachability.answered(self._servers)
            except Exception as e:  # noqa: BLE001 - a broker away for a moment: next round
                reachability.unanswered(self._servers)
                log.debug("partition discovery failed: %s", e)

    def take(self) -> Any:
        """The metadata read since the last call, or None."""
        md, self._latest = self._latest, None
        return md

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)


class KafkaSourceProcessor(Processor, PartitionedSource):
    #: how errors name the source, and what they tell to do about a missing topic
    where = "Sources.kafka()"
    missing_topic_fix = "create them first"

    def __init__(self, topics: Sequence[str], properties: dict, options: dict,
                 key_deserializer: Callable | None, value_deserializer: Callable | None,
                 start: Any, projection: Callable | None, on_error: str,
                 dead_letter_topic: str | None) -> None:
        self.topics = list(topics)
        self.properties = properties
        self.options = options
        self.kd = key_deserializer
        self.vd = value_deserializer
        self.start = start
        self.projection = projection
        # a projection operator.attrgetter(field) is that field's column, read without records
        self.column = projection_column(projection)
        self.on_error = on_error
        self.dead_letter_topic = dead_letter_topic
        self.consumer: Any = None
        self.counts: dict[str, int] = {}           # partitions known per topic
        self.owned: list[tuple[str, int]] = []     # (topic, partition) read here
        self.restored: dict[tuple[str, int], int] = {}
        self.restored_counts: dict[str, int] = {}
        self.restored_tops: dict[tuple[str, int], int] = {}
        self.was_restored = False
        self.started = False
        self.start_offsets: dict[tuple[str, int], int] = {}
        self.snapshot_offsets: dict[int, list] = {}
        self.dead_letters: Any = None
        self.et: SourceEventTime | None = None  # event time per partition, when planned
        self._initial: dict[tuple[str, int], int] = {}  # start offsets found in init()
        self._poller: MetadataPoller | None = None
        self._dead_letter_deadline: float | None = None
        self._last_error_log = 0.0

    def is_cooperative(self) -> bool:
        return True

    # --- start -------------------------------------------------------------------------------

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        from confluent_kafka import Consumer

        self.index = context.global_processor_index
        self.total = context.total_parallelism
        props = dict(self.properties)
        self.commit_group = "group.id" in props
        props.setdefault("group.id", f"jetwake-{context.job_id}-{context.vertex_name}")
        # event time per partition: a partition may fall idle only once read to its end, which
        # librdkafka tells with an end-of-partition event
        self.et = self.make_event_time(context.metrics, reports_end=True)
        if self.et is not None:
            props["enable.partition.eof"] = True
        self.consumer = Consumer(with_client_log(props))
        self.servers = str(self.properties.get("bootstrap.servers"))
        self.unreachable_ms = self.options[reachability.UNREACHABLE_OPTION]
        self.batch = self.options["jetwake.poll.batch"]
        self.discovery = self.options["jetwake.partition.discovery.ms"] / 1000
        context.metrics.setdefault("dead_letters", 0)
        context.metrics.setdefault("records_in", 0)
        md = self._metadata_with_retry()
        for t in self.topics:
            self.counts[t] = len(md.topics[t].partitions)
        # the start offsets of the partitions this processor owns now, looked up here because
        # init() may block and the first complete() may not; a restore replaces them
        if self.start != "earliest":
            self._initial = self._initial_offsets(
                [(t, p) for t in self.topics for p in range(self.counts[t]) if self._owns(t, p)])
        if self.dead_letter_topic is not None:
            from jetwake.connectors.kafka.dead_letter import DeadLetterWriter
            self.dead_letters = DeadLetterWriter(self.dead_letter_topic, self.properties)

    def _metadata_with_retry(self) -> Any:
        """Cluster metadata with every topic present; retried with exponential back-off until
        ``jetwake.startup.timeout.ms``, or until the brokers have not answered for longer
        than ``jetwake.unreachable.timeout.ms`` across the job's restarts (reachability)."""
        from tenacity import (RetryError, Retrying, retry_if_not_exception_type,
                              stop_after_delay, wait_exponential)

        limit = self.options["jetwake.startup.timeout.ms"] / 1000
        servers = self.properties.get("bootstrap.servers")

        def fetch() -> Any:
            try:
                md = self.consumer.list_topics(timeout=min(5.0, max(limit, 0.5)))
            except Exception:
                reachability.unanswered(self.servers)
                reachability.check(self.servers, self.unreachable_ms, self.where)
                raise
            reachability.answered(self.servers)
            missing = [t for t in self.topics
                       if t not in md.topics or md.topics[t].error is not None
                       or not md.topics[t].partitions]
            if missing:
                raise _Missing(missing)
            return md

        try:
            for attempt in Retrying(stop=stop_after_delay(limit),
                                    wait=wait_exponential(multiplier=0.1, max=2.0),
                                    retry=retry_if_not_exception_type(
                                        reachability.KafkaUnreachableError), reraise=False):
                with attempt:
                    return fetch()
        except RetryError as e:
            cause = e.last_attempt.exception()
            if isinstance(cause, _Missing):
                raise KafkaSourceError(
                    f"{self.where}: topic(s) {cause.topics} do not exist on "
                    f"{servers} (waited {limit:.0f} s); {self.missing_topic_fix}") from None
            unreachable = KafkaSourceError(
                f"{self.where}: the Kafka brokers at {servers} did not answer within "
                f"{limit:.0f} s (jetwake.startup.timeout.ms): {cause}")
            unreachable.restartable = True  # brokers come back: the engine retries the start
            raise unreachable from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _owns(self, topic: str, partition: int) -> bool:
        return owner_of_partition(self.topics.index(topic), partition, len(self.topics),
                                  self.total) == self.index

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        self.was_restored = True
        for key, value in inbox.drain():
            if not KafkaSourceEntries.is_offsets(key):
                continue
            offsets, counts = KafkaSourceEntries.read(value)
            for t, n in counts:
                self.restored_counts[t] = max(n, self.restored_counts.get(t, 0))
            for t, p, off, top in offsets:
                self.restored[(t, p)] = off
                if top is not None:
                    self.restored_tops[(t, p)] = top

    def _start(self) -> None:
        """Assigns the owned partitions at their start offsets (restored, or by ``start``)."""
        from confluent_kafka import TopicPartition

        self.started = True
        for t in self.topics:
            n = max(self.counts[t], self.restored_counts.get(t, 0))
            self.counts[t] = n
            for p in range(n):
                if self._owns(t, p):
                    self.owned.append((t, p))
        fresh = []
        for tp in self.owned:
            if tp in self.restored:
                self.start_offsets[tp] = self.restored[tp]
            elif self.was_restored and tp[0] in self.restored_counts \
                    and tp[1] >= self.restored_counts[tp[0]]:
                self.start_offsets[tp] = OFFSET_BEGINNING  # added after that snapshot
            else:
                fresh.append(tp)
        missing = [tp for tp in fresh if tp not in self._initial]
        if missing:  # only partitions init() did not know of (earliest: no look-up at all)
            self._initial.update(self._initial_offsets(missing))
        for tp in fresh:
            self.start_offsets[tp] = self._initial[tp]
        assignment = [TopicPartition(t, p, self.start_offsets[(t, p)]) for t, p in self.owned]
        if assignment:
            self.consumer.assign(assignment)
        if self.et is not None:
            for tp in self.owned:
                self.et.add_partition(tp, self.restored_tops.get(tp))
        if self.discovery:
            self._poller = MetadataPoller(self.consumer, self.discovery,
                                          f"{self.context.vertex_name}#{self.index}",
                                          self.servers)
        log.debug("%s#%d reads %s", self.context.vertex_name, self.index, self.owned)

    def _initial_offsets(self, tps: list) -> dict:
        """Concrete offsets for ``start`` (so that a snapshot taken before the first record
        still pins the position)."""
        from confluent_kafka import TopicPartition

        start = self.start
        if start == "earliest":
            return {tp: OFFSET_BEGINNING for tp in tps}
        out = {}
        if start == "latest":
            for t, p in tps:
                lo, hi = self._retry(lambda: self.consumer.get_watermark_offsets(
                    TopicPartition(t, p), timeout=5.0))
                out[(t, p)] = hi
            return out
        found = self._retry(lambda: self.consumer.offsets_for_times(
            [TopicPartition(t, p, int(start)) for t, p in tps], timeout=10.0))
        for tpo in found:
            off = tpo.offset
            if off < 0:  # no record at or after that time: start at the end
                lo, off = self._retry(lambda: self.consumer.get_watermark_offsets(
                    TopicPartition(tpo.topic, tpo.partition), timeout=5.0))
            out[(tpo.topic, tpo.partition)] = off
        return out

    def _retry(self, fn: Callable[[], Any]) -> Any:
        from tenacity import Retrying, stop_after_delay, wait_exponential

        limit = self.options["jetwake.startup.timeout.ms"] / 1000
        try:
            for attempt in Retrying(stop=stop_after_delay(limit),
                                    wait=wait_exponential(multiplier=0.1, max=2.0),
                                    reraise=True):
                with attempt:
                    return fn()
        except Exception as e:
            raise KafkaSourceError(
                f"{self.where}: looking up start offsets on "
                f"{self.properties.get('bootstrap.servers')} failed for {limit:.0f} s: "
                f"{e}") from e

    # --- reading -----------------------------------------------------------------------------

    def complete(self) -> bool:
        if not self.started:
            self._start()
        reachability.check(self.servers, self.unreachable_ms, self.where)
        if self._poller is not None:
            md = self._poller.take()
            if md is not None:
                self._discover(md)
        outbox = self.outbox
        et = self.et
        if et is not None and not et.flush(outbox):
            return False
        if not outbox.has_room():
            return False
        msgs = self.consumer.consume(self.batch, 0) if self.owned else None
        if msgs:
            self._emit(msgs)
        elif et is not None:
            et.poll()
        if et is not None:
            et.flush(outbox)
        return False

    def _emit(self, msgs: list) -> None:
        from confluent_kafka import Message

        ends: list = []
        errors = list(map(Message.error, msgs))
        if any(errors):
            # the few messages that carry an error (a partition's end, a broker away) are
            # picked out by C-level selections; only they take a Python step each
            if self.et is not None:
                ends = _ends_after_records(msgs, errors, len(self.topics) == 1)
            self._handle_errors(list(compress(msgs, errors)))
            msgs = list(compress(msgs, map(not_, errors)))
            if not msgs:
                self._reached_ends(ends)
                return
        reachability.answered(self.servers)
        et = self.et
        # the items travel with their record timestamps unless a timestamp function reads them
        native = et is None or et.spec.timestamp_fn is None
        tss: list | None = None
        if native or (self.projection is not None and self.column in (None, "timestamp")):
            tss = list(map(_ts, map(Message.timestamp, msgs)))
        try:
            if self.column is not None:
                items = _read_column(self.column, msgs, tss, self.kd, self.vd)
            elif self.projection is not None:
                items = self._project_all(msgs, tss)
            else:
                # one C-level map per column for the built-in formats (serde.deserialize_all)
                items = list(zip(deserialize_all(self.kd, list(map(Message.key, msgs))),
                                 deserialize_all(self.vd, list(map(Message.value, msgs)))))
        except Exception:  # noqa: BLE001 - find the bad record(s), then fail or dead-letter
            items, tss, msgs = self._convert_one_by_one(msgs)
        self.context.metrics["records_in"] += len(items)
        if not items:
            self._reached_ends(ends)
            return
        if et is None:
            self.outbox.offer_chunk(-1, list(zip(tss, items)))  # type: ignore[arg-type]
            return
        # each partition's run of records through its own event time, in offset order
        one_topic = len(self.topics) == 1
        t0 = self.topics[0]
        # runs of one partition, found and measured in C (no Python step per record)
        keys: Any = map(Message.partition, msgs) if one_topic else \
            zip(map(Message.topic, msgs), map(Message.partition, msgs))
        runs = []
        start = 0
        for key, run in groupby(keys):
            end = start + len(list(run))
            runs.append(((t0, key) if one_topic else key,
                         list(zip(tss[start:end], items[start:end]))  # type: ignore[index]
                         if native else items[start:end]))
            start = end
        et.add_batch(runs, time.monotonic())
        self._reached_ends(ends)

    def _reached_ends(self, ends: list) -> None:
        if self.et is not None:
            for tp in ends:
                self.et.reached_end(tp)

    def _project_all(self, msgs: list, tss: list | None) -> list:
        """``projection(record)`` of each message: the columns are read and deserialized one
        C-level map each (as without a projection) and the records made by C code
        (serde.KafkaRecord), so the only Python step per record is the projection itself."""
        from confluent_kafka import Message

        assert self.projection is not None and tss is not None  # read for the records
        keys = deserialize_all(self.kd, list(map(Message.key, msgs)))
        values = deserialize_all(self.vd, list(map(Message.value, msgs)))
        records = map(KafkaRecord, map(Message.topic, msgs), map(Message.partition, msgs),
                      map(Message.offset, msgs), tss, keys, values,
                      [h or [] for h in map(Message.headers, msgs)])
        return list(map(self.projection, records))

    def _project(self, m: Any) -> Any:
        kd, vd = self.kd, self.vd
        k, v = m.key(), m.value()
        rec = KafkaRecord(m.topic(), m.partition(), m.offset(), m.timestamp()[1],
                          k if kd is None else kd(k), v if vd is None else vd(v),
                          m.headers() or [])
        assert self.projection is not None  # called only with a projection
        return self.projection(rec)

    def _convert_one_by_one(self, msgs: list) -> tuple[list, list, list]:
        """The items, timestamps and messages of the records that can be read."""
        kd, vd = self.kd, self.vd
        items, tss, kept = [], [], []
        for m in msgs:
            try:
                if self.projection is not None:
                    item = self._project(m)
                else:
                    k, v = m.key(), m.value()
                    item = (k if kd is None else kd(k), v if vd is None else vd(v))
            except Exception as e:  # noqa: BLE001
                self._bad_record(m, e)
                continue
            items.append(item)
            tss.append(m.timestamp()[1])
            kept.append(m)
        return items, tss, kept

    def _bad_record(self, m: Any, error: BaseException) -> None:
        where = f"topic {m.topic()!r}, partition {m.partition()}, offset {m.offset()}"
        if self.on_error == "dead_letter":
            self.dead_letters.write(m, error)
            self.context.metrics["dead_letters"] += 1
            log.warning("Sources.kafka(): record at %s cannot be read (%s: %s); written to "
                        "dead-letter topic %r", where, type(error).__name__, error,
                        self.dead_letter_topic)
            return
        raise KafkaDeserializationError(
            f"Sources.kafka(): cannot deserialize the record at {where}: "
            f"{type(error).__name__}: {error} (key {_short(m.key())}, value "
            f"{_short(m.value())}). Pass on_error='dead_letter' with a dead_letter_topic to "
            "route such records aside instead of failing the job") from error

    def _handle_errors(self, errored: list) -> None:
        """Acts on the messages of a batch that carry an error instead of a record: a
        partition's end is no error; a fatal one restarts the job; others are logged (at
        most every 5 s) while librdkafka retries."""
        from confluent_kafka import KafkaError

        for m in errored:
            err = m.error()
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            if err.fatal():
                raise RestartableError(f"Sources.kafka(): fatal consumer error: {err}")
            if err.code() == KafkaError._ALL_BROKERS_DOWN:
                reachability.unanswered(self.servers)
            now = time.monotonic()
            if now - self._last_error_log > 5:
                self._last_error_log = now
                log.warning("Sources.kafka() on %s: %s (retrying)",
                            self.properties.get("bootstrap.servers"), err)

    def _discover(self, md: Any) -> None:
        """Starts reading the partitions that ``md`` (newer metadata) shows were added."""
        from confluent_kafka import TopicPartition

        added = []
        for t in self.topics:
            tmd = md.topics.get(t)
            if tmd is None or tmd.error is not None:
                continue
            n = len(tmd.partitions)
            if n > self.counts[t]:
                for p in range(self.counts[t], n):
                    if self._owns(t, p):
                        added.append((t, p))
                self.counts[t] = n
        if added:
            log.info("%s#%d: new partitions %s, reading them from the beginning",
                     self.context.vertex_name, self.index, added)
            for tp in added:
                self.owned.append(tp)
                self.start_offsets[tp] = OFFSET_BEGINNING
                if self.et is not None:
                    self.et.add_partition(tp)
            self.consumer.incremental_assign(
                [TopicPartition(t, p, OFFSET_BEGINNING) for t, p in added])

    # --- snapshots ---------------------------------------------------------------------------

    def _positions(self) -> list:
        if not self.owned:
            return []
        from confluent_kafka import TopicPartition

        pos = self.consumer.position([TopicPartition(t, p) for t, p in self.owned])
        out = []
        tops = self.et.tops() if self.et is not None else {}
        for tpo in pos:
            tp = (tpo.topic, tpo.partition)
            off = tpo.offset if tpo.offset >= 0 else self.start_offsets.get(tp, OFFSET_BEGINNING)
            out.append([tp[0], tp[1], off, tops.get(tp)])
        return out

    def save_to_snapshot(self) -> bool:
        if not self.started:
            self._start()
        if self.dead_letters is not None and not self._dead_letters_acknowledged():
            return False  # a dead letter is durable before its offset is saved: called again
        if self.et is not None and not self.et.flush(self.outbox):
            return False  # records consumed before the barrier leave before it
        offsets = self._positions()
        if self.commit_group and self.context.processing_guarantee != "none":
            self.snapshot_offsets[self.context.snapshot_id] = offsets
        return self.outbox.offer_to_snapshot(
            *KafkaSourceEntries.offsets(self.index, offsets, self.counts))

    def _dead_letters_acknowledged(self) -> bool:
        """Whether the dead letters are acknowledged, checked without waiting; after 60 s of
        asking, the job restarts from its last snapshot."""
        if self.dead_letters.acknowledged():
            self._dead_letter_deadline = None
            return True
        now = time.monotonic()
        if self._dead_letter_deadline is None:
            self._dead_letter_deadline = now + 60.0
        elif now > self._dead_letter_deadline:
            self._dead_letter_deadline = None
            raise RestartableError(
                f"Sources.kafka(): the dead-letter topic {self.dead_letter_topic!r} did not "
                "acknowledge its records in 60 s; restarting from the last snapshot")
        return False

    def snapshot_commit_finish(self, success: bool) -> bool:
        sid = self.context.snapshot_id
        if not self.commit_group or self.context.processing_guarantee == "none":
            return True
        offsets = self.snapshot_offsets.pop(sid, None)
        for older in [s for s in self.snapshot_offsets if s < sid]:
            del self.snapshot_offsets[older]
        if success and offsets:
            from confluent_kafka import TopicPartition
            tps = [TopicPartition(t, p, o) for t, p, o, _ in offsets if o >= 0]
            if tps:
                try:
                    self.consumer.commit(offsets=tps, asynchronous=True)
                except Exception as e:  # noqa: BLE001 - only for lag visibility
                    log.debug("committing offsets to group failed: %s", e)
        return True

    def partition_lag(self) -> list[dict[str, Any]] | None:
        """Records behind the end of the log for every partition read here, from the high
        watermark the consumer last saw (cached: no broker call); a partition nothing was
        read from yet counts from where it starts. None before the consumer is made, or while
        it is closed or its partitions are being reassigned."""
        consumer, owned = self.consumer, list(self.owned)
        if consumer is None or not owned:
            return None
        try:
            from confluent_kafka import TopicPartition
            positions = consumer.position([TopicPartition(t, p) for t, p in owned])
            out = []
            for tpo in positions:
                _, hi = consumer.get_watermark_offsets(
                    TopicPartition(tpo.topic, tpo.partition), cached=True)
                pos = tpo.offset
                if pos < 0:  # nothing consumed yet from this partition: where it starts
                    pos = self.start_offsets.get((tpo.topic, tpo.partition), -1)
                known = hi is not None and hi >= 0 and pos >= 0
                out.append({"topic": tpo.topic, "partition": tpo.partition,
                            "position": pos if pos >= 0 else None,
                            "end": hi if hi is not None and hi >= 0 else None,
                            "lag": max(0, hi - pos) if known else None})
            return out
        except Exception:  # noqa: BLE001 - a closed consumer, a partition being reassigned
            return None

    def close(self) -> None:
        if self._poller is not None:
            self._poller.stop()
            self._poller = None
        if self.dead_letters is not None:
            self.dead_letters.close()
        if self.consumer is not None:
            try:
                self.consumer.close()
            except Exception:  # noqa: BLE001
                log.debug("consumer close failed", exc_info=True)
            self.consumer = None


class _Missing(Exception):
    def __init__(self, topics: list) -> None:
        super().__init__(f"missing topics {topics}")
        self.topics = topics


def _ends_after_records(msgs: list, errors: list, one_topic: bool) -> list[tuple[str, int]]:
    """The partitions whose end-of-partition event in ``msgs`` (``errors``: each message's
    error, None for a record) comes after every record of theirs in it: read to their end
    once these records are taken. The records after the first event are found and keyed by
    C-level maps (a dict of partition -> index keeps each partition's last record), so only
    the events take a Python step."""
    from confluent_kafka import KafkaError, Message

    n = len(msgs)
    at = list(compress(range(n), errors))  # the events' indices (few)
    first = at[0]
    after = list(compress(range(first, n), map(not_, errors[first:])))
    tail = list(map(msgs.__getitem__, after))
    parts: Any = map(Message.partition, tail) if one_topic else \
        zip(map(Message.topic, tail), map(Message.partition, tail))
    last = dict(zip(parts, after))  # each partition's last record (after the first event)
    ends: dict[tuple[str, int], None] = {}
    for i in at:
        m = msgs[i]
        if errors[i].code() == KafkaError._PARTITION_EOF:
            key = m.partition() if one_topic else (m.topic(), m.partition())
            if last.get(key, -1) < i:
                ends[(m.topic(), m.partition())] = None
    return list(ends)


def _short(b: Any, n: int = 60) -> str:
    r = repr(b)
    return r if len(r) <= n else r[:n - 3] + "..."


def projection_column(projection: Any) -> str | None:
    """The field of :class:`KafkaRecord` a projection ``operator.attrgetter(field)`` reads
    (None for any other projection): the source then takes that column of the chunk as its
    items, without making a record or calling anything per record."""
    if type(projection) is attrgetter:
        args = projection.__reduce__()[1]
        if len(args) == 1 and args[0] in RECORD_FIELDS:
            return str(args[0])
    return None


def _read_column(column: str, msgs: list, tss: list | None, kd: Callable | None,
                 vd: Callable | None) -> list:
    """One column of a chunk of messages, deserialized as a record's would be."""
    from confluent_kafka import Message

    if column == "value":
        return deserialize_all(vd, list(map(Message.value, msgs)))
    if column == "key":
        return deserialize_all(kd, list(map(Message.key, msgs)))
    if column == "timestamp":
        assert tss is not None  # read for this column
        return list(tss)
    if column == "headers":
        return [h or [] for h in map(Message.headers, msgs)]
    return list(map(getattr(Message, column), msgs))  # topic, partition, offset
