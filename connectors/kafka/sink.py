"""The Kafka sinks: what both share, and the at-least-once sink (see docs/kafka.md).

At-least-once (:class:`KafkaSinkProcessor`)
    Records are produced as they arrive by an idempotent producer; at snapshot phase 1 the
    sink flushes, so every record received before the barrier is acknowledged before the
    snapshot can commit. A failed delivery restarts the job from its last snapshot.

Exactly-once (:class:`~.kafka_sink_exactly_once.KafkaExactlyOnceSinkProcessor`)
    A write-ahead log in the snapshot, written at phase 2 in one transaction with a marker
    record in a compacted topic (:mod:`.kafka_sink_markers`).

``Sinks.kafka`` picks one of the two when the job starts, from its processing guarantee and
the ``exactly_once`` argument. :class:`KafkaRecordFormat` holds what both need: the topic, the
properties, the record serialization and producing with backpressure.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from jetwake.engine.core.errors import JetwakeError, RestartableError
from jetwake.engine.core.processor import Inbox, Processor, ProcessorContext
from jetwake.connectors.kafka.properties import KafkaConfigError
from jetwake.connectors.kafka.client_log import with_client_log

__all__ = ["KafkaSinkProcessor", "KafkaRecordFormat", "KafkaSinkError", "transactional_id",
           "RESTART_MARGIN_MS", "check_transaction_timeout"]

log = logging.getLogger("jetwake.kafka")

RESTART_MARGIN_MS = 30_000
"""Time allowed for a member to restart and re-run a phase 2 (see docs/kafka.md)."""

BROKER_MAX_TXN_TIMEOUT_MS = 900_000  # Kafka's default transaction.max.timeout.ms


class KafkaSinkError(JetwakeError):
    """The Kafka sink cannot write: the brokers do not answer, a record is too large..."""


def transactional_id(job_id: str, vertex: str, index: int) -> str:
    """The transactional id of exactly-once sink processor ``index`` of stage ``vertex``."""
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


class KafkaRecordFormat:
    """What every Kafka sink processor of one ``Sinks.kafka`` needs: the topic, the checked
    properties and connector options, and how items become ``[key, value]`` records."""

    def __init__(self, topic: str, properties: dict, options: dict,
                 key_fn: Callable | None, value_fn: Callable | None,
                 key_serializer: Callable, value_serializer: Callable) -> None:
        self.topic = topic
        self.properties = properties
        self.options = options
        self.key_fn = key_fn
        self.value_fn = value_fn
        self.ks = key_serializer
        self.vs = value_serializer
        self.where = f"Sinks.kafka({topic!r})"

    @property
    def servers(self) -> Any:
        return self.properties.get("bootstrap.servers") or self.properties.get(
            "metadata.broker.list")

    def serialize(self, items: list) -> list:
        """``[key bytes, value bytes]`` per item."""
        ks, vs, kf, vf = self.ks, self.vs, self.key_fn, self.value_fn
        if kf is None and vf is None:
            return [[ks(k), vs(v)] for k, v in map(_default_split, items)]
        if kf is None:
            return [[None, vs(vf(x))] for x in items]
        if vf is None:
            return [[ks(kf(x)), vs(x)] for x in items]
        return [[ks(kf(x)), vs(vf(x))] for x in items]

    def producer_conf(self) -> dict:
        """The user's producer properties with the sink's batching defaults."""
        conf = dict(self.properties)
        conf.setdefault("linger.ms", 5)
        conf.setdefault("batch.num.messages", 10_000)
        conf.setdefault("queue.buffering.max.messages", 500_000)
        return conf

    def client_conf(self) -> dict:
        """The connection properties (brokers, security) for a consumer or an admin client
        of the same cluster."""
        return {k: v for k, v in self.properties.items()
                if k in ("bootstrap.servers", "metadata.broker.list", "client.id")
                or k.startswith(("security.", "sasl.", "ssl."))}

    def produce_all(self, producer: Any, records: list, topic: str | None = None) -> None:
        """Produces every record; waits for room when the producer's queue is full."""
        produce = producer.produce
        topic = topic or self.topic
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


class KafkaSinkProcessor(Processor):
    """The at-least-once Kafka sink: an idempotent producer, flushed at every snapshot."""

    def __init__(self, fmt: KafkaRecordFormat) -> None:
        self.fmt = fmt
        self.producer: Any = None
        self._errors: list[str] = []

    def is_cooperative(self) -> bool:
        return False

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        from confluent_kafka import Producer

        conf = self.fmt.producer_conf()
        conf["delivery.report.only.error"] = True
        conf["on_delivery"] = self._on_delivery
        self.producer = Producer(with_client_log(conf))
        context.metrics.setdefault("records_out", 0)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{err} (topic {msg.topic()}, partition {msg.partition()})")

    def process(self, ordinal: int, inbox: Inbox) -> None:
        records = self.fmt.serialize(inbox.drain())
        self.context.metrics["records_out"] += len(records)
        self.fmt.produce_all(self.producer, records)
        if self._errors:
            self._fail_on_errors()

    def try_process(self) -> bool:
        self.producer.poll(0)
        if self._errors:
            self._fail_on_errors()
        return True

    def snapshot_commit_prepare(self) -> bool:
        # every record received before the barrier is acknowledged before the snapshot counts
        self._flush()
        return True

    def complete(self) -> bool:
        self._flush()
        return True

    def _flush(self) -> None:
        left = self.producer.flush(self.fmt.options["jetwake.commit.retry.timeout.ms"] / 1000)
        if self._errors:
            self._fail_on_errors()
        if left:
            raise RestartableError(
                f"{self.fmt.where}: {left} record(s) not acknowledged by {self.fmt.servers} "
                "in time; restarting from the last snapshot")

    def _fail_on_errors(self) -> None:
        errs, self._errors = self._errors, []
        raise RestartableError(
            f"{self.fmt.where}: {len(errs)} record(s) could not be delivered ({errs[:3]}); "
            "restarting from the last snapshot")

    def close(self) -> None:
        p, self.producer = self.producer, None
        if p is not None:
            try:
                p.flush(5)
                p.close()
            except Exception:  # noqa: BLE001 - closing after a failure
                log.debug("producer close failed", exc_info=True)


def snapshot_interval_ms(context: ProcessorContext) -> int:
    """The job's snapshot interval from the processor's context (the default 10 s when the
    context has none, as for a processor driven by hand)."""
    return context.snapshot_interval_ms or 10_000
