"""The exactly-once Kafka sink: a write-ahead log in the snapshot, written in one transaction
with a marker (see docs/kafka.md and :mod:`jetwake.engine.processors.two_phase_sink`).

librdkafka cannot resume a transaction after a crash, so no transaction stays open between
snapshots. The records a processor received since the last snapshot are part of that
snapshot; phase 2 of snapshot N writes them in one transaction that also writes the marker
record "N" under the processor's transactional id in the compacted markers topic
(:mod:`.kafka_sink_markers`). After a restore from N the processor first fences its
transactional id (``init_transactions``, which aborts or completes what an earlier
incarnation left open), then reads its marker: below N it writes N's saved records again in
one transaction with the marker; at N there is nothing to do. A ``read_committed`` consumer
then sees every record exactly once, whenever the member dies.

Transactional ids are ``jetwake-<job id>-<stage>-<processor index>``. Processor ``i`` of
``n`` settles the saved batches of the old indices ``j`` with ``j % n == i`` with a producer
of that old transactional id, and fences every id up to the highest parallelism the job ever
had, so a job restored with a lower parallelism leaves nothing open.
"""

from __future__ import annotations

import logging
import threading
import time
from operator import itemgetter
from typing import Any, Callable

from jetwake.engine.core.errors import RestartableError
from jetwake.engine.core.processor import ProcessorContext
from jetwake.engine.processors.two_phase_sink import NO_MARKER, SavedBatch, TwoPhaseCommitSink
from jetwake.connectors.kafka.properties import KafkaConfigError
from jetwake.connectors.kafka.reachability import KafkaUnreachableError
from jetwake.connectors.kafka.sink import (
    KafkaRecordFormat, KafkaSinkError, check_transaction_timeout, snapshot_interval_ms,
    transactional_id,
)
from jetwake.connectors.kafka.sink_markers import KafkaMarkerTopic, retrying
from jetwake.connectors.kafka.client_log import with_client_log

__all__ = ["KafkaExactlyOnceSinkProcessor", "CALL_TIMEOUT_S"]

log = logging.getLogger("jetwake.kafka")

CALL_TIMEOUT_S = 20.0
SNAPSHOT_PART_RECORDS = 4096  # records per saved entry (see snapshot_parts)
PHASE2_LINGER_MS = 100
"""The transactional producer's ``linger.ms`` unless the properties set one. Phase 2 produces
a whole snapshot's records at once and ``commit_transaction`` sends what lingers at once, so
lingering delays nothing; with the at-least-once sink's 5 ms, librdkafka's broker thread
often spun on ``poll()`` while the batches filled (on this machine up to 500,000 calls and
0.4-0.7 us of that thread's CPU a record in a phase 2 of 368,000 records; with 100 ms a few
thousand calls and about 0.15 us)."""


