"""Where the exactly-once Kafka sink keeps its markers: a compacted topic.

A marker says "the records of snapshot N of this sink processor are written". It is one
record in the markers topic (``jetwake.markers.topic``, ``__jetwake_sink_markers`` by
default): key the processor's transactional id, value ``{"snapshot_id": N, "topic": ...}``,
produced inside the transaction that writes the snapshot's records, so it is visible to a
``read_committed`` reader exactly when they are. The topic is compacted: Kafka keeps the
latest record of every key for ever, however long a job stays suspended. (Consumer-group
offsets, the obvious alternative, are deleted ``offsets.retention.minutes`` after the group
went empty: 7 days by default.)

All markers go to partition 0, so a reader knows where to look. A reader wants the latest
record of one key: it scans backwards from the end of the partition in growing spans,
reading each span up to its end with ``read_committed`` (so an aborted marker is never
seen), and stops at the first span that holds the key.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any, Callable

from jetwake.engine.core.errors import RestartableError
from jetwake.connectors.kafka.properties import KafkaConfigError
from jetwake.connectors.kafka.reachability import KafkaUnreachableError
from jetwake.connectors.kafka.sink import KafkaSinkError
from jetwake.connectors.kafka.client_log import with_client_log

__all__ = ["KafkaMarkerTopic", "MarkersHeldBack", "MARKER_PARTITION", "retrying"]

log = logging.getLogger("jetwake.kafka")

MARKER_PARTITION = 0
SEGMENT_MS = 3_600_000  # compaction only cleans closed segments: roll them every hour
_FIRST_SPAN = 2_000     # offsets read by the first backward step; each next step reads 4x

_checked: set[tuple[str, str]] = set()  # (brokers, topic) found compacted by this process
_checked_lock = threading.Lock()


class KafkaMarkerTopic:
    """The markers topic of one cluster, as one sink processor uses it."""

    def __init__(self, name: str, client_conf: dict, timeout_s: float, where: str,
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        self.name = name
        self.client_conf = client_conf
        self.timeout_s = timeout_s
        self.where = where
        self.on_failure = on_failure  # sees each failed attempt; may end the retrying
        self._consumer: Any = None

    # --- the topic -----------------------------------------------------------------------------

    def ensure(self) -> None:
        """Creates the topic (compacted, one partition, replicated as far as the cluster
        allows) unless it exists, and refuses one whose records could expire."""
        key = (str(self.client_conf.get("bootstrap.servers")), self.name)
        with _checked_lock:
            if key in _checked:
                return
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(with_client_log(self.client_conf))
        self._retrying(lambda: self._create_if_missing(admin), "create the markers topic")
        policy = self._retrying(lambda: self._cleanup_policy(admin), "read its configuration")
        if policy is not None and policy != "compact":
            raise KafkaConfigError(
                f"{self.where}: the markers topic {self.name!r} has cleanup.policy={policy}: "
                "its records would expire, and an exactly-once sink restored after that would "
                "write a committed snapshot's records again. Set cleanup.policy=compact on it "
                "(kafka-configs --alter --entity-type topics --entity-name "
                f"{self.name} --add-config cleanup.policy=compact), or name another topic with "
                "the sink option 'jetwake.markers.topic'")
        with _checked_lock:
            _checked.add(key)

    def _create_if_missing(self, admin: Any) -> None:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        md = admin.list_topics(timeout=10)
        t = md.topics.get(self.name)
        if t is not None and t.error is None and t.partitions:
            if t.partitions[MARKER_PARTITION].leader < 0:
                raise _NotYet(f"markers topic {self.name!r}: partition 0 has no leader")
            return
        rf = min(3, max(1, len(md.brokers)))
        config = {"cleanup.policy": "compact", "segment.ms": str(SEGMENT_MS),
                  "min.insync.replicas": str(max(1, rf - 1))}
        fut = admin.create_topics([NewTopic(self.name, num_partitions=1, replication_factor=rf,
                                            config=config)], operation_timeout=30)[self.name]
        try:
            fut.result(timeout=60)
            log.info("created the markers topic %s (compacted, replication %d)", self.name, rf)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another processor won
                raise
        raise _NotYet(f"markers topic {self.name!r} was just created")  # wait for its leader

    def _cleanup_policy(self, admin: Any) -> str | None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ConfigResource, ResourceType

        res = ConfigResource(ResourceType.TOPIC, self.name)
        try:
            entries = admin.describe_configs([res], request_timeout=10)[res].result(timeout=30)
        except KafkaException as e:
            if "AUTHORIZATION" in str(e).upper():  # may not read configs: cannot check
                log.warning("%s: cannot check the cleanup.policy of %s (%s); it must be "
                            "'compact'", self.where, self.name, e)
                return None
            raise
        entry = entries.get("cleanup.policy")
        return entry.value.replace(" ", "") if entry is not None else None

    # --- markers -------------------------------------------------------------------------------

    def produce(self, producer: Any, writer: str, snapshot_id: int, topic: str) -> None:
        """Adds ``writer``'s marker for ``snapshot_id`` to the producer's open transaction."""
        value = json.dumps({"snapshot_id": snapshot_id, "topic": topic}).encode()
        while True:
            try:
                producer.produce(self.name, value, writer.encode(), partition=MARKER_PARTITION)
                return
            except BufferError:
                producer.poll(0.05)

    def read(self, writer: str) -> int | None:
        """The snapshot id of ``writer``'s latest committed marker; None if it has none."""
        return self._retrying(lambda: self._read(writer.encode()), f"read the marker of {writer}")

    def _read(self, key: bytes) -> int | None:
        from confluent_kafka import TopicPartition

        c = self._reader()
        low, high = c.get_watermark_offsets(TopicPartition(self.name, MARKER_PARTITION),
                                            timeout=10, cached=False)
        end, span = high, _FIRST_SPAN
        while end > low:
            start = max(low, end - span)
            found = self._scan(c, start, end, key)
            if found is not None:
                value, offset = found
                if value is None:
                    return None  # a tombstone: the marker was deleted
                try:
                    return int(json.loads(value)["snapshot_id"])
                except (ValueError, KeyError, TypeError):
                    raise KafkaSinkError(
                        f"{self.where}: the marker at offset {offset} of {self.name!r} for "
                        f"{key.decode()!r} is not a jetwake marker ({value[:80]!r}); another "
                        "program writes to that topic: give the sinks a topic of their own "
                        "(jetwake.markers.topic)") from None
            end, span = start, span * 4
        return None

    def _scan(self, c: Any, start: int, end: int, key: bytes) -> tuple[Any, int] | None:
        """The (value, offset) of the last committed record for ``key`` in [start, end)."""
        from confluent_kafka import TopicPartition

        tp = TopicPartition(self.name, MARKER_PARTITION, start)
        c.assign([tp])
        found = None
        deadline = time.monotonic() + self.timeout_s
        while True:
            for m in c.consume(5000, 0.2):
                if m.error() is not None:
                    continue
                if m.offset() < end and m.key() == key:
                    found = (m.value(), m.offset())
            pos = c.position([TopicPartition(self.name, MARKER_PARTITION)])[0].offset
            if pos >= end:
                return found
            if time.monotonic() > deadline:
                raise MarkersHeldBack(
                    f"{self.where}: could not read the markers topic {self.name!r} up to "
                    f"offset {end} within {self.timeout_s:.0f} s (at {pos}): an open "
                    "transaction holds back what read_committed readers see (a member that "
                    "died while committing: it ends when that job restarts or its "
                    "transaction.timeout.ms passes); restarting the job from its snapshot")

    def _reader(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            conf = dict(self.client_conf)
            # assign() only, never commits: the group id is required but no group is formed
            conf.update({"group.id": f"jetwake-marker-reader-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.auto.offset.store": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
            self._consumer = Consumer(with_client_log(conf))
        return self._consumer

    def _retrying(self, call: Any, what: str) -> Any:
        return retrying(call, self.timeout_s, f"{self.where}: could not {what} on "
                        f"{self.client_conf.get('bootstrap.servers')}", self.on_failure)

    def close(self) -> None:
        c, self._consumer = self._consumer, None
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing after a failure
                log.debug("marker reader close failed", exc_info=True)


def retrying(call: Any, timeout_s: float, failed: str,
             on_failure: Callable[[BaseException], None] | None = None) -> Any:
    """``call()``, retried with exponential back-off for ``timeout_s`` while it fails with
    anything but a configuration error, a final sink error or brokers unreachable for longer
    than their bound; then KafkaSinkError ``failed`` with the last error. ``on_failure`` sees
    each failed attempt's error first (the sink's :meth:`~.KafkaRecordFormat.note_failure`,
    which raises KafkaUnreachableError, permanent, once the bound is passed)."""
    from tenacity import RetryError, Retrying, retry_if_exception, stop_after_delay, \
        wait_exponential

    def transient(e: BaseException) -> bool:
        if isinstance(e, KafkaUnreachableError):
            return False
        return not isinstance(e, (KafkaConfigError, KafkaSinkError)) or isinstance(e, _NotYet)

    def attempt_call() -> Any:
        try:
            return call()
        except KafkaUnreachableError:
            raise
        except Exception as e:
            if on_failure is not None:
                on_failure(e)
            raise

    try:
        for attempt in Retrying(stop=stop_after_delay(timeout_s),
                                wait=wait_exponential(multiplier=0.1, max=2.0),
                                retry=retry_if_exception(transient), reraise=False):
            with attempt:
                return attempt_call()
    except RetryError as e:
        raise KafkaSinkError(f"{failed} within {timeout_s:.0f} s (jetwake.startup.timeout.ms): "
                             f"{e.last_attempt.exception()}") from None
    raise AssertionError("unreachable")  # pragma: no cover


class MarkersHeldBack(KafkaSinkError, RestartableError):
    """An open transaction keeps the end of the markers topic from read_committed readers; it
    ends by itself (fenced or timed out), so the job restarts and reads again."""


class _NotYet(KafkaSinkError):
    """A state that passes by itself (a topic just created has no leader yet)."""
