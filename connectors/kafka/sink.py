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
import time
from collections import deque
from itertools import repeat
from operator import itemgetter, length_hint
from typing import Any, Callable

from jetwake.engine.core.errors import JetwakeError, RestartableError
from jetwake.engine.core.processor import Inbox, Processor, ProcessorContext
from jetwake.connectors.kafka import reachability
from jetwake.connectors.kafka.properties import KafkaConfigError
from jetwake.connectors.kafka.serde import serialize_all
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


_first, _second = itemgetter(0), itemgetter(1)
_TUPLE = {tuple}
_TWO = {2}


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

    def keys_and_values(self, items: list) -> tuple[list, list]:
        """The serialized keys and values of ``items``. Without ``key_fn``/``value_fn`` a
        chunk of plain ``(key, value)`` tuples is split with C-level maps; each serializer
        runs over the whole chunk (:func:`~.serde.serialize_all`); a chunk without tuples has
        no key to split off."""
        kf, vf = self.key_fn, self.value_fn
        if kf is None and vf is None:
            types = set(map(type, items))
            if tuple not in types:  # no pair (dicts, strings...): values without key
                keys, values = [None] * len(items), items
            elif types == _TUPLE and set(map(len, items)) == _TWO:
                keys, values = list(map(_first, items)), list(map(_second, items))
            else:  # not every item is a pair: those that are not are values without key
                pairs = list(map(_default_split, items))
                keys, values = list(map(_first, pairs)), list(map(_second, pairs))
        else:
            keys = [None] * len(items) if kf is None else list(map(kf, items))
            values = items if vf is None else list(map(vf, items))
        return serialize_all(self.ks, keys), serialize_all(self.vs, values)

    def serialize(self, items: list) -> list:
        """``[key bytes, value bytes]`` per item."""
        keys, values = self.keys_and_values(items)
        return list(map(list, zip(keys, values)))

    def serialize_chunk(self, items: list) -> list:
        """``items`` as one chunk ``[keys, values]``: the serialized keys (None when no item
        has a key, the usual case) and values, two flat lists of bytes. The form the
        exactly-once sink keeps and saves in snapshots: no object per record, so keeping a
        snapshot interval's output costs the garbage collector nothing and msgpack packs a
        chunk as two arrays of bytes."""
        keys, values = self.keys_and_values(items)
        return [None if keys.count(None) == len(keys) else keys, values]

    def producer_conf(self) -> dict:
        """The user's producer properties with the sink's batching defaults, and librdkafka's
        "all brokers down" noted for ``jetwake.unreachable.timeout.ms`` (reachability.py)."""
        conf = dict(self.properties)
        conf.setdefault("linger.ms", 5)
        conf.setdefault("batch.num.messages", 10_000)
        conf.setdefault("queue.buffering.max.messages", 500_000)
        conf.setdefault("error_cb", reachability.error_callback(str(self.servers)))
        return conf

    def note_failure(self, error: BaseException) -> None:
        """A call to the brokers failed with ``error``: one that got no answer counts towards
        ``jetwake.unreachable.timeout.ms``; raises the permanent KafkaUnreachableError once
        the brokers have not answered for longer (the clock runs across the job's restarts)."""
        if reachability.is_no_answer(error):
            reachability.unanswered(str(self.servers))
        self.check_reachable()

    def check_reachable(self) -> None:
        """Raises KafkaUnreachableError when the brokers have not answered for longer than
        ``jetwake.unreachable.timeout.ms``."""
        reachability.check(str(self.servers), self.options[reachability.UNREACHABLE_OPTION],
                           self.where)

    def call_timeout(self, timeout: float) -> float:
        """``timeout`` for a blocking call, cut to what is left of
        ``jetwake.unreachable.timeout.ms`` (at least 0.5 s) while the brokers do not answer,
        so that a call does not outlast the bound by its own time-out."""
        left = reachability.time_left(str(self.servers),
                                      self.options[reachability.UNREACHABLE_OPTION])
        return timeout if left is None else min(timeout, max(0.5, left + 0.5))

    def note_answer(self) -> None:
        """The brokers answered (a commit, a delivery): the unreachable clock stops."""
        reachability.answered(str(self.servers))

    def client_conf(self) -> dict:
        """The connection properties (brokers, security) for a consumer or an admin client
        of the same cluster."""
        return {k: v for k, v in self.properties.items()
                if k in ("bootstrap.servers", "metadata.broker.list", "client.id")
                or k.startswith(("security.", "sasl.", "ssl."))}

    def produce_columns(self, producer: Any, keys: list | None, values: list,
                        start: int = 0) -> int:
        """Produces ``values[i]`` with ``keys[i]`` (``keys`` None: no key) from ``start`` on
        without waiting, then serves the producer's events once: returns the index of the
        first record the full producer queue refused, ``len(values)`` when it took them
        all."""
        done = self._produce_from(producer, keys, values, start)
        producer.poll(0)
        return done

    def _produce_from(self, producer: Any, keys: list | None, values: list, start: int) -> int:
        """``produce`` of each record from ``start`` on in one C-level loop (no Python step
        per record: about 90 ns a record less than a for loop calling produce, and no pair
        built per record); the index of the record the full queue refused, or
        ``len(values)``."""
        n = len(values)
        rest = iter(values[start:] if start else values)
        try:
            if keys is None:
                deque(map(producer.produce, repeat(self.topic), rest), 0)
            else:
                deque(map(producer.produce, repeat(self.topic), rest,
                          keys[start:] if start else keys), 0)
        except BufferError:
            return n - length_hint(rest) - 1  # the refused record was taken from ``rest``
        return n

    def produce_all(self, producer: Any, records: list, topic: str | None = None) -> None:
        """Produces every ``[key, value]`` record; waits for room when the producer's queue
        is full."""
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

    def produce_chunk(self, producer: Any, keys: list | None, values: list) -> None:
        """Produces a chunk made by :meth:`serialize_chunk` (``keys`` None: no key) in C-level
        loops (:meth:`_produce_from`); waits for room when the producer's queue is full.
        Serves no delivery reports otherwise: the caller polls once after its last chunk (a
        poll per chunk cost a tenth of the produce time)."""
        i, n = 0, len(values)
        while True:
            i = self._produce_from(producer, keys, values, i)
            if i >= n:
                return
            producer.poll(0.05)


