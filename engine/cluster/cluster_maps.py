"""The cluster's named maps and lists, kept in Kafka: the same from every member, and still
there after any member (or all of them) went away.

**A map** ``NAME`` of cluster ``C`` is the compacted topic ``__jetwake_C_map_NAME`` with one
partition. A record's key is :func:`~jetwake.engine.core.serialization.dumps` of the map's key,
its value ``dumps`` of the value, and a remove is a tombstone (a record without a value).
Compaction keeps the latest record of every key, so the topic always holds the whole map.

- *Writes* go through one idempotent producer per :class:`ClusterMaps` (``acks=all``) and
  return once Kafka acknowledged them, so a write that returned is durable and visible to the
  next read on any member. ``put_all`` sends all its records and waits once.
- *Reads* come from a view of each map in this process: one consumer per :class:`ClusterMaps`
  tails every map's topic (and every list's) into memory. Each read first asks the broker for
  the topic's end (the high watermark) and waits until the view has applied everything up to
  it, so every member answers the same right after a write anywhere; the view itself is kept
  up to date incrementally, never re-read. The views live in memory (a member holds each map
  it uses in full; a new member reads each map's topic once when it first uses it).
- Operations that need the current value (``put`` and ``remove`` returning the previous one,
  ``put_if_absent``, ``merge``, ``clear``) read it from the view and then write: they are
  atomic among the threads of one member, **not across members** (Hazelcast's IMap is). Two
  members that ``merge`` into the same key at the same moment may each miss the other's
  change. Jet's map sinks route every key to one processor in the cluster, so a job's own
  writes never race like that; other writers of the same keys can.
- *The event journal is the topic itself*: an event's sequence is its offset,
  ``journal_oldest_seq()`` the topic's low watermark, ``journal_next_seq()`` its high
  watermark, and ``journal_read(from_seq, n)`` reads from that offset (a map journal source
  saves the offset in its snapshots and replays from it). A record holds only the new value,
  so an event's ``old_value`` is always None here. Compaction removes records that a later
  record of the same key overwrote: offsets missing between two records (or before the first,
  once the log start moved) are counted in ``JournalBatch.lost``, as the bounded journal of a
  single member counts what it dropped. Kafka compacts only closed log segments and, here,
  only records older than a day (``min.compaction.lag.ms``), so a reader that falls behind by
  less than a day loses nothing. ``journal_read`` never asks the broker whether newer events
  exist (a source calls it in a loop; idle, it must cost nothing): it reads up to what this
  process has learnt of, i.e. everything before its last ``journal_next_seq()`` and what the
  view has applied; ``wait_for_events`` waits for more.

**A list** ``NAME`` is the topic ``__jetwake_C_list_NAME`` (one partition, never compacted,
kept forever). ``add``/``add_all`` append plain records; ``commit(items, writer,
snapshot_id)`` appends records tagged with ``(writer, snapshot id, index, count)`` and the view
applies a batch only once all its records arrived and only if that writer has not committed
that snapshot (or a later one) yet: a commit retried after a crash in the middle is applied
exactly once, all together. ``clear`` appends a marker; the view drops what came before it.

Names follow the single-member rules and must also fit in a Kafka topic name (letters, digits,
``.``, ``_``, ``-``; at most 249 characters with the prefix); any other name fails with a
message saying so.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any, Callable, Iterable, Iterator

from confluent_kafka import (
    OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from jetwake.connectors.kafka.client_log import with_client_log
from jetwake.engine.cluster.cluster_records import check_bootstrap, ensure_compacted_topic
from jetwake.engine.cluster.cluster_topics import (
    TOPIC_MAX_MESSAGE_BYTES, create_topic, durable_config, replication_for,
)
from jetwake.engine.cluster.membership import check_cluster_name
from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.core.partitioning import PARTITION_COUNT, partition_of
from jetwake.engine.core.serialization import dumps, loads
from jetwake.engine.data.map_surface import KEEP, Change, MapSurface, decode_value
from jetwake.engine.data.named_maps import PUT, REMOVE, JournalBatch, JournalEvent

__all__ = ["ClusterMaps", "ClusterMap", "ClusterList", "map_topic", "list_topic",
           "MIN_COMPACTION_LAG_MS"]

log = logging.getLogger("jetwake.cluster")

# Kafka's limit on a topic name, and the characters it allows
_MAX_TOPIC_NAME = 249
_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")

#: a map's record is never compacted away before it is this old: a journal reader (a suspended
#: job) that falls behind by less loses no event
MIN_COMPACTION_LAG_MS = 24 * 3600 * 1000

# how long a read waits for the view to catch up, and a write for Kafka's acknowledgement
READ_TIMEOUT_S = 30.0
WRITE_TIMEOUT_S = 60.0
# answers about a partition that mean "not yet" while a topic is new or its leader moves
_NOT_YET_KNOWN = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART,
                            KafkaError.NOT_LEADER_FOR_PARTITION,
                            KafkaError.LEADER_NOT_AVAILABLE})
# how long journal_read waits for events it knows exist to arrive (after a seek)
_JOURNAL_FETCH_WAIT_S = 10.0

# list records: the key says what the record is (a plain item has no key)
_COMMIT = "c"   # [_COMMIT, writer, snapshot id, index, count]; value: dumps(item) (b"" if none)
_CLEAR = "x"    # [_CLEAR]


def map_topic(cluster: str, name: str) -> str:
    return f"__jetwake_{cluster}_map_{name}"


def list_topic(cluster: str, name: str) -> str:
    return f"__jetwake_{cluster}_list_{name}"


def _check_name(name: Any, what: str, topic: Callable[[str], str]) -> str:
    """The single-member rules for a map or list name, and a valid Kafka topic name."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what} name must be a non-empty string, got {name!r}")
    if name in (".", "..") or any(c in name for c in ("/", "\\", "\0")):
        raise ValueError(f"{what} name {name!r} is not valid: it must not contain '/', '\\' or "
                         "NUL, nor be '.' or '..'")
    bad = sorted({c for c in name if c not in _TOPIC_CHARS})
    if bad:
        raise ValueError(f"{what} name {name!r} cannot be used in a cluster: it names the Kafka "
                         f"topic {topic(name)!r}, and Kafka allows only letters, digits, '.', "
                         f"'_' and '-' (not {''.join(bad)!r}); rename it")
    if len(topic(name)) > _MAX_TOPIC_NAME:
        raise ValueError(f"{what} name {name!r} is too long for a cluster: its Kafka topic "
                         f"{topic(name)!r} would have {len(topic(name))} characters, Kafka "
                         f"allows {_MAX_TOPIC_NAME}; use at most "
                         f"{_MAX_TOPIC_NAME - len(topic(name)) + len(name)} characters")
    return name