class KafkaExactlyOnceSinkProcessor(TwoPhaseCommitSink):
    """Writes each snapshot's records at its phase 2, in one transaction with its marker."""

    snapshot_tag = "kafka-sink"

    def __init__(self, fmt: KafkaRecordFormat) -> None:
        self.fmt = fmt
        self.producer: Any = None
        self.markers: KafkaMarkerTopic | None = None
        self._others: dict[str, Any] = {}    # producers of old ids while they are settled
        self._settles: set[int] = set()      # old processor indices this processor settles
        self.max_parallelism = 0

    def is_cooperative(self) -> bool:
        return False

    # --- start -------------------------------------------------------------------------------

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        from confluent_kafka import Producer

        opts = self.fmt.options
        self.index = context.global_processor_index
        self.total = context.total_parallelism
        self.max_parallelism = max(self.total, opts["jetwake.fence.parallelism"])
        self.txn_id = transactional_id(context.job_id, context.vertex_name, self.index)
        self.timeout_s = opts["jetwake.startup.timeout.ms"] / 1000
        conf = self.fmt.producer_conf()
        if not {"linger.ms", "queue.buffering.max.ms"} & set(self.fmt.properties):
            conf["linger.ms"] = PHASE2_LINGER_MS
        conf["transaction.timeout.ms"] = check_transaction_timeout(
            conf.get("transaction.timeout.ms"), snapshot_interval_ms(context), self.fmt.where)
        self.txn_conf = dict(conf)
        conf["transactional.id"] = self.txn_id
        self.producer = Producer(with_client_log(conf))
        self.markers = KafkaMarkerTopic(opts["jetwake.markers.topic"], self.fmt.client_conf(),
                                        self.timeout_s, self.fmt.where, self.fmt.note_failure)
        context.metrics.setdefault("records_out", 0)

    def on_restored(self, batch: SavedBatch) -> None:
        self.max_parallelism = max(self.max_parallelism, batch.extra or 0, batch.parallelism)
        if batch.writer_index % self.total == self.index:
            self._settles.add(batch.writer_index)

    def start(self) -> None:
        """Makes sure the markers topic exists, fences this processor's transactional id and
        those of a higher parallelism that left no saved batch (their batches, if any, are
        settled, and so fenced, by settle_writer)."""
        self.markers.ensure()  # type: ignore[union-attr]
        self._init_transactions(self.producer, self.txn_id)
        prefix = self.txn_id[:self.txn_id.rfind("-") + 1]
        for j in range(self.total, self.max_parallelism):
            if j % self.total == self.index and j not in self._settles:
                _close(self._new_txn_producer(f"{prefix}{j}"))

    def settle_writer(self, writer: str, batches: list[SavedBatch]) -> None:
        if writer == self.txn_id:
            super().settle_writer(writer, batches)
            return
        producer = self._new_txn_producer(writer)  # fences that old processor's producer
        self._others[writer] = producer
        try:
            super().settle_writer(writer, batches)
        finally:
            if self._others.pop(writer, None) is not None:
                _close(producer)

    def _new_txn_producer(self, txn_id: str) -> Any:
        from confluent_kafka import Producer

        conf = dict(self.txn_conf)
        conf["transactional.id"] = txn_id
        p = Producer(with_client_log(conf))
        self._init_transactions(p, txn_id)
        return p

    def _init_transactions(self, producer: Any, txn_id: str) -> None:
        from confluent_kafka import KafkaError, KafkaException

        def call() -> None:
            try:
                producer.init_transactions(self.fmt.call_timeout(min(30.0, self.timeout_s)))
            except KafkaException as e:
                err = e.args[0]
                if err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                    raise KafkaConfigError(
                        f"{self.fmt.where}: the broker refuses transaction.timeout.ms="
                        f"{self.txn_conf['transaction.timeout.ms']}: it exceeds the broker's "
                        "transaction.max.timeout.ms; lower it (and the snapshot interval) or "
                        "raise the broker's limit") from None
                if err.fatal():
                    raise KafkaSinkError(f"{self.fmt.where}: init_transactions for "
                                         f"{txn_id!r} failed: {err}") from None
                log.warning("init_transactions(%s): %s; retrying", txn_id, err)
                raise
        retrying(call, self.timeout_s, f"{self.fmt.where}: init_transactions for {txn_id!r} "
                 f"failed on {self.fmt.servers}", self.fmt.note_failure)
        self.fmt.note_answer()

    # --- records and markers -----------------------------------------------------------------

    def writer_id(self) -> str:
        return self.txn_id

    def snapshot_extra(self) -> Any:
        return self.max_parallelism

    def to_records(self, items: list) -> list:
        """One chunk ``[keys or None, values]`` per inbox drain (see serialize_chunk): the
        snapshot holds two flat lists of bytes per chunk, not one list per record."""
        if not items:
            return []
        chunk = self.fmt.serialize_chunk(items)
        self.context.metrics["records_out"] += len(chunk[1])
        return [chunk]

    def snapshot_parts(self, records: list) -> list[list]:
        """Chunks gathered into parts of at least SNAPSHOT_PART_RECORDS records (about a
        megabyte of JSON records): encoding an interval's output as one frame of tens of
        megabytes cost 2 to 5 times as much CPU as in parts (the packer's growing buffer, the
        page faults of huge allocations)."""
        parts: list[list] = [[]]
        n = 0
        for chunk in records:
            if n >= SNAPSHOT_PART_RECORDS:
                parts.append([])
                n = 0
            parts[-1].append(chunk)
            n += len(chunk[1]) if type(chunk[1]) is list else 1
        return parts

    def record_count(self, records: list) -> int:
        return sum(len(values) for _, values in _chunks(records))

    def read_marker(self, writer: str) -> int:
        marker = self.markers.read(writer)  # type: ignore[union-attr]
        return marker if marker is not None else self._group_offset_marker(writer)

    def _group_offset_marker(self, writer: str) -> int:
        """The marker as earlier versions kept it: the offset N+1 committed on partition 0 of
        the sink's topic by the consumer group named like the transactional id. Read only
        when the markers topic has none for ``writer`` (a job saved by an earlier version);
        such offsets expire, which is why markers moved to a compacted topic."""
        from confluent_kafka import Consumer, TopicPartition

        conf = self.fmt.client_conf()
        conf.update({"group.id": writer, "enable.auto.commit": False,
                     "isolation.level": "read_committed"})
        c = Consumer(with_client_log(conf))
        try:
            tp = retrying(lambda: c.committed([TopicPartition(self.fmt.topic, 0)],
                                              timeout=10)[0], self.timeout_s,
                          f"{self.fmt.where}: could not read the group offsets of {writer!r}")
        finally:
            c.close()
        return tp.offset - 1 if tp.offset > 0 else NO_MARKER

    def commit(self, writer: str, marker: int | None, records: list) -> None:
        """Writes ``records`` and ``writer``'s marker in one transaction. A fatal error
        (fenced) or one that outlasts the retry time restarts the job from its snapshot,
        whose restore writes them again unless the marker says they are written."""
        from confluent_kafka import KafkaException

        producer = self.producer if writer == self.txn_id else self._others[writer]
        limit = self.fmt.options["jetwake.commit.retry.timeout.ms"] / 1000
        deadline = time.monotonic() + limit
        delay = 0.1
        while True:
            try:
                producer.begin_transaction()
                for keys, values in _chunks(records):
                    self.fmt.produce_chunk(producer, keys, values)
                producer.poll(0)
                if marker is not None:
                    self.markers.produce(producer, writer, marker,  # type: ignore[union-attr]
                                         self.fmt.topic)
                _retry(lambda: _bounded(lambda: producer.commit_transaction(CALL_TIMEOUT_S),
                                        writer, "commit_transaction",
                                        self.fmt.check_reachable), deadline)
                self.fmt.note_answer()
                return
            except (_Stuck, KafkaUnreachableError):  # a call may still be in flight on it
                _ABANDONED.append(producer)
                if producer is self.producer:
                    self.producer = None
                self._others.pop(writer, None)
                self.fmt.note_failure(TimeoutError())
                raise
            except KafkaException as e:
                self.fmt.note_failure(e)
                err = e.args[0]
                if err.fatal():
                    raise RestartableError(
                        f"{self.fmt.where}: producer {writer} failed fatally ({err}); "
                        "restarting the job from its last snapshot") from None
                if time.monotonic() + delay > deadline:
                    raise RestartableError(
                        f"{self.fmt.where}: committing snapshot {marker} failed for "
                        f"{limit:.0f} s ({err}); restarting the job from its last "
                        "snapshot") from None
                log.warning("%s: transaction of snapshot %s failed (%s); aborting and "
                            "retrying", writer, marker, err)
                try:
                    producer.abort_transaction(30)
                except KafkaException as e2:
                    if e2.args[0].fatal():
                        raise RestartableError(f"{writer}: {e2.args[0]}") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    # --- end ---------------------------------------------------------------------------------

    def close(self) -> None:
        if self.markers is not None:
            self.markers.close()
        for p in self._others.values():
            _close(p)
        self._others = {}
        p, self.producer = self.producer, None
        if p is not None:
            _close(p)


