"""The Kafka sinks: at-least-once (idempotent producer) and exactly-once (DESIGN.md §5).

At-least-once
    Records are produced as they arrive by an idempotent producer; at snapshot phase 1 the
    sink flushes, so every record received before the barrier is acknowledged before the
    snapshot can commit. A failed delivery restarts the job from its last snapshot.

Exactly-once
    librdkafka cannot resume a transaction after a crash, so the records a sink processor
    received since the last snapshot are part of that snapshot (a write-ahead log). Phase 2
    of snapshot N writes them in one Kafka transaction that also commits a marker: the offset
    N+1 of a consumer group dedicated to the processor (group id = its transactional id) on
    partition 0 of the sink's topic, through ``send_offsets_to_transaction``. After a restore
    from snapshot N the processor first fences its transactional id (``init_transactions``,
    which aborts or completes what an earlier incarnation left open), then reads its marker:
    below N+1 it re-runs N's phase 2 from the saved records; at N+1 there is nothing to do.
    A ``read_committed`` consumer then sees every record exactly once, whenever the member
    dies.

    Transactional ids are ``jetwake-<job id>-<stage>-<processor index>``. Saved records travel
    under a ``BroadcastKey``; processor ``i`` of ``n`` handles the entries of the old indices
    ``j`` with ``j % n == i``, so a job restored with a lower parallelism re-runs (or skips)
    the phase 2 of every old processor, and fences every transactional id up to the highest
    parallelism the job ever had.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ..engine.errors import JetwakeError, RestartableError
from ..engine.processor import BroadcastKey, Inbox, Processor, ProcessorContext
from .kafka_properties import KafkaConfigError

__all__ = ["KafkaSinkProcessor", "KafkaSinkError", "transactional_id",
           "RESTART_MARGIN_MS", "check_transaction_timeout"]

log = logging.getLogger("jetwake.kafka")

RESTART_MARGIN_MS = 30_000
"""Time allowed for a member to restart and re-run a phase 2 (see docs/kafka.md)."""

BROKER_MAX_TXN_TIMEOUT_MS = 900_000  # Kafka's default transaction.max.timeout.ms


class KafkaSinkError(JetwakeError):
    """The Kafka sink cannot write: the brokers do not answer, a record is too large..."""


def transactional_id(job_id: str, vertex: str, index: int) -> str:
    return f"jetwake-{job_id}-{vertex}-{index}"


def check_transaction_timeout(txn_timeout_ms: int | None, snapshot_interval_ms: int,
                              where: str = "Sinks.kafka()") -> int:
    """The ``transaction.timeout.ms`` to use; raises KafkaConfigError when the given one is
    too small for the snapshot interval.

    A transaction is open only during phase 2, but phase 2 writes everything received in one
    snapshot interval, and a member that dies inside it leaves the transaction open (blocking
    ``read_committed`` readers) until the restarted job fences it or the broker times it out.
    So the timeout must exceed the snapshot interval plus a restart margin, otherwise a slow
    phase 2 is aborted by the broker (and retried after a restart) again and again.
    """
    need = snapshot_interval_ms + RESTART_MARGIN_MS
    if txn_timeout_ms is None:
        return min(max(60_000, 2 * snapshot_interval_ms + RESTART_MARGIN_MS),
                   max(BROKER_MAX_TXN_TIMEOUT_MS, need))
    if txn_timeout_ms < need:
        raise KafkaConfigError(
            f"{where}: transaction.timeout.ms={txn_timeout_ms} is too small for "
            f"snapshot_interval_ms={snapshot_interval_ms}: it must be at least the snapshot "
            f"interval plus a restart margin of {RESTART_MARGIN_MS} ms ({need} ms), because "
            "one transaction writes a whole interval's records; raise it (the broker's "
            "transaction.max.timeout.ms, 15 min by default, is the upper bound) or take "
            "snapshots more often")
    return txn_timeout_ms


def _default_split(item: Any) -> tuple[Any, Any]:
    if type(item) is tuple and len(item) == 2:
        return item
    return None, item


class KafkaSinkProcessor(Processor):
    def __init__(self, topic: str, properties: dict, options: dict,
                 key_fn: Callable | None, value_fn: Callable | None,
                 key_serializer: Callable, value_serializer: Callable,
                 exactly_once: bool | None) -> None:
        self.topic = topic
        self.properties = properties
        self.options = options
        self.key_fn = key_fn
        self.value_fn = value_fn
        self.ks = key_serializer
        self.vs = value_serializer
        self.exactly_once = exactly_once
        self.producer: Any = None
        self.transactional = False
        self.pending: list = []                 # [key, value] received since the last snapshot
        self.prepared: dict[int, list] = {}     # snapshot id -> records for its phase 2
        self.restored: list = []                # saved entries this processor must settle
        self.max_parallelism = 0
        self.started = False
        self._errors: list[str] = []
        self._consumers: dict[str, Any] = {}

    def is_cooperative(self) -> bool:
        return False

    # --- start -------------------------------------------------------------------------------

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        from confluent_kafka import Producer

        self.index = context.global_processor_index
        self.total = context.total_parallelism
        self.max_parallelism = max(self.total, self.options["jetwake.fence.parallelism"])
        guarantee = context.processing_guarantee
        if self.exactly_once is None:
            self.transactional = guarantee == "exactly_once"
        elif self.exactly_once:
            self.transactional = guarantee == "exactly_once"
            if not self.transactional:
                log.warning("Sinks.kafka(%r, exactly_once=True) in a job with processing "
                            "guarantee %r: writing at-least-once (transactions need the job's "
                            "exactly_once snapshots)", self.topic, guarantee)
        self.txn_id = transactional_id(context.job_id, context.vertex_name, self.index)
        self.timeout_s = self.options["jetwake.startup.timeout.ms"] / 1000
        conf = dict(self.properties)
        conf.setdefault("linger.ms", 5)
        conf.setdefault("batch.num.messages", 10_000)
        conf.setdefault("queue.buffering.max.messages", 500_000)
        if self.transactional:
            interval = _snapshot_interval(context)
            conf["transaction.timeout.ms"] = check_transaction_timeout(
                conf.get("transaction.timeout.ms"), interval)
            self.txn_conf = dict(conf)
            conf["transactional.id"] = self.txn_id
        else:
            conf["delivery.report.only.error"] = True
            conf["on_delivery"] = self._on_delivery
        self.producer = Producer(conf)
        context.metrics.setdefault("records_out", 0)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{err} (topic {msg.topic()}, partition {msg.partition()})")

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for key, value in inbox.drain():
            if not (type(key) is BroadcastKey and type(key.key) is tuple
                    and key.key[:1] == ("kafka-sink",)):
                continue
            sid, txn_id, old_index, old_total, max_par, records = value
            self.max_parallelism = max(self.max_parallelism, max_par, old_total)
            if old_index % self.total == self.index:
                self.restored.append((old_index, txn_id, sid, records))

    def _ensure_started(self) -> None:
        """Fences the transactional ids this processor is responsible for and settles the
        phase 2 of the restored snapshot (runs once, after any restore)."""
        if self.started:
            return
        self.started = True
        if not self.transactional:
            return
        self._init_transactions(self.producer, self.txn_id)
        settled = {self.index}
        for old_index, txn_id, sid, records in sorted(self.restored):
            if old_index == self.index:
                self._settle(self.producer, txn_id, sid, records)
            else:
                p = self._new_txn_producer(txn_id)
                self._settle(p, txn_id, sid, records)
                p.close()
            settled.add(old_index)
        self.restored = []
        # ids of a higher parallelism that left no entry here: fence them (aborts leftovers)
        prefix = self.txn_id[:self.txn_id.rfind("-") + 1]
        for j in range(self.total, self.max_parallelism):
            if j % self.total == self.index and j not in settled:
                p = self._new_txn_producer(f"{prefix}{j}")
                p.close()

    def _new_txn_producer(self, txn_id: str) -> Any:
        from confluent_kafka import Producer

        conf = dict(self.txn_conf)
        conf["transactional.id"] = txn_id
        p = Producer(conf)
        self._init_transactions(p, txn_id)
        return p

    def _init_transactions(self, producer: Any, txn_id: str) -> None:
        from confluent_kafka import KafkaError, KafkaException

        deadline = time.monotonic() + self.timeout_s
        delay = 0.1
        while True:
            try:
                producer.init_transactions(min(30.0, self.timeout_s))
                return
            except KafkaException as e:
                err = e.args[0]
                if err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                    raise KafkaConfigError(
                        f"Sinks.kafka({self.topic!r}): the broker refuses "
                        f"transaction.timeout.ms={self.txn_conf['transaction.timeout.ms']}: it "
                        "exceeds the broker's transaction.max.timeout.ms; lower it (and the "
                        "snapshot interval) or raise the broker's limit") from None
                if err.fatal() or time.monotonic() + delay > deadline:
                    raise KafkaSinkError(
                        f"Sinks.kafka({self.topic!r}): init_transactions for {txn_id!r} "
                        f"failed on {self.properties.get('bootstrap.servers')} after "
                        f"{self.timeout_s:.0f} s (jetwake.startup.timeout.ms): {err}") from None
                log.warning("init_transactions(%s): %s; retrying", txn_id, err)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _marker_consumer(self, txn_id: str) -> Any:
        c = self._consumers.get(txn_id)
        if c is None:
            from confluent_kafka import Consumer

            conf = {k: v for k, v in self.properties.items()
                    if k in ("bootstrap.servers", "metadata.broker.list", "client.id")
                    or k.startswith(("security.", "sasl.", "ssl."))}
            conf.update({"group.id": txn_id, "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
            c = Consumer(conf)
            self._consumers[txn_id] = c
        return c

    def _read_marker(self, txn_id: str) -> int:
        from confluent_kafka import TopicPartition

        c = self._marker_consumer(txn_id)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                tp = c.committed([TopicPartition(self.topic, 0)], timeout=10)[0]
                return tp.offset
            except Exception as e:  # noqa: BLE001
                if time.monotonic() > deadline:
                    raise KafkaSinkError(f"Sinks.kafka({self.topic!r}): cannot read the "
                                         f"snapshot marker of {txn_id!r}: {e}") from e
                time.sleep(0.2)

    def _settle(self, producer: Any, txn_id: str, sid: int, records: list) -> None:
        marker = self._read_marker(txn_id)
        if marker < sid + 1:
            log.info("%s: snapshot %d was not committed to Kafka (marker %d): committing its "
                     "%d records now", txn_id, sid, marker, len(records))
            self._commit(producer, txn_id, records, sid)

    # --- writing -----------------------------------------------------------------------------

    def _serialize(self, items: list) -> list:
        ks, vs, kf, vf = self.ks, self.vs, self.key_fn, self.value_fn
        if kf is None and vf is None:
            pairs = map(_default_split, items)
            return [[ks(k), vs(v)] for k, v in pairs]
        if kf is None:
            return [[None, vs(vf(x))] for x in items]
        if vf is None:
            return [[ks(kf(x)), vs(x)] for x in items]
        return [[ks(kf(x)), vs(vf(x))] for x in items]

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self.started:
            self._ensure_started()
        records = self._serialize(inbox.drain())
        self.context.metrics["records_out"] += len(records)
        if self.transactional:
            self.pending.extend(records)
            return
        self._produce_all(self.producer, records)
        if self._errors:
            self._fail_on_errors()

    def _produce_all(self, producer: Any, records: list) -> None:
        produce = producer.produce
        topic = self.topic
        i, n = 0, len(records)
        while i < n:
            try:
                for i in range(i, n):  # noqa: B020 - resumes at the refused record
                    k, v = records[i]
                    produce(topic, v, k)
                i = n
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)

    def _fail_on_errors(self) -> None:
        errs, self._errors = self._errors, []
        raise RestartableError(
            f"Sinks.kafka({self.topic!r}): {len(errs)} record(s) could not be delivered "
            f"({errs[:3]}); restarting from the last snapshot")

    def try_process(self) -> bool:
        if not self.started:
            self._ensure_started()
        if self.producer is not None:
            self.producer.poll(0)
        if self._errors:
            self._fail_on_errors()
        return True

    # --- snapshots ---------------------------------------------------------------------------

    def save_to_snapshot(self) -> bool:
        if not self.started:
            self._ensure_started()
        if not self.transactional:
            return True
        snap = self.context.snapshot
        sid = snap.requested_id if snap is not None else -1
        records = self.pending
        self.pending = []
        self.prepared[sid] = records
        return self.outbox.offer_to_snapshot(
            BroadcastKey(("kafka-sink", self.index)),
            [sid, self.txn_id, self.index, self.total, self.max_parallelism, records])

    def snapshot_commit_prepare(self) -> bool:
        if not self.transactional:
            self._flush()
        return True

    def _flush(self) -> None:
        left = self.producer.flush(self.options["jetwake.commit.retry.timeout.ms"] / 1000)
        if self._errors:
            self._fail_on_errors()
        if left:
            raise RestartableError(
                f"Sinks.kafka({self.topic!r}): {left} record(s) not acknowledged by "
                f"{self.properties.get('bootstrap.servers')} in time; restarting from the "
                "last snapshot")

    def snapshot_commit_finish(self, success: bool) -> bool:
        if not self.transactional:
            return True
        sid = self.context.snapshot.phase2_id  # type: ignore[union-attr]
        records = self.prepared.pop(sid, None)
        if records is None:
            return True
        if not success:  # the snapshot failed: its records go into the next one
            self.pending[:0] = records
            return True
        if records:
            self._commit(self.producer, self.txn_id, records, sid)
        return True

    def _commit(self, producer: Any, txn_id: str, records: list, sid: int | None) -> None:
        """Writes ``records`` and the marker ``sid + 1`` in one transaction. A fatal error
        (fenced) or one that outlasts the retry time restarts the job from its snapshot,
        whose restore re-runs this commit."""
        from confluent_kafka import KafkaException, TopicPartition

        limit = self.options["jetwake.commit.retry.timeout.ms"] / 1000
        deadline = time.monotonic() + limit
        delay = 0.1
        while True:
            try:
                producer.begin_transaction()
                self._produce_all(producer, records)
                if sid is not None:
                    gm = self._marker_consumer(txn_id).consumer_group_metadata()
                    self._retry(lambda: _bounded(lambda: producer.send_offsets_to_transaction(
                        [TopicPartition(self.topic, 0, sid + 1)], gm, CALL_TIMEOUT_S),
                        txn_id, "send_offsets_to_transaction"), deadline)
                self._retry(lambda: _bounded(lambda: producer.commit_transaction(
                    CALL_TIMEOUT_S), txn_id, "commit_transaction"), deadline)
                return
            except _Stuck:
                _ABANDONED.append(producer)
                if producer is self.producer:
                    self.producer = None
                raise
            except KafkaException as e:
                err = e.args[0]
                if err.fatal():
                    raise RestartableError(
                        f"Sinks.kafka({self.topic!r}): producer {txn_id} failed fatally "
                        f"({err}); restarting the job from its last snapshot") from None
                if time.monotonic() + delay > deadline:
                    raise RestartableError(
                        f"Sinks.kafka({self.topic!r}): committing snapshot {sid} failed for "
                        f"{limit:.0f} s ({err}); restarting the job from its last "
                        "snapshot") from None
                log.warning("%s: transaction of snapshot %s failed (%s); aborting and "
                            "retrying", txn_id, sid, err)
                try:
                    producer.abort_transaction(30)
                except KafkaException as e2:
                    if e2.args[0].fatal():
                        raise RestartableError(f"{txn_id}: {e2.args[0]}") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    @staticmethod
    def _retry(call: Callable[[], Any], deadline: float) -> None:
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

    # --- end ---------------------------------------------------------------------------------

    def complete(self) -> bool:
        if not self.started:
            self._ensure_started()
        if self.transactional:
            # the input ended: nothing can replay what is pending, commit it all now
            records = [r for sid in sorted(self.prepared) for r in self.prepared.pop(sid)]
            records += self.pending
            self.pending = []
            if records:
                self._commit(self.producer, self.txn_id, records, None)
        else:
            self._flush()
        return True

    def close(self) -> None:
        for c in self._consumers.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        self._consumers = {}
        p, self.producer = self.producer, None
        if p is not None:
            try:
                if not self.transactional:
                    p.flush(5)
                p.close()
            except Exception:  # noqa: BLE001 - closing after a failure
                log.debug("producer close failed", exc_info=True)


CALL_TIMEOUT_S = 20.0


def _bounded(call: Callable[[], Any], txn_id: str, what: str) -> None:
    """Runs a transactional call with a hard time limit. librdkafka can block in
    ``send_offsets_to_transaction`` past its timeout when the group coordinator went away
    (a broker restart; librdkafka issues #5456, #5511); a fresh producer does not have the
    problem, so a call that does not return restarts the job, whose restore fences the stuck
    producer and re-runs the phase 2 from the snapshot."""
    box: list = []

    def run() -> None:
        try:
            call()
            box.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box.append(e)

    t = threading.Thread(target=run, daemon=True, name=f"jetwake-kafka-{what}")
    t.start()
    t.join(CALL_TIMEOUT_S + 5)
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


def _snapshot_interval(context: ProcessorContext) -> int:
    member = context.member
    try:
        job = member.get_job(context.job_id) if member is not None else None
        if job is not None:
            return int(job.config.snapshot_interval_ms)
    except Exception:  # noqa: BLE001 - fall back to the default interval
        pass
    return 10_000