# --- writing --------------------------------------------------------------------------------


class _Acks:
    """Counts the delivery reports of one write; ``wait`` returns once every record of it was
    acknowledged or failed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._left = 0
        self._all_sent = False
        self._done = threading.Event()
        self.errors: list[str] = []
        self.last_offset = -1

    def expect(self) -> None:
        with self._lock:
            self._left += 1

    def sent_all(self) -> None:
        with self._lock:
            self._all_sent = True
            if self._left == 0:
                self._done.set()

    def __call__(self, err: Any, msg: Any) -> None:
        with self._lock:
            self._left -= 1
            if err is not None:
                self.errors.append(err.str())
            else:
                self.last_offset = max(self.last_offset, msg.offset())
            if self._left == 0 and self._all_sent:
                self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)


class _Writer:
    """One idempotent producer (``acks=all``) and the thread that serves its delivery reports."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._producer = Producer(with_client_log({
            "bootstrap.servers": bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "message.max.bytes": TOPIC_MAX_MESSAGE_BYTES,
            # a single put is sent at once; a put_all's records batch up on their own while the
            # first ones are in flight
            "linger.ms": 0,
            "queue.buffering.max.kbytes": 256 * 1024,
            "delivery.timeout.ms": int(WRITE_TIMEOUT_S * 1000),
        }))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name="jetwake-cluster-maps-writer")
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self._producer.poll(0.1)
            except Exception:  # noqa: BLE001 - a callback failed; the writer goes on
                log.exception("serving the cluster maps' delivery reports failed")

    def write(self, topic: str, records: Iterable[tuple[bytes | None, bytes | None]],
              what: str) -> int:
        """Produces ``(key, value)`` records to partition 0 of ``topic`` and returns once Kafka
        acknowledged all of them (the offset of the last); raises JetwakeError naming ``what``
        when one could not be written."""
        acks = _Acks()
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        produce = self._producer.produce
        for key, value in records:
            acks.expect()
            while True:
                try:
                    produce(topic, value=value, key=key, partition=0, on_delivery=acks)
                    break
                except BufferError:
                    # the producer holds as much as it may: wait for acknowledgements
                    if time.monotonic() >= deadline:
                        acks(_Failure("the producer's buffer stayed full"), None)
                        acks.sent_all()
                        raise JetwakeError(f"writing {what} to {topic}: Kafka at "
                                           f"{self.bootstrap_servers} did not take the records "
                                           "fast enough") from None
                    self._producer.poll(0.05)
                except KafkaException as e:
                    acks(_Failure(e.args[0].str()), None)
                    acks.sent_all()
                    raise JetwakeError(f"writing {what} to {topic} failed: "
                                       f"{e.args[0].str()}") from e
        acks.sent_all()
        if not acks.wait(max(0.0, deadline - time.monotonic()) + 5.0):
            raise JetwakeError(f"writing {what} to {topic}: Kafka at {self.bootstrap_servers} "
                               f"did not acknowledge it within {WRITE_TIMEOUT_S:.0f} s")
        if acks.errors:
            raise JetwakeError(f"writing {what} to {topic} failed: {acks.errors[0]}"
                               + (f" (and {len(acks.errors) - 1} more records)"
                                  if len(acks.errors) > 1 else ""))
        return acks.last_offset

    def flush(self, timeout: float) -> int:
        """Waits for every record produced so far; the number still unacknowledged."""
        return self._producer.flush(timeout)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        left = self._producer.flush(10)
        if left:
            log.warning("%d map and list records were not acknowledged when closing", left)