class KafkaSinkProcessor(Processor):
    """The at-least-once Kafka sink: an idempotent producer, flushed at every snapshot.

    Cooperative: nothing here waits. What the producer's full queue refuses is kept (the
    backlog) and the inbox waits until it is taken; a snapshot's phase 1 and the end of the
    input ask ``flush(0)`` until every record is acknowledged, for at most
    ``jetwake.commit.retry.timeout.ms``."""

    def __init__(self, fmt: KafkaRecordFormat) -> None:
        self.fmt = fmt
        self.producer: Any = None
        self._errors: list[str] = []
        self._backlog: tuple[list | None, list, int] | None = None  # keys, values, next
        self._flush_deadline: float | None = None

    def is_cooperative(self) -> bool:
        return True

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
            if reachability.is_no_answer(err):
                reachability.unanswered(str(self.fmt.servers))
            self._errors.append(f"{err} (topic {msg.topic()}, partition {msg.partition()})")

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self._backlog is not None and not self._produce_backlog():
            return  # the producer's queue is still full: the inbox waits
        keys, values = self.fmt.serialize_chunk(inbox.drain())  # keys None: no key at all
        self.context.metrics["records_out"] += len(values)
        self._backlog = (keys, values, 0)
        self._produce_backlog()
        if self._errors:
            self._fail_on_errors()

    def _produce_backlog(self) -> bool:
        """Produces what is left of the backlog; True when nothing is left."""
        keys, values, start = self._backlog  # type: ignore[misc]
        done = self.fmt.produce_columns(self.producer, keys, values, start)
        self._backlog = None if done == len(values) else (keys, values, done)
        return self._backlog is None

    def try_process(self) -> bool:
        self.producer.poll(0)
        if self._errors:
            self._fail_on_errors()
        return self._backlog is None or self._produce_backlog()

    def snapshot_commit_prepare(self) -> bool:
        # every record received before the barrier is acknowledged before the snapshot counts
        return self._acknowledged()

    def complete(self) -> bool:
        return self._acknowledged()

    def _acknowledged(self) -> bool:
        """Whether every record received is produced and acknowledged, checked without
        waiting; after ``jetwake.commit.retry.timeout.ms`` of asking, the job restarts from
        its last snapshot."""
        if self._backlog is not None:
            self._produce_backlog()
        left = self.producer.flush(0)
        if self._errors:
            self._fail_on_errors()
        if self._backlog is None and not left:
            self._flush_deadline = None
            self.fmt.note_answer()
            return True
        self.fmt.check_reachable()
        now = time.monotonic()
        if self._flush_deadline is None:
            self._flush_deadline = now + self.fmt.options["jetwake.commit.retry.timeout.ms"] / 1000
        elif now > self._flush_deadline:
            self._flush_deadline = None
            raise RestartableError(
                f"{self.fmt.where}: {left} record(s) not acknowledged by {self.fmt.servers} "
                "in time; restarting from the last snapshot")
        return False

    def _fail_on_errors(self) -> None:
        self.fmt.check_reachable()
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
