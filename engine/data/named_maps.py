"""Named key-value maps with an event journal, after Hazelcast's IMap.

A :class:`MapStore` owns the maps of one member. Each :class:`KeyValueMap` is a thread-safe
mutable mapping whose every change also appends an event to the map's journal: a bounded,
sequenced log that a streaming source reads and can replay from a saved sequence number.

With a data directory each map is a RocksDB database under ``<data_dir>/maps/<name>/`` and one
change (or one ``put_all``) is a single WriteBatch holding the entries, the journal events and
the map's counters, so the contents and the journal never disagree, even after a crash. Without
a data directory the maps live in memory with the same behaviour.

**Durability.** A write goes to RocksDB's write-ahead log without an fsync: it survives the
process being killed (the operating system has it) but not a power loss or a kernel crash.
:meth:`MapStore.sync` makes every write so far durable (an fsync of each changed map's log);
a job's snapshot calls it before its commit record, because that record may point into a
journal (a map journal source saves its sequence) or count on a map's contents (a map sink
under exactly-once is not written again for items before the snapshot). One fsync per changed
map per snapshot costs far less than a synced write per change.

Keys and values are serialized with :func:`jetwake.engine.core.serialization.dumps`; reads return
fresh copies, so mutating a returned value never changes the map. ``None`` is not a value: it
means "absent" in the return values of :meth:`KeyValueMap.put` and friends.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple, Protocol, cast

from rocksdict import BlockBasedOptions, Options, ReadOptions, Rdict, Snapshot, WriteBatch

from jetwake.engine.core.serialization import dumps, loads
from jetwake.engine.data.map_surface import KEEP, Change, MapSurface, decode_value

__all__ = ["MapStore", "KeyValueMap", "JournalEvent", "JournalBatch", "PUT", "REMOVE"]

PUT = "put"
REMOVE = "remove"

_PREFIX = struct.Struct(">H")
_SEQ = struct.Struct(">Q")
_ENTRY = b"e"
_ENTRY_END = b"f"
_JOURNAL = b"j"
_META_COUNT = b"m:count"
_META_NEXT_SEQ = b"m:next_seq"
_META_OLDEST_SEQ = b"m:oldest_seq"
_POINT_DELETE_LIMIT = 64


class JournalEvent(NamedTuple):
    """One change of a map: ``old_value`` is None for an insert, ``new_value`` for a remove."""

    sequence: int
    key: Any
    old_value: Any
    new_value: Any
    kind: str


@dataclass(frozen=True)
class JournalBatch:
    """The answer of :meth:`KeyValueMap.journal_read`.

    ``lost`` counts requested events that the journal had already dropped (``from_seq`` was
    older than the oldest retained event); reading went on from the oldest retained one.
    """

    events: list[JournalEvent]
    next_seq: int
    lost: int


# an event as stored: (dumps(key), dumps(old) or None, dumps(new) or None, kind)
_RawEvent = tuple[bytes, "bytes | None", "bytes | None", str]


class _Storage(Protocol):
    next_seq: int
    oldest_seq: int
    count: int

    def get(self, sk: bytes) -> bytes | None: ...

    def commit(self, writes: dict[bytes, bytes | None], events: list[_RawEvent],
               count: int) -> None: ...

    def entries(self, partitions: list[int] | None) -> Iterator[tuple[bytes, bytes]]: ...

    def events(self, start: int, stop: int) -> list[_RawEvent]: ...

    def take_unsynced(self) -> bool:
        """Whether anything was written since the last sync; clears the flag."""

    def sync(self) -> None: ...

    def close(self) -> None: ...


class _MemoryStorage:
    """Entries in a dict and the journal in a ring buffer indexed by ``sequence % capacity``."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._data: dict[bytes, bytes] = {}
        self._ring: list[_RawEvent] = []
        self.next_seq = 0
        self.oldest_seq = 0
        self.count = 0

    def get(self, sk: bytes) -> bytes | None:
        return self._data.get(sk)

    def commit(self, writes: dict[bytes, bytes | None], events: list[_RawEvent],
               count: int) -> None:
        for sk, vb in writes.items():
            if vb is None:
                self._data.pop(sk, None)
            else:
                self._data[sk] = vb
        ring, capacity = self._ring, self._capacity
        for event in events:
            if len(ring) < capacity:
                ring.append(event)
            else:
                ring[self.next_seq % capacity] = event
            self.next_seq += 1
        self.oldest_seq = max(self.oldest_seq, self.next_seq - capacity)
        self.count = count

    def entries(self, partitions: list[int] | None) -> Iterator[tuple[bytes, bytes]]:
        if partitions is None:
            chosen = list(self._data.items())
        else:
            prefixes = {_PREFIX.pack(p) for p in partitions}
            chosen = [(sk, vb) for sk, vb in self._data.items() if sk[:2] in prefixes]
        chosen.sort()
        return iter(chosen)

    def events(self, start: int, stop: int) -> list[_RawEvent]:
        return [self._ring[seq % self._capacity] for seq in range(start, stop)]

    def take_unsynced(self) -> bool:
        return False  # nothing to make durable in memory

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