class _Failure:
    """Stands for a KafkaError in the delivery count of a record that was never produced."""

    def __init__(self, text: str) -> None:
        self._text = text

    def str(self) -> str:
        return self._text


# --- reading --------------------------------------------------------------------------------


class _View:
    """What one map's or list's topic holds, as applied by the tailer so far.

    ``position`` is the offset up to which the topic was applied; readers wait on ``cond``
    until it reaches the high watermark they took.
    """

    def __init__(self, topic: str, what: str) -> None:
        self.topic = topic
        self.what = what
        self.position = 0
        # the highest end offset this process learned of otherwise (asked of the broker, or
        # just past its own write): records before it exist even if not applied yet
        self.known_end = 0
        self.cond = threading.Condition()
        self.error: str | None = None
        self.closed = False

    def apply(self, msgs: list[Any]) -> None:
        with self.cond:
            for msg in msgs:
                err = msg.error()
                if err is None:
                    self.error = None  # readable again
                    self.position = max(self.position, msg.offset() + 1)
                    try:
                        self._record(msg)
                    except Exception as e:  # noqa: BLE001 - a record not in jetwake's format
                        log.warning("%s: skipped the record at offset %d of %s, which is not "
                                    "in jetwake's format: %r", self.what, msg.offset(),
                                    self.topic, e)
                elif err.code() == KafkaError._PARTITION_EOF:
                    # the end of the log: records missing before it were compacted away
                    self.error = None
                    self.position = max(self.position, msg.offset())
                elif err.fatal() or err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                   KafkaError._UNKNOWN_PARTITION,
                                                   KafkaError.TOPIC_AUTHORIZATION_FAILED):
                    self.error = err.str()
                else:
                    log.debug("reading %s: %s", self.topic, err.str())
            self.cond.notify_all()

    def _record(self, msg: Any) -> None:
        raise NotImplementedError

    def wait_until(self, offset: int, timeout: float) -> None:
        """Returns once everything before ``offset`` is applied; raises JetwakeError when the
        view cannot get there."""
        with self.cond:
            if not self.cond.wait_for(
                    lambda: self.position >= offset or self.error is not None or self.closed,
                    timeout):
                raise JetwakeError(f"{self.what} could not be read up to offset {offset} of "
                                   f"{self.topic} within {timeout:.0f} s (read up to "
                                   f"{self.position}); is Kafka reachable?")
            self._check()

    def _check(self) -> None:
        if self.closed:
            raise JetwakeError(f"{self.what}: the cluster's maps and lists were closed")
        if self.error is not None:
            raise JetwakeError(f"{self.what} cannot be read from {self.topic}: {self.error}")


class _MapView(_View):
    """A map's entries: one dict per partition, serialized key -> serialized value."""

    def __init__(self, topic: str, what: str) -> None:
        super().__init__(topic, what)
        self.parts: list[dict[bytes, bytes]] = [{} for _ in range(PARTITION_COUNT)]
        self.count = 0

    def _record(self, msg: Any) -> None:
        kb = msg.key()
        if kb is None:
            return  # not a map record
        part = self.parts[partition_of(loads(kb))]
        vb = msg.value()
        if vb is None:
            if part.pop(kb, None) is not None:
                self.count -= 1
        else:
            if kb not in part:
                self.count += 1
            part[kb] = vb


