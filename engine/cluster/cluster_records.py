"""The cluster's records in Kafka: what must outlive every member (job records, job definitions,
snapshot commit records, id counters).

They live in one compacted topic per cluster, ``__jetwake_NAME_records``: one partition (so one
reader sees every transaction in order), replicated to up to three brokers, kept forever per key
by compaction (the latest value of each key stays; a tombstone, a ``None`` value, deletes the key).
Any member can read it; only the coordinator writes it, through the cluster's
:class:`~jetwake.engine.cluster.membership.CoordinatorFence`, so a deposed coordinator's write
fails with :class:`~jetwake.engine.cluster.membership.FencedError` and none of it becomes
visible to a ``read_committed`` reader.

A value larger than one Kafka message (a job definition can be megabytes) is written as chunks,
all in the same transaction as the key's own record: the key's record then holds a small manifest
(chunk count, size, CRC-32) and each chunk is its own key, ``KEY\\x00N``. Since a transaction is
all or nothing and compaction keeps the latest value of every key, the latest manifest and the
latest chunks always belong together. When a key's new value needs fewer chunks than its old one
(or the key is deleted) the same transaction tombstones the chunks no longer needed.

Every record value starts with a tag byte: ``0`` a plain value follows, ``1`` a manifest follows.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
import uuid
import zlib
from typing import Any, Callable

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from jetwake.connectors.kafka.client_log import with_client_log
from jetwake.engine.cluster.admin_clients import RenewableAdmin
from jetwake.engine.cluster.cluster_topics import (
    TOPIC_MAX_MESSAGE_BYTES, create_topic, durable_config, replication_for,
    warn_if_single_replica,
)
from jetwake.engine.cluster.membership import CoordinatorFence, FencedError, check_cluster_name
from jetwake.engine.core.errors import JetwakeError

__all__ = ["ClusterRecords", "FencedError", "records_topic", "ensure_compacted_topic",
           "CHUNK_SIZE", "TOPIC_MAX_MESSAGE_BYTES", "check_bootstrap"]

log = logging.getLogger("jetwake.cluster")

# A chunk stays below librdkafka's default producer limit (message.max.bytes, 1,000,000 bytes)
# with room for the key and the record's framing, so the coordinator's fenced producer needs no
# settings of its own.
CHUNK_SIZE = 768 * 1024
# The topics' limit per record batch: well above one chunk, so a batch of a chunk plus a few
# small records is never refused.

_PLAIN = b"\x00"
_MANIFEST = b"\x01"
_MANIFEST_FORMAT = struct.Struct(">IQI")  # chunk count, total size, CRC-32
_CHUNK_SEPARATOR = "\x00"

# A reader that resumes where it stopped must not have stopped for longer than the topic keeps
# tombstones (delete.retention.ms), or the tombstone of a key it holds may have been compacted
# away before it read it. The topic keeps them a day; after an hour without catching up the
# reader starts again from the beginning.
_DELETE_RETENTION_MS = 24 * 3600 * 1000
_RESUME_AT_MOST_AFTER = 3600.0
# list_offsets' answers while the client's metadata names no leader for the partition
_NO_LEADER = {KafkaError._NOENT, KafkaError.LEADER_NOT_AVAILABLE,
              KafkaError.NOT_LEADER_FOR_PARTITION}


def records_topic(cluster: str) -> str:
    return f"__jetwake_{cluster}_records"


def ensure_compacted_topic(admin: AdminClient, topic: str, partitions: int,
                           timeout: float = 30.0, *, exact_partitions: bool = False,
                           extra_config: dict[str, str] | None = None,
                           replication: int | None = None) -> int:
    """Creates the compacted topic ``topic`` unless it exists, with ``replication`` replicas
    (the member's ``internal_topic_replication``; None: up to three, as many as there are
    brokers), and waits until every partition has a leader; returns its partition count.

    An existing topic must be compacted (a topic that deletes by age would lose the cluster's
    state after a week) and, with ``exact_partitions``, have exactly ``partitions`` partitions.
    """
    deadline = time.monotonic() + timeout
    md = admin.list_topics(timeout=timeout)
    existing = md.topics.get(topic)
    if existing is None or existing.error is not None:
        replicas = replication_for(len(md.brokers), replication)
        config = {"cleanup.policy": "compact", **durable_config(replicas),
                  "delete.retention.ms": str(_DELETE_RETENTION_MS), **(extra_config or {})}
        create_topic(admin, topic, partitions, replicas, config, timeout)
    else:
        _check_compacted(admin, topic, timeout)
    # a topic just created (here or by another member) has no leader for a moment
    while True:
        md = admin.list_topics(topic=topic, timeout=max(1.0, deadline - time.monotonic()))
        found = md.topics.get(topic)
        if (found is not None and found.error is None and found.partitions
                and all(p.leader >= 0 for p in found.partitions.values())):
            if exact_partitions and len(found.partitions) != partitions:
                raise JetwakeError(f"the topic {topic} has {len(found.partitions)} partitions; "
                                   f"it must have exactly {partitions} (delete it, and jetwake "
                                   "creates it again, or recreate it with that many)")
            return len(found.partitions)
        if time.monotonic() >= deadline:
            raise JetwakeError(f"the topic {topic} has no leader for every partition after "
                               f"{timeout:.0f} s; is the Kafka cluster healthy?")
        time.sleep(0.05)


def _check_compacted(admin: AdminClient, topic: str, timeout: float) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    deadline = time.monotonic() + timeout
    while True:
        try:
            configs = admin.describe_configs([resource])[resource].result(timeout)
            break
        except KafkaException as e:
            # created a moment ago through another broker (by another member starting at the
            # same time): the broker asked may not know the topic yet
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART \
                    or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)
    policy = configs.get("cleanup.policy")
    if policy is not None and "compact" not in policy.value:
        raise JetwakeError(f"the topic {topic} has cleanup.policy={policy.value}; it must be "
                           "'compact', or Kafka deletes the cluster's state by age (set it with "
                           f"kafka-configs --alter --entity-type topics --entity-name {topic} "
                           "--add-config cleanup.policy=compact)")


def check_bootstrap(bootstrap_servers: Any, what: str) -> str:
    if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
        raise ValueError(f"{what} needs Kafka's bootstrap servers, e.g. 'host:9092', "
                         f"got {bootstrap_servers!r}")
    return bootstrap_servers


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key or _CHUNK_SEPARATOR in key:
        raise ValueError(f"a cluster record key must be a non-empty string without NUL "
                         f"characters, got {key!r}")
    return key


def _chunk_key(key: str, n: int) -> str:
    return f"{key}{_CHUNK_SEPARATOR}{n}"


class ClusterRecords:
    """The cluster's records topic: :meth:`read_all` for every member, :meth:`put_many` for the
    coordinator once it called :meth:`open_writer`.

    One consumer serves every :meth:`read_all` of the object, and each call reads only what was
    committed since the previous one (the consumer is assigned at the offset that one reached),
    so calling it at each election and for each job listing costs a round trip for the end
    offset, plus a fetch when something was written.
    """

    def __init__(self, bootstrap_servers: str, cluster: str,
                 replication: int | None = None) -> None:
        self.bootstrap_servers = check_bootstrap(bootstrap_servers, "ClusterRecords")
        self.cluster = check_cluster_name(cluster)
        self.topic = records_topic(self.cluster)
        self.replication = replication  # of a new topic; None: as many as there are brokers
        self._admin_clients = RenewableAdmin(self.bootstrap_servers)
        self._fence: CoordinatorFence | None = None
        self._consumer: Consumer | None = None
        self._read_lock = threading.Lock()
        self._write_lock = threading.Lock()
        # what the consumer has read: the latest raw record value of every key, chunk keys
        # included (tombstoned keys removed), and the offset up to which it has read
        self._raw: dict[str, bytes] = {}
        self._reached = 0
        self._caught_up_at = 0.0
        # the end of the log after this object's last write: read_all reads at least that far
        self._written_end = 0
        # the values read_all returns, reassembled; keys whose records changed since then
        self._values: dict[str, bytes] = {}
        self._dirty: set[str] = set()
        # the writer's view: how many chunk keys of each key may hold a value (its manifest's
        # count, or more when an earlier write left some behind), to tombstone the surplus
        self._chunks_in_use: dict[str, int] = {}
        self._closed = False

    # -- set-up ---------------------------------------------------------------------------

    def _admin(self) -> AdminClient:
        return self._admin_clients.get()

    def ensure_topic(self, timeout: float = 30.0) -> None:
        """Creates the records topic unless it exists (any member may; the first one wins)."""
        self._check_open()
        ensure_compacted_topic(self._admin(), self.topic, 1, timeout, exact_partitions=True,
                               replication=self.replication)

    def warn_if_single_replica(self, known: list[str], timeout: float = 30.0) -> None:
        """Warns (a log warning naming them and the fix) when the cluster's topics, ``known``
        to exist and others, have a single replica."""
        warn_if_single_replica(self._admin(), self.cluster, known, timeout)

    def open_writer(self, timeout: float = 30.0,
                    on_fenced: Callable[[str], None] | None = None) -> None:
        """Makes this object the coordinator's writer: initializes the cluster's fenced
        producer, which fences every older coordinator (their next :meth:`put_many` raises
        FencedError, after calling their ``on_fenced``), then reads the topic to the end, so
        that it knows which chunk records earlier values left behind."""
        self._check_open()
        with self._write_lock:
            if self._fence is not None:
                self._fence.close()
                self._fence = None
            self._fence = CoordinatorFence(self.bootstrap_servers, self.cluster, timeout,
                                           on_fenced)
        self.read_all(timeout)
        with self._read_lock, self._write_lock:
            in_use: dict[str, int] = {}
            for raw_key in self._raw:
                key, sep, n = raw_key.partition(_CHUNK_SEPARATOR)
                if sep and n.isdigit():
                    in_use[key] = max(in_use.get(key, 0), int(n) + 1)
            self._chunks_in_use = in_use

    @property
    def fence(self) -> CoordinatorFence | None:
        """The cluster's fenced producer once :meth:`open_writer` made one, for other writes
        of the coordinator that must be fenced the same way (there is one per cluster: a second
        one would fence this one)."""
        return self._fence

    # -- writing --------------------------------------------------------------------------

    def put_many(self, items: list[tuple[str, bytes | None]], timeout: float = 30.0) -> None:
        """Writes ``(key, value)`` pairs in one fenced transaction (``None`` deletes the key);
        raises FencedError, having committed nothing, when a newer coordinator took over."""
        self._check_open()
        checked = self._check_items(items)
        with self._write_lock:
            if self._fence is None:
                raise JetwakeError("ClusterRecords.put_many needs open_writer() first: only the "
                                   "coordinator writes the cluster's records")
            records: list[tuple[str, bytes | None, bytes | None]] = []
            new_counts: dict[str, int] = {}
            for key, value in checked.items():
                count = 0
                if value is None:
                    records.append((self.topic, key.encode(), None))
                elif len(value) <= CHUNK_SIZE:
                    records.append((self.topic, key.encode(), _PLAIN + value))
                else:
                    count = -(-len(value) // CHUNK_SIZE)
                    view = memoryview(value)
                    for n in range(count):
                        records.append((self.topic, _chunk_key(key, n).encode(),
                                        bytes(view[n * CHUNK_SIZE:(n + 1) * CHUNK_SIZE])))
                    # the manifest comes last: a reader finds every chunk before it
                    records.append((self.topic, key.encode(), _MANIFEST + _MANIFEST_FORMAT.pack(
                        count, len(value), zlib.crc32(value))))
                for n in range(count, self._chunks_in_use.get(key, 0)):
                    records.append((self.topic, _chunk_key(key, n).encode(), None))
                new_counts[key] = count
            self._fence.write(records, timeout)
            self._written_end = max(self._written_end, self._log_end(timeout))
            for key, count in new_counts.items():
                if count:
                    self._chunks_in_use[key] = count
                else:
                    self._chunks_in_use.pop(key, None)

    def put(self, key: str, value: bytes | None, timeout: float = 30.0) -> None:
        """:meth:`put_many` of one key."""
        self.put_many([(key, value)], timeout)

    def _end_offset(self, isolation: IsolationLevel, timeout: float) -> int:
        """The partition's end offset. librdkafka's ``list_offsets`` looks the partition's
        leader up in the client's metadata cache only, and fails at once ("No leaders found")
        while the cache says the partition has none, as it does from the moment its leader's
        broker was lost: nothing in the admin client asks for the topic's metadata again, so
        every later call failed the same way for minutes (a coordinator could not take over
        after a broker was killed). On that answer the topic's metadata is read again, which
        renews the cache, and the offset is asked once more."""
        tp = TopicPartition(self.topic, 0)
        admin = self._admin()

        def ask() -> int:
            return int(admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=isolation,
                                          request_timeout=timeout)[tp].result(timeout).offset)
        try:
            try:
                return ask()
            except KafkaException as e:
                if not (e.args and isinstance(e.args[0], KafkaError)
                        and e.args[0].code() in _NO_LEADER):
                    raise
                admin.list_topics(topic=self.topic, timeout=timeout)  # renews the leader
                return ask()
        except Exception as e:
            self._admin_clients.failed(admin, e)
            raise

    def _log_end(self, timeout: float) -> int:
        """The partition's end offset, committed or not: past the records just written."""
        try:
            return self._end_offset(IsolationLevel.READ_UNCOMMITTED, timeout)
        except KafkaException as e:
            # the write is committed; only reading it back at once is not guaranteed
            log.warning("could not find the end of %s after a write: %s", self.topic,
                        e.args[0].str())
            return 0

    @staticmethod
    def _check_items(items: Any) -> dict[str, bytes | None]:
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"put_many takes a list of (key, value) pairs, got "
                             f"{type(items).__name__}")
        checked: dict[str, bytes | None] = {}
        for item in items:
            if not isinstance(item, tuple) or len(item) != 2:
                raise ValueError(f"put_many takes (key, value) pairs, got {item!r:.80}")
            key, value = item
            _check_key(key)
            if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
                raise ValueError(f"the value of cluster record {key!r} must be bytes or None "
                                 f"(a deletion), got {type(value).__name__}")
            # the last value of a key repeated in one call wins, as if written one by one
            checked.pop(key, None)
            checked[key] = None if value is None else bytes(value)
        return checked

    # -- reading --------------------------------------------------------------------------

    def _new_consumer(self) -> Consumer:
        consumer = Consumer(with_client_log({
            "bootstrap.servers": self.bootstrap_servers,
            # never joins the group: the partition is assigned, and nothing is committed
            "group.id": f"jetwake-{self.cluster}-records-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # a read ends at an empty fetch (the end of the partition comes after the last
            # transaction's marker, which delivers nothing): let the broker answer it soon.
            # The partition is assigned only during a read (at the offset the previous read
            # reached), so the consumer asks nothing between two reads.
            "fetch.wait.max.ms": 10,
            "queued.max.messages.kbytes": 16384,
        }))
        return consumer

    def read_all(self, timeout: float = 30.0) -> dict[str, bytes]:
        """The latest value of every key, as committed when the call started (tombstoned keys
        absent). Any member can call it, at any time."""
        self._check_open()
        deadline = time.monotonic() + timeout
        with self._read_lock:
            if (self._consumer is not None
                    and time.monotonic() - self._caught_up_at > _RESUME_AT_MOST_AFTER):
                self._restart_reading()
            if self._consumer is None:
                self._consumer = self._new_consumer()
            consumer = self._consumer
            # the last stable offset, so that an open transaction of a coordinator is not
            # waited for (asked through the admin client: on the consumer's own connection
            # the question would wait behind its long poll)
            try:
                end = self._end_offset(IsolationLevel.READ_COMMITTED, timeout)
            except KafkaException as e:
                raise JetwakeError(f"could not read the cluster's records from {self.topic} at "
                                   f"{self.bootstrap_servers}: {e.args[0].str()}") from e
            # this object's own writes are read back even before the transaction's markers
            # made them stable
            end = max(end, self._written_end)
            if self._reached < end:
                consumer.assign([TopicPartition(self.topic, 0, self._reached)])
                try:
                    while self._reached < end:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise JetwakeError(
                                f"reading the cluster's records from {self.topic} did not "
                                f"reach offset {end} within {timeout:.0f} s (at "
                                f"{self._reached})")
                        msg = consumer.poll(min(left, 0.5))
                        if msg is not None:
                            self._take(msg)
                            for msg in consumer.consume(1000, timeout=0):
                                self._take(msg)
                finally:
                    consumer.unassign()
            self._caught_up_at = time.monotonic()
            self._assemble_dirty()
            return dict(self._values)

    def _take(self, msg: Any) -> None:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                # the offset of the end, past any transaction marker that ends the log
                self._reached = max(self._reached, msg.offset())
                return
            if err.fatal() or err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                             KafkaError._UNKNOWN_PARTITION,
                                             KafkaError.TOPIC_AUTHORIZATION_FAILED):
                raise JetwakeError(f"could not read the cluster's records from {self.topic}: "
                                   f"{err.str()}")
            log.debug("reading %s: %s", self.topic, err.str())
            return
        self._reached = max(self._reached, msg.offset() + 1)
        raw_key = msg.key()
        if raw_key is None:
            return  # not one of ours
        key = raw_key.decode("utf-8", "replace")
        value = msg.value()
        if value is None:
            self._raw.pop(key, None)
        else:
            self._raw[key] = value
        self._dirty.add(key.partition(_CHUNK_SEPARATOR)[0])

    def _assemble_dirty(self) -> None:
        for key in self._dirty:
            value = self._assemble(key)
            if value is None:
                self._values.pop(key, None)
            else:
                self._values[key] = value
        self._dirty.clear()

    def _assemble(self, key: str) -> bytes | None:
        raw = self._raw.get(key)
        if raw is None or _CHUNK_SEPARATOR in key:
            return None  # deleted, or chunks without a manifest (left by an aborted write)
        tag, body = raw[:1], raw[1:]
        if tag == _PLAIN:
            return body
        if tag != _MANIFEST or len(body) != _MANIFEST_FORMAT.size:
            raise JetwakeError(f"the cluster record {key!r} in {self.topic} is not in jetwake's "
                               f"format (tag {tag!r}); was the topic written by something else?")
        count, size, crc = _MANIFEST_FORMAT.unpack(body)
        chunks = [self._raw.get(_chunk_key(key, n)) for n in range(count)]
        missing = [n for n, c in enumerate(chunks) if c is None]
        if missing:
            raise JetwakeError(f"the cluster record {key!r} in {self.topic} lacks chunks "
                               f"{missing} of {count}")
        value = b"".join(chunks)  # type: ignore[arg-type]
        if len(value) != size or zlib.crc32(value) != crc:
            raise JetwakeError(f"the cluster record {key!r} in {self.topic} does not match its "
                               f"manifest ({len(value)} bytes, CRC-32 {zlib.crc32(value):08x}; "
                               f"expected {size} bytes, {crc:08x})")
        return value

    def _restart_reading(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._raw.clear()
        self._values.clear()
        self._dirty.clear()
        self._reached = 0

    # -- end ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise JetwakeError("this ClusterRecords is closed; make a new one")

    def close(self) -> None:
        """Closes the reader and the writer (the writer's transactions are complete: every
        put_many returned after its commit)."""
        if self._closed:
            return
        self._closed = True
        with self._write_lock:
            if self._fence is not None:
                self._fence.close()
                self._fence = None
        with self._read_lock:
            if self._consumer is not None:
                try:
                    self._consumer.close()
                except Exception:  # noqa: BLE001 - closing regardless
                    log.debug("closing the records consumer failed", exc_info=True)
                self._consumer = None

    def __enter__(self) -> ClusterRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