class _RocksStorage:
    """A map in one RocksDB database: entries, journal and counters under separate prefixes.

    ``e`` + partition (2 bytes) + dumps(key) -> dumps(value); ``j`` + sequence (8 bytes) ->
    the event; ``m:...`` -> counters.
    """

    def __init__(self, path: str, capacity: int) -> None:
        os.makedirs(path, exist_ok=True)
        self._path = path
        self._capacity = capacity
        self._unsynced = False  # written since the last sync()
        self._db: Rdict | None = Rdict(path, _rocksdb_options())
        self.count = self._meta(_META_COUNT)
        self.next_seq = self._meta(_META_NEXT_SEQ)
        self.oldest_seq = self._meta(_META_OLDEST_SEQ)
        if self.next_seq - self.oldest_seq > capacity:
            self.commit({}, [], self.count)

    def _meta(self, name: bytes) -> int:
        raw = self._open_db().get(name)
        return 0 if raw is None else _SEQ.unpack(raw)[0]

    def _open_db(self) -> Rdict:
        if self._db is None:
            raise RuntimeError("map is closed")
        return self._db

    def get(self, sk: bytes) -> bytes | None:
        return self._open_db().get(_ENTRY + sk)

    def commit(self, writes: dict[bytes, bytes | None], events: list[_RawEvent],
               count: int) -> None:
        db = self._open_db()
        batch = WriteBatch(raw_mode=True)
        for sk, vb in writes.items():
            if vb is None:
                batch.delete(_ENTRY + sk)
            else:
                batch.put(_ENTRY + sk, vb)
        next_seq = self.next_seq + len(events)
        oldest = max(self.oldest_seq, next_seq - self._capacity)
        first_kept = max(self.next_seq, oldest)
        for seq in range(first_kept, next_seq):
            batch.put(_JOURNAL + _SEQ.pack(seq), dumps(events[seq - self.next_seq]))
        drop_to = min(oldest, self.next_seq)
        if drop_to - self.oldest_seq > _POINT_DELETE_LIMIT:
            batch.delete_range(_JOURNAL + _SEQ.pack(self.oldest_seq),
                               _JOURNAL + _SEQ.pack(drop_to))
        else:
            for seq in range(self.oldest_seq, drop_to):
                batch.delete(_JOURNAL + _SEQ.pack(seq))
        batch.put(_META_COUNT, _SEQ.pack(count))
        batch.put(_META_NEXT_SEQ, _SEQ.pack(next_seq))
        batch.put(_META_OLDEST_SEQ, _SEQ.pack(oldest))
        db.write(batch)
        self._unsynced = True
        self.count, self.next_seq, self.oldest_seq = count, next_seq, oldest

    def entries(self, partitions: list[int] | None) -> Iterator[tuple[bytes, bytes]]:
        snapshot = self._open_db().snapshot()
        if partitions is None:
            ranges = [(_ENTRY, _ENTRY_END)]
        else:
            ranges = [(_ENTRY + _PREFIX.pack(p), _ENTRY + _PREFIX.pack(p + 1))
                      for p in partitions]
        return self._scan(snapshot, ranges)

    @staticmethod
    def _scan(snapshot: Snapshot,
              ranges: list[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        for start, end in ranges:
            read_opt = ReadOptions()
            read_opt.set_iterate_upper_bound(end)
            items = snapshot.items(from_key=start, read_opt=read_opt)
            for key, vb in cast(Iterator[tuple[bytes, bytes]], items):  # raw mode
                yield key[1:], vb

    def events(self, start: int, stop: int) -> list[_RawEvent]:
        if start >= stop:
            return []
        read_opt = ReadOptions()
        read_opt.set_iterate_upper_bound(_JOURNAL + _SEQ.pack(stop))
        items = self._open_db().items(from_key=_JOURNAL + _SEQ.pack(start), read_opt=read_opt)
        return [tuple(loads(raw)) for _, raw in items]

    def take_unsynced(self) -> bool:
        """Whether anything was written since the last sync; clears the flag (the caller holds
        the map's lock, then syncs outside it)."""
        unsynced, self._unsynced = self._unsynced, False
        return unsynced

    def sync(self) -> None:
        """Flushes and fsyncs the write-ahead log: every write so far survives a power loss."""
        db = self._db
        if db is None:
            return
        try:
            db.flush_wal(True)
        except Exception as e:  # RocksDB reports I/O errors as plain exceptions
            self._unsynced = True
            raise OSError(f"syncing the log of map {self._path} failed: {e}") from e

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()


def _rocksdb_options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    return options


def _storage_key(partition: int, kb: bytes) -> bytes:
    return _PREFIX.pack(partition) + kb


class KeyValueMap(MapSurface):
    """A named, thread-safe map whose changes are journaled. Get it from :class:`MapStore`.

    Every change appends one event per changed key to the journal, in the order the changes
    happened; the map change and its events are one atomic write (``put_all`` too). Iteration
    and the views see the map at one point in time.
    """

    def __init__(self, name: str, storage: _Storage) -> None:
        super().__init__(name)
        self._storage = storage
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._closed = False

    def __repr__(self) -> str:
        return f"KeyValueMap({self._name!r}, size={self.size()})"

    def _read(self, partition: int, kb: bytes) -> bytes | None:
        sk = _storage_key(partition, kb)
        with self._lock:
            return self._storage.get(sk)

    def _read_many(self, keys: list[tuple[int, bytes]]) -> list[bytes | None]:
        get = self._storage.get
        with self._lock:  # one point in time for all the keys
            return [get(_storage_key(p, kb)) for p, kb in keys]

    def _modify(self, partition: int, kb: bytes, change: Change) -> bytes | None:
        sk = _storage_key(partition, kb)
        with self._lock:
            old = self._storage.get(sk)
            new = change(old)
            if new is not KEEP:
                self._commit({sk: new}, [(kb, old, new, PUT if new is not None else REMOVE)],
                             self._storage.count + (old is None) - (new is None))
        return old

    def _put_entries(self, encoded: list[tuple[int, bytes, bytes]]) -> None:
        keyed = [(_storage_key(partition, kb), kb, vb) for partition, kb, vb in encoded]
        with self._lock:
            writes: dict[bytes, bytes | None] = {}
            events: list[_RawEvent] = []
            count = self._storage.count
            for sk, kb, vb in keyed:
                old = writes[sk] if sk in writes else self._storage.get(sk)
                count += old is None
                writes[sk] = vb
                events.append((kb, old, vb, PUT))
            self._commit(writes, events, count)

    def _entry_bytes(self, partitions: list[int] | None) -> Iterator[tuple[bytes, bytes]]:
        with self._lock:
            raw = self._storage.entries(partitions)
        return ((sk[2:], vb) for sk, vb in raw)

    def clear(self) -> None:
        """Remove every entry, one ``remove`` event per entry, in one atomic write."""
        with self._lock:
            writes: dict[bytes, bytes | None] = {}
            events: list[_RawEvent] = []
            for sk, vb in self._storage.entries(None):
                writes[sk] = None
                events.append((sk[2:], vb, None, REMOVE))
            if events:
                self._commit(writes, events, 0)

    def size(self) -> int:
        """The number of entries."""
        with self._lock:
            return self._storage.count

    def journal_read(self, from_seq: int, max_count: int) -> JournalBatch:
        """Up to ``max_count`` events starting at sequence ``from_seq``.

        When ``from_seq`` is older than the oldest retained event, reading starts at the oldest
        one and ``lost`` says how many requested events are gone: the caller decides whether
        that is acceptable. A ``from_seq`` past :meth:`journal_next_seq` is an error.
        """
        if max_count < 0:
            raise ValueError(f"max_count must be >= 0, got {max_count}")
        with self._lock:
            oldest, next_seq = self._storage.oldest_seq, self._storage.next_seq
            if from_seq < 0 or from_seq > next_seq:
                raise ValueError(
                    f"map {self._name!r}: from_seq {from_seq} outside the journal's sequences "
                    f"[0, {next_seq}]")
            start = max(from_seq, oldest)
            stop = min(start + max_count, next_seq)
            raw = self._storage.events(start, stop)
        events = [
            JournalEvent(start + i, loads(kb), decode_value(old), decode_value(new), kind)
            for i, (kb, old, new, kind) in enumerate(raw)
        ]
        return JournalBatch(events, start + len(events), start - from_seq)

    def journal_oldest_seq(self) -> int:
        """The sequence of the oldest retained event (equals the next one when empty)."""
        with self._lock:
            return self._storage.oldest_seq

    def journal_next_seq(self) -> int:
        """The sequence the next event will get: where a reader of new events only starts."""
        with self._lock:
            return self._storage.next_seq

    def wait_for_events(self, after_seq: int, timeout_s: float) -> bool:
        """Wait until the event with sequence ``after_seq`` exists, at most ``timeout_s``.

        Pass the ``next_seq`` of the last :class:`JournalBatch`. Returns whether such an event
        exists (it may already have been dropped by the capacity); False on timeout or close.
        """
        with self._changed:
            self._changed.wait_for(
                lambda: self._closed or self._storage.next_seq > after_seq, timeout_s)
            return not self._closed and self._storage.next_seq > after_seq

    def sync(self) -> None:
        """Make every change so far durable (see :meth:`MapStore.sync`)."""
        with self._lock:
            if self._closed:
                return
            if not self._storage.take_unsynced():
                return  # nothing written since the last sync
        # outside the lock: writers go on while the log is synced; what they add is synced
        # now or flagged for the next sync (a failed sync flags the map again)
        self._storage.sync()

    def close(self) -> None:
        """Close the storage; :meth:`MapStore.close` calls it."""
        with self._changed:
            if not self._closed:
                self._closed = True
                self._storage.close()
                self._changed.notify_all()

    def _commit(self, writes: dict[bytes, bytes | None], events: list[_RawEvent],
                count: int) -> None:
        if self._closed:
            raise RuntimeError(f"map {self._name!r} is closed")
        self._storage.commit(writes, events, count)
        self._changed.notify_all()


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"map name must be a non-empty str, got {name!r}")
    if name in (".", "..") or any(c in name for c in ("/", "\\", "\0")):
        raise ValueError(
            f"map name {name!r} is not valid: it names a directory, so it must not contain "
            "'/', '\\' or NUL, nor be '.' or '..'")
    return name


class MapStore:
    """The maps of one member, in memory (``data_dir`` None) or under ``data_dir/maps``.

    Maps are created on first use and, with a data directory, reopened with their contents and
    journal after a restart. ``journal_capacity`` bounds each map's journal; older events are
    dropped.
    """

    def __init__(self, data_dir: str | os.PathLike[str] | None,
                 journal_capacity: int = 1_000_000) -> None:
        if not isinstance(journal_capacity, int) or journal_capacity < 1:
            raise ValueError(f"journal_capacity must be an int >= 1, got {journal_capacity!r}")
        self._root = None if data_dir is None else os.path.join(os.fspath(data_dir), "maps")
        self._capacity = journal_capacity
        self._maps: dict[str, KeyValueMap] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def persistent(self) -> bool:
        """Whether the maps are stored on disk."""
        return self._root is not None

    def get_map(self, name: str) -> KeyValueMap:
        """The map called ``name``, created (or reopened from disk) on first use."""
        _check_name(name)
        with self._lock:
            if self._closed:
                raise RuntimeError("MapStore is closed")
            kv = self._maps.get(name)
            if kv is None:
                if self._root is None:
                    storage: _Storage = _MemoryStorage(self._capacity)
                else:
                    storage = _RocksStorage(os.path.join(self._root, name), self._capacity)
                kv = self._maps[name] = KeyValueMap(name, storage)
            return kv

    def map_names(self) -> list[str]:
        """Names of the maps in use or stored on disk, sorted."""
        with self._lock:
            names = set(self._maps)
        if self._root is not None and os.path.isdir(self._root):
            names.update(e.name for e in os.scandir(self._root) if e.is_dir())
        return sorted(names)

    def sync(self) -> None:
        """Makes every change made so far to any map durable: an fsync of the write-ahead log
        of each map changed since the last sync (nothing for maps in memory). Raises OSError
        when a log cannot be synced (a full disk); the map is synced at the next call."""
        with self._lock:
            maps = list(self._maps.values())
        for kv in maps:
            kv.sync()

    def close(self) -> None:
        """Close every map; the store and its maps are unusable afterwards."""
        with self._lock:
            self._closed = True
            maps, self._maps = list(self._maps.values()), {}
        for kv in maps:
            kv.close()

    def __enter__(self) -> "MapStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