class _ListView(_View):
    """A list's items (serialized), the snapshots each writer committed, and the commit
    batches of which some records have arrived."""

    def __init__(self, topic: str, what: str) -> None:
        super().__init__(topic, what)
        self.items: list[bytes] = []
        self.committed: dict[str, int] = {}
        self._pending: dict[tuple[str, int], tuple[int, dict[int, bytes]]] = {}

    def _record(self, msg: Any) -> None:
        kb = msg.key()
        value = msg.value()
        if kb is None:
            if value is not None:
                self.items.append(value)
            return
        tag = loads(kb)
        if tag[0] == _CLEAR:
            self.items = []
            return
        if tag[0] != _COMMIT:
            raise ValueError(f"unknown list record {tag!r}")
        _, writer, snapshot_id, index, count = tag
        if self.committed.get(writer, -1) >= snapshot_id:
            return  # that snapshot's items are in the list already: a retried commit
        batch = (writer, snapshot_id)
        _, got = self._pending.setdefault(batch, (count, {}))
        if count:
            got[index] = value or b""
        if len(got) >= count:
            # the whole batch arrived (some records perhaps twice): applied once, in order
            del self._pending[batch]
            self.items.extend(got[i] for i in range(count))
            self.committed[writer] = snapshot_id
            for other in [b for b in self._pending if b[0] == writer and b[1] <= snapshot_id]:
                del self._pending[other]


class _Tailer:
    """One consumer and thread that tail the topics of every map and list of a
    :class:`ClusterMaps` into their views."""

    def __init__(self, bootstrap_servers: str, cluster: str) -> None:
        self._consumer = Consumer(with_client_log({
            "bootstrap.servers": bootstrap_servers,
            # never joins the group: partitions are assigned, nothing is committed
            "group.id": f"jetwake-{cluster}-maps-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # a fetch returns as soon as a record arrives; this bounds how long a newly added
            # topic waits for the fetch in flight to end
            "fetch.wait.max.ms": 100,
            "queued.max.messages.kbytes": 65536,
        }))
        self._views: dict[str, _View] = {}
        self._lock = threading.Lock()
        self._to_assign: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="jetwake-cluster-maps-reader")
        self._thread.start()

    def add(self, view: _View) -> None:
        """Starts tailing ``view``'s topic from its beginning (within one poll interval)."""
        with self._lock:
            self._views[view.topic] = view
            self._to_assign.append(view.topic)

    def _run(self) -> None:
        try:
            self._read()
        finally:
            # the consumer is this thread's: closed here, never under a call of it in flight
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001 - closing regardless
                log.debug("closing the maps' consumer failed", exc_info=True)

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self._assign_new()
                # consume() waits its whole timeout unless it fills its batch: poll() for the
                # first record, so that a write is applied as soon as it arrives
                first = self._consumer.poll(0.1)
                msgs = [] if first is None else [first, *self._consumer.consume(10_000, 0)]
            except Exception:  # noqa: BLE001 - closed under us, or a client error
                if self._stop.is_set():
                    return
                log.exception("reading the cluster's maps failed")
                self._stop.wait(0.5)  # then again
                continue
            if not msgs:
                continue
            by_topic: dict[str, list[Any]] = {}
            for msg in msgs:
                topic = msg.topic()
                if topic is None:
                    log.debug("reading the cluster's maps: %s", msg.error())
                    continue
                by_topic.setdefault(topic, []).append(msg)
            for topic, batch in by_topic.items():
                with self._lock:
                    view = self._views.get(topic)
                if view is not None:
                    view.apply(batch)

    def _assign_new(self) -> None:
        # on this thread: an assignment made while another thread is in consume() waits for it
        with self._lock:
            new, self._to_assign = self._to_assign, []
        if not new:
            return
        try:
            self._consumer.incremental_assign(
                [TopicPartition(t, 0, OFFSET_BEGINNING) for t in new])
        except Exception:
            with self._lock:  # tried again at the next round
                self._to_assign = new + self._to_assign
            raise

    def close(self) -> None:
        """Stops the reader; its thread closes the consumer when its call in flight ends
        (closing it here, under that call, could crash librdkafka)."""
        self._stop.set()
        self._thread.join(5)
        for view in self._views.values():
            with view.cond:
                view.closed = True
                view.cond.notify_all()


# --- the maps and lists ---------------------------------------------------------------------