def _chunks(records: list) -> list[tuple[list | None, list]]:
    """The ``(keys, values)`` chunks of saved ``records``. They are chunks ``[keys or None,
    [value, ...]]``; a snapshot saved by an earlier version holds ``[key, value]`` pairs
    (their value is bytes or None, never a list), which are gathered into chunks in order."""
    out: list[tuple[list | None, list]] = []
    pairs: list = []
    for r in records:
        if type(r[1]) is list:
            if pairs:
                out.append((list(map(_first, pairs)), list(map(_second, pairs))))
                pairs = []
            out.append((r[0], r[1]))
        else:
            pairs.append(r)
    if pairs:
        out.append((list(map(_first, pairs)), list(map(_second, pairs))))
    return out


_first, _second = itemgetter(0), itemgetter(1)


def _close(producer: Any) -> None:
    try:
        producer.close()
    except Exception:  # noqa: BLE001 - closing after a failure
        log.debug("producer close failed", exc_info=True)


def _retry(call: Callable[[], Any], deadline: float) -> None:
    """Retries a transactional call while it fails with a retriable error, until
    ``deadline``."""
    from confluent_kafka import KafkaException

    delay = 0.05
    while True:
        try:
            call()
            return
        except KafkaException as e:
            err = e.args[0]
            if not err.retriable() or time.monotonic() + delay > deadline:
                raise
            log.warning("Sinks.kafka(): %s (retrying)", err)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _bounded(call: Callable[[], Any], txn_id: str, what: str,
             waiting: Callable[[], None] = lambda: None) -> None:
    """Runs a transactional call with a hard time limit. librdkafka can block in a
    transactional call past its timeout when its coordinator went away (a broker restart;
    librdkafka issues #5456, #5511); a fresh producer does not have the problem, so a call
    that does not return restarts the job, whose restore fences the stuck producer and
    re-runs the phase 2 from the snapshot. ``waiting`` is called while the call runs and
    may end the wait by raising (brokers unreachable for longer than their bound)."""
    box: list = []

    def run() -> None:
        try:
            call()
            box.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box.append(e)

    t = threading.Thread(target=run, daemon=True, name=f"jetwake-kafka-{what}")
    t.start()
    until = time.monotonic() + CALL_TIMEOUT_S + 5
    while not box and time.monotonic() < until:
        t.join(0.1)
        if not box:
            waiting()
    if not box:
        raise _Stuck(
            f"Sinks.kafka(): {what} of {txn_id} did not return within {CALL_TIMEOUT_S + 5:.0f} "
            "s (librdkafka lost the coordinator); restarting the job from its last snapshot")
    if box[0] is not None:
        raise box[0]


class _Stuck(RestartableError):
    """A librdkafka call that does not return: its producer must not be closed (destroying
    it would wait for the stuck call), only abandoned."""


_ABANDONED: list = []  # stuck producers, kept referenced so that nothing destroys them