class ClusterMaps:
    """The named maps and lists of cluster ``cluster``, kept in Kafka (see the module doc).

    Kafka clients are made on first use: one producer for every write, one consumer that tails
    every map and list in use into memory, and one more for the topics' end offsets.
    """

    def __init__(self, bootstrap_servers: str, cluster: str,
                 replication: int | None = None) -> None:
        self.bootstrap_servers = check_bootstrap(bootstrap_servers, "ClusterMaps")
        self.cluster = check_cluster_name(cluster)
        self.replication = replication  # of a new topic; None: as many as there are brokers
        self._lock = threading.Lock()
        self._maps: dict[str, ClusterMap] = {}
        self._lists: dict[str, ClusterList] = {}
        self._admin_client: AdminClient | None = None
        self._writer_: _Writer | None = None
        self._tailer: _Tailer | None = None
        self._offsets: Consumer | None = None
        self._closed = False

    def get_map(self, name: str) -> ClusterMap:
        """The map called ``name``, the same on every member (its topic is created on first
        use by any member)."""
        _check_name(name, "a map", lambda n: map_topic(self.cluster, n))
        with self._lock:
            self._check_open()
            m = self._maps.get(name)
            if m is None:
                topic = map_topic(self.cluster, name)
                ensure_compacted_topic(
                    self._admin(), topic, 1, exact_partitions=True,
                    extra_config={"min.compaction.lag.ms": str(MIN_COMPACTION_LAG_MS)},
                    replication=self.replication)
                view = _MapView(topic, f"map {name!r}")
                m = self._maps[name] = ClusterMap(self, name, view)
                self._tail(view)
            return m

    def get_list(self, name: str) -> ClusterList:
        """The list called ``name``, the same on every member."""
        _check_name(name, "a list", lambda n: list_topic(self.cluster, n))
        with self._lock:
            self._check_open()
            lst = self._lists.get(name)
            if lst is None:
                topic = list_topic(self.cluster, name)
                _ensure_list_topic(self._admin(), topic, replication=self.replication)
                view = _ListView(topic, f"list {name!r}")
                lst = self._lists[name] = ClusterList(self, name, view)
                self._tail(view)
            return lst

    def sync(self) -> None:
        """Every write made so far is durable in Kafka (on every in-sync replica). Each write
        already returns only once acknowledged, so this only waits for writes still under way
        in other threads; raises OSError when they are not acknowledged in time (a snapshot's
        commit then fails, as when a member's own map log cannot be synced)."""
        writer = self._writer_
        if writer is None:
            return
        left = writer.flush(WRITE_TIMEOUT_S)
        if left:
            raise OSError(f"{left} writes to the cluster's maps and lists were not acknowledged "
                          f"by Kafka at {self.bootstrap_servers} within {WRITE_TIMEOUT_S:.0f} s")

    def close(self) -> None:
        """Closes the Kafka clients; the maps and lists got from here are unusable after."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tailer, self._tailer = self._tailer, None
            writer, self._writer_ = self._writer_, None
            offsets, self._offsets = self._offsets, None
            maps = list(self._maps.values())
        if tailer is not None:
            tailer.close()
        for m in maps:
            m._close_journal()
        if writer is not None:
            writer.close()
        if offsets is not None:
            offsets.close()

    def __enter__(self) -> ClusterMaps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ClusterMaps(cluster={self.cluster!r}, {self.bootstrap_servers})"

    # -- for the maps and lists -----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise JetwakeError("the cluster's maps and lists were closed (the member left the "
                               "cluster); use a member that is running")

    def _admin(self) -> AdminClient:
        if self._admin_client is None:
            self._admin_client = AdminClient(with_client_log(
                {"bootstrap.servers": self.bootstrap_servers}))
        return self._admin_client

    def _tail(self, view: _View) -> None:
        if self._tailer is None:
            self._tailer = _Tailer(self.bootstrap_servers, self.cluster)
        self._tailer.add(view)

    def _writer(self) -> _Writer:
        with self._lock:
            self._check_open()
            if self._writer_ is None:
                self._writer_ = _Writer(self.bootstrap_servers)
            return self._writer_

    def _new_consumer(self, purpose: str, **conf: Any) -> Consumer:
        return Consumer(with_client_log({
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": f"jetwake-{self.cluster}-{purpose}-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            **conf,
        }))

    def _watermarks(self, topic: str, what: str) -> tuple[int, int]:
        """(low, high) watermark of the topic's partition, asked of the broker now (on a
        consumer of its own: on the tailer's connection the question would wait behind its
        fetch)."""
        with self._lock:
            self._check_open()
            if self._offsets is None:
                self._offsets = self._new_consumer("offsets")
            offsets = self._offsets
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            try:
                return offsets.get_watermark_offsets(
                    TopicPartition(topic, 0), timeout=max(0.1, deadline - time.monotonic()),
                    cached=False)
            except KafkaException as e:
                # a topic just created on several brokers (or a leader that just moved):
                # the broker this consumer asked may not know it, or not lead it, for a
                # moment; librdkafka refreshes its metadata on these answers
                if (e.args[0].code() in _NOT_YET_KNOWN
                        and time.monotonic() < deadline):
                    time.sleep(0.05)
                    continue
                raise JetwakeError(f"{what}: could not ask Kafka at {self.bootstrap_servers} "
                                   f"for the end of {topic}: {e.args[0].str()}") from e

    def _catch_up(self, view: _View) -> None:
        """Waits until ``view`` holds everything written to its topic before this call."""
        view._check()
        _, high = self._end_offsets(view)
        view.wait_until(high, READ_TIMEOUT_S)

    def _end_offsets(self, view: _View) -> tuple[int, int]:
        low, high = self._watermarks(view.topic, view.what)
        view.known_end = max(view.known_end, high)
        return low, high


def _ensure_list_topic(admin: AdminClient, topic: str, timeout: float = 30.0,
                       replication: int | None = None) -> None:
    """Creates a list's topic unless it exists: one partition, deleting nothing ever; an
    existing one must be so too (a list whose items Kafka deletes by age would lose them)."""
    md = admin.list_topics(timeout=timeout)
    existing = md.topics.get(topic)
    if existing is None or existing.error is not None:
        replicas = replication_for(len(md.brokers), replication)
        config = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1",
                  **durable_config(replicas)}
        create_topic(admin, topic, 1, replicas, config, timeout)
    else:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        configs = admin.describe_configs([resource])[resource].result(timeout)
        policy, retention = configs.get("cleanup.policy"), configs.get("retention.ms")
        if policy is not None and "compact" in policy.value:
            raise JetwakeError(f"the topic {topic} of a list is compacted; it must have "
                               "cleanup.policy=delete (delete it, and jetwake creates it again)")
        if retention is not None and retention.value != "-1":
            raise JetwakeError(f"the topic {topic} of a list deletes records after "
                               f"retention.ms={retention.value}; it must keep them forever "
                               f"(kafka-configs --alter --entity-type topics --entity-name "
                               f"{topic} --add-config retention.ms=-1)")
    deadline = time.monotonic() + timeout
    while True:  # a topic just created has no leader for a moment
        md = admin.list_topics(topic=topic, timeout=max(1.0, deadline - time.monotonic()))
        found = md.topics.get(topic)
        if found is not None and found.error is None and found.partitions \
                and all(p.leader >= 0 for p in found.partitions.values()):
            if len(found.partitions) != 1:
                raise JetwakeError(f"the topic {topic} of a list has {len(found.partitions)} "
                                   "partitions; it must have exactly one")
            return
        if time.monotonic() >= deadline:
            raise JetwakeError(f"the topic {topic} has no leader after {timeout:.0f} s; is the "
                               "Kafka cluster healthy?")
        time.sleep(0.05)


class ClusterMap(MapSurface):
    """A map of the cluster, with the API of :class:`~jetwake.engine.data.named_maps.KeyValueMap`
    (get it from :meth:`ClusterMaps.get_map`).

    What a change returns as the previous value is what this member saw, and a change is atomic
    among this member's threads only: another member changing the same key at the same time
    may overwrite it (see the module doc). ``put_all`` sends every record, then waits for all
    acknowledgements together; it is not atomic: a failure part way may leave some written.
    """

    def __init__(self, owner: ClusterMaps, name: str, view: _MapView) -> None:
        super().__init__(name)
        self._owner = owner
        self._view = view
        self.topic = view.topic
        # one read-modify-write at a time on this member (not across members)
        self._rmw = threading.Lock()
        self._journal_lock = threading.Lock()
        self._journal: Consumer | None = None
        self._journal_pos = -1

    def __repr__(self) -> str:
        return f"ClusterMap({self._name!r}, topic={self.topic!r})"

    def _read(self, partition: int, kb: bytes) -> bytes | None:
        self._owner._catch_up(self._view)
        with self._view.cond:
            return self._view.parts[partition].get(kb)

    remote_reads = True

    def _read_many(self, keys: list[tuple[int, bytes]]) -> list[bytes | None]:
        self._owner._catch_up(self._view)  # once for all the keys
        with self._view.cond:
            parts = self._view.parts
            return [parts[p].get(kb) for p, kb in keys]

    def _modify(self, partition: int, kb: bytes, change: Change) -> bytes | None:
        with self._rmw:
            old = self._read(partition, kb)
            new = change(old)
            if new is not KEEP:
                self._write([(kb, new)])
        return old

    def _put_entries(self, encoded: list[tuple[int, bytes, bytes]]) -> None:
        self._write((kb, vb) for _, kb, vb in encoded)

    def _entry_bytes(self, partitions: list[int] | None) -> Iterator[tuple[bytes, bytes]]:
        wanted = range(PARTITION_COUNT) if partitions is None else partitions
        self._owner._catch_up(self._view)
        with self._view.cond:
            chosen = [sorted(self._view.parts[p].items()) for p in wanted]
        return (entry for part in chosen for entry in part)

    def size(self) -> int:
        """The number of entries."""
        self._owner._catch_up(self._view)
        with self._view.cond:
            return self._view.count

    def _write(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        last = self._owner._writer().write(self.topic, records, f"map {self._name!r}")
        self._view.known_end = max(self._view.known_end, last + 1)

    def clear(self) -> None:
        """Remove every entry (one tombstone, and one ``remove`` event, per entry)."""
        with self._rmw:
            self._owner._catch_up(self._view)
            with self._view.cond:
                keys = [kb for part in self._view.parts for kb in part]
            if keys:
                self._write([(kb, None) for kb in keys])

    def sync(self) -> None:
        """Every write so far is durable (see :meth:`ClusterMaps.sync`)."""
        self._owner.sync()

    # -- the event journal ----------------------------------------------------------------

    def journal_oldest_seq(self) -> int:
        """The offset of the oldest record the topic keeps (its low watermark)."""
        return self._owner._end_offsets(self._view)[0]

    def journal_next_seq(self) -> int:
        """The offset the next event will get (the topic's high watermark): where a reader of
        new events only starts."""
        return self._owner._end_offsets(self._view)[1]

    def wait_for_events(self, after_seq: int, timeout_s: float) -> bool:
        """Waits until an event at ``after_seq`` or later exists, at most ``timeout_s``; whether
        one does (False on timeout or close)."""
        view = self._view
        with view.cond:
            view.cond.wait_for(lambda: view.closed or view.error is not None
                               or max(view.position, view.known_end) > after_seq, timeout_s)
            return not view.closed and max(view.position, view.known_end) > after_seq

    def journal_read(self, from_seq: int, max_count: int) -> JournalBatch:
        """Up to ``max_count`` events from offset ``from_seq`` on.

        Offsets between ``from_seq`` and the first event (and between two events) that the
        topic no longer holds (compacted away, or before its log start) are counted in
        ``lost``. A ``from_seq`` past :meth:`journal_next_seq` is an error. Returns at once when
        no newer event is known to this process (use :meth:`wait_for_events` to wait for
        one); when events are known to exist it waits (briefly) for them. It may return fewer
        than ``max_count`` while more exist: read on from ``next_seq``.
        """
        if not isinstance(from_seq, int) or not isinstance(max_count, int):
            raise TypeError("journal_read(from_seq, max_count) takes two ints")
        if max_count < 0:
            raise ValueError(f"max_count must be >= 0, got {max_count}")
        what = f"map {self._name!r}"
        view = self._view
        view._check()
        # every offset before it exists (or was compacted away); what is beyond it is not
        # asked of the broker here, so that a reader that is up to date costs nothing
        known_end = max(view.position, view.known_end)
        if from_seq < 0 or from_seq > known_end:
            high = self._owner._end_offsets(view)[1]
            if from_seq < 0 or from_seq > high:
                raise ValueError(f"map {self._name!r}: from_seq {from_seq} outside the "
                                 f"journal's sequences [0, {high}]")
            known_end = high
        if max_count == 0:
            return JournalBatch([], from_seq, 0)
        with self._journal_lock:
            consumer = self._journal_consumer()
            if self._journal_pos != from_seq:
                consumer.assign([TopicPartition(self.topic, 0, from_seq)])
                self._journal_pos = from_seq
            events: list[JournalEvent] = []
            expected, lost = from_seq, 0
            deadline = time.monotonic() + _JOURNAL_FETCH_WAIT_S
            while len(events) < max_count:
                waiting = not events and expected < known_end
                timeout = min(0.05, max(0.0, deadline - time.monotonic())) if waiting else 0
                if timeout > 0:  # poll(): consume() would wait the whole timeout
                    first = consumer.poll(timeout)
                    msgs = [] if first is None else [first]
                else:
                    msgs = consumer.consume(max_count - len(events), 0)
                if not msgs:
                    if not waiting or time.monotonic() >= deadline:
                        break
                    continue
                for msg in msgs:
                    err = msg.error()
                    if err is None:
                        offset = msg.offset()
                        assert offset is not None  # a record has one
                        lost += max(0, offset - expected)
                        expected = offset + 1
                        kb, vb = msg.key(), msg.value()
                        if kb is None:
                            continue  # not a map record
                        events.append(JournalEvent(offset, loads(kb), None, decode_value(vb),
                                                   PUT if vb is not None else REMOVE))
                    elif err.code() == KafkaError._PARTITION_EOF:
                        offset = msg.offset()
                        assert offset is not None  # the partition's end
                        lost += max(0, offset - expected)
                        expected = max(expected, offset)
                        known_end = min(known_end, expected)
                    elif err.fatal() or err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                       KafkaError._UNKNOWN_PARTITION):
                        raise JetwakeError(f"the journal of {what} cannot be read from "
                                           f"{self.topic}: {err.str()}")
                    else:
                        log.debug("reading the journal of %s: %s", what, err.str())
            self._journal_pos = expected
        return JournalBatch(events, expected, lost)

    def _journal_consumer(self) -> Consumer:
        if self._journal is None:
            self._owner._check_open()
            self._journal = self._owner._new_consumer(
                "journal", **{"enable.partition.eof": True, "auto.offset.reset": "earliest",
                              "fetch.wait.max.ms": 100, "queued.max.messages.kbytes": 16384})
        return self._journal

    def _close_journal(self) -> None:
        with self._journal_lock:
            if self._journal is not None:
                try:
                    self._journal.close()
                except Exception:  # noqa: BLE001 - closing regardless
                    log.debug("closing a journal consumer failed", exc_info=True)
                self._journal = None
                self._journal_pos = -1


class ClusterList(Sequence):
    """A list of the cluster, with the API of :class:`~jetwake.engine.data.named_list.NamedList`
    (get it from :meth:`ClusterMaps.get_list`). Reads return fresh copies of the items."""

    def __init__(self, owner: ClusterMaps, name: str, view: _ListView) -> None:
        self._owner = owner
        self.name = name
        self._view = view
        self.topic = view.topic
        self._commit_lock = threading.Lock()

    def _write(self, records: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        self._owner._writer().write(self.topic, records, f"list {self.name!r}")

    def add_all(self, items: Iterable[Any]) -> None:
        """Appends ``items``; returns once Kafka acknowledged them."""
        encoded = [(None, dumps(x)) for x in items]
        if encoded:
            self._write(encoded)

    def add(self, item: Any) -> None:
        self._write([(None, dumps(item))])

    def commit(self, items: list, writer: str, snapshot_id: int) -> bool:
        """Appends ``items`` and records ``snapshot_id`` for ``writer`` in one step; does
        nothing (False) if that snapshot's items were committed already (by any member). A
        commit interrupted part way and retried is applied once, whole."""
        if not isinstance(writer, str) or not isinstance(snapshot_id, int):
            raise TypeError("commit(items, writer, snapshot_id) takes a str writer and an int "
                            "snapshot id")
        encoded = [dumps(x) for x in items]
        with self._commit_lock:
            if self.committed_snapshot(writer) >= snapshot_id:
                return False
            n = len(encoded)
            if n == 0:  # the marker alone
                self._write([(dumps([_COMMIT, writer, snapshot_id, 0, 0]), b"")])
            else:
                self._write([(dumps([_COMMIT, writer, snapshot_id, i, n]), vb)
                             for i, vb in enumerate(encoded)])
        return True

    def committed_snapshot(self, writer: str) -> int:
        """The highest snapshot id ``writer`` committed; -1 for none."""
        self._owner._catch_up(self._view)
        with self._view.cond:
            return self._view.committed.get(writer, -1)

    def clear(self) -> None:
        """Empties the list (a marker: the items before it stay in the topic, unread)."""
        self._write([(dumps([_CLEAR]), b"")])

    def _snapshot(self) -> list[bytes]:
        self._owner._catch_up(self._view)
        with self._view.cond:
            return list(self._view.items)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [loads(vb) for vb in self._snapshot()[index]]
        self._owner._catch_up(self._view)
        with self._view.cond:
            vb = self._view.items[index]
        return loads(vb)

    def __len__(self) -> int:
        self._owner._catch_up(self._view)
        with self._view.cond:
            return len(self._view.items)

    def __iter__(self) -> Iterator[Any]:
        return iter([loads(vb) for vb in self._snapshot()])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (ClusterList, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ClusterList({self.name!r}, topic={self.topic!r})"
