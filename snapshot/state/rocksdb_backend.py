"""RocksDB keyed state behind a write-back cache (``JobConfig(state_backend="rocksdb")``).

:class:`RocksDBStateBackend` keeps state in RocksDB (rocksdict) behind a bounded write-back
cache, so state may be far larger than RAM while hot keys stay fast. :meth:`flush` writes every
cached change in one atomic WriteBatch; a snapshot then saves a RocksDB checkpoint
(:meth:`RocksDBStateBackend.checkpoint`: hard links to the immutable SST files) instead of the
entries, and a restore opens the saved files again
(:meth:`RocksDBStateBackend.restore_checkpoints`). The key layout is the one of
``snapshot/state/keyed_state.py``.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections import OrderedDict
from operator import itemgetter
from typing import Any, Iterable, Iterator, cast

from rocksdict import Checkpoint, ReadOptions, Rdict, WriteBatch, WriteOptions

from jetwake.engine.core.partitioning import PARTITION_COUNT
from jetwake.engine.core.serialization import dumps, loads
from jetwake.snapshot.state.keyed_state import (
    ENTRY_OVERHEAD_BYTES, PARTITION_PREFIX, KeyedStateBackend, storage_key, wanted_partitions,
)
from jetwake.snapshot.state.rocksdb_files import (
    checkpoint_meta, checkpoint_partitions, list_files, materialize, partition_runs,
    rocksdb_options,
)
from jetwake.snapshot.store.snapshot_files import SnapshotFiles

__all__ = ["RocksDBStateBackend"]

_COUNTS = struct.Struct(f">{PARTITION_COUNT}Q")
# partition ids stop at 270, so no entry key starts with 0xFFFF: room for the backend's own keys
_META_PREFIX = b"\xff\xff"
_META_COUNT = _META_PREFIX + b"count"  # the total, as written before per-partition counts
_META_COUNTS = _META_PREFIX + b"partition-counts"  # entries per partition, one >Q each
_ENTRIES_END = _META_PREFIX

_DEFAULT_CACHE_BYTES = 64 * 2**20


_ABSENT = object()


class _Entry:
    """One cached key: its value (or _ABSENT), whether it differs from disk, and its size."""

    __slots__ = ("value", "data", "dirty", "on_disk", "size")

    def __init__(self, value: Any, data: bytes | None, dirty: bool, on_disk: bool,
                 size: int) -> None:
        self.value = value
        self.data = data  # serialized value, kept while dirty
        self.dirty = dirty
        self.on_disk = on_disk  # whether RocksDB currently holds this key
        self.size = size


class RocksDBStateBackend(KeyedStateBackend):
    """State in RocksDB under ``path``, behind an LRU write-back cache of ``cache_bytes``.

    The cache holds recently used keys with their values (also remembered absences and
    deletions). Its size is estimated per entry as key bytes + serialized value bytes +
    :data:`ENTRY_OVERHEAD_BYTES`. When it exceeds ``cache_bytes``, least recently used entries
    are dropped down to 7/8 of the budget; changed ones among them are written to RocksDB first,
    in one small WriteBatch.

    Guarantees: after :meth:`flush` returns, every change made before it is on disk (synced
    WAL), written in one atomic batch together with the entry counts; after :meth:`checkpoint`
    returns, every change before it is in synced SST files. A crash afterwards leaves
    the state of that flush plus, possibly, some later changes that left the cache early:
    exactly-once recovery therefore restores state from the snapshot, not from this directory.
    Opening an existing ``path`` reopens its state.
    """

    def __init__(self, path: str | os.PathLike[str], cache_bytes: int = _DEFAULT_CACHE_BYTES
                 ) -> None:
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
        self._path = os.fspath(path)
        self._cache_bytes = cache_bytes
        self._low_water = cache_bytes - cache_bytes // 8
        self._cache: OrderedDict[bytes, _Entry] = OrderedDict()
        # the cached entries that differ from disk (entry.dirty): a flush writes these without
        # walking the whole cache
        self._dirty: dict[bytes, _Entry] = {}
        self._cached = 0
        os.makedirs(self._path, exist_ok=True)
        self._options = rocksdb_options()
        self._db: Rdict | None = Rdict(self._path, self._options)
        # entries on disk per partition: written in every batch, so a restore that keeps some
        # partitions of a saved database knows their exact count without reading them
        self._disk_counts = _read_counts(self._db)
        self._count = sum(self._disk_counts)
        self._sync = WriteOptions()
        self._sync.sync = True
        self._no_wal = WriteOptions()
        # a property at run time, which rocksdict's hints declare a method
        self._no_wal.disable_wal = True  # type: ignore[method-assign, assignment]
        self._checkpoints = f"{self._path}.checkpoints"
        self._checkpoint_seq = 0

    @property
    def path(self) -> str:
        """The RocksDB directory."""
        return self._path

    @property
    def cached_bytes(self) -> int:
        """The estimated size of the cache now."""
        return self._cached

    def get(self, key: Any, default: Any = None) -> Any:
        kb = storage_key(key)
        entry = self._cache.get(kb)
        if entry is None:
            entry = self._load(kb)
        else:
            self._cache.move_to_end(kb)
        return default if entry.value is _ABSENT else entry.value

    def __contains__(self, key: Any) -> bool:
        kb = storage_key(key)
        entry = self._cache.get(kb)
        if entry is None:
            entry = self._load(kb)
        else:
            self._cache.move_to_end(kb)
        return entry.value is not _ABSENT

    def put(self, key: Any, value: Any) -> None:
        kb = storage_key(key)
        data = dumps(value)
        size = len(kb) + len(data) + ENTRY_OVERHEAD_BYTES
        entry = self._cache.get(kb)
        if entry is None:
            on_disk = self._on_disk(kb)
            if not on_disk:
                self._count += 1
            self._cache[kb] = self._dirty[kb] = _Entry(value, data, True, on_disk, size)
            self._cached += size
        else:
            self._cache.move_to_end(kb)
            if entry.value is _ABSENT:
                self._count += 1
            entry.value = value
            entry.data = data
            entry.dirty = True
            self._dirty[kb] = entry
            self._cached += size - entry.size
            entry.size = size
        if self._cached > self._cache_bytes:
            self._evict()

    def delete(self, key: Any) -> None:
        kb = storage_key(key)
        size = len(kb) + ENTRY_OVERHEAD_BYTES
        entry = self._cache.get(kb)
        if entry is None:
            on_disk = self._on_disk(kb)
            if on_disk:
                self._count -= 1
                self._cache[kb] = self._dirty[kb] = _Entry(_ABSENT, None, True, True, size)
            else:
                self._cache[kb] = _Entry(_ABSENT, None, False, False, size)
            self._cached += size
        else:
            self._cache.move_to_end(kb)
            if entry.value is not _ABSENT:
                self._count -= 1
            entry.value = _ABSENT
            entry.data = None
            entry.dirty = entry.on_disk
            if entry.on_disk:
                self._dirty[kb] = entry
            else:
                self._dirty.pop(kb, None)
            self._cached += size - entry.size
            entry.size = size
        if self._cached > self._cache_bytes:
            self._evict()

    def __len__(self) -> int:
        return self._count

    def items(self, partitions: Iterable[int] | None = None) -> Iterator[tuple[Any, Any]]:
        return self._scan(partitions, with_values=True)

    def keys(self, partitions: Iterable[int] | None = None) -> Iterator[Any]:
        return self._scan(partitions, with_values=False)

    def clear(self) -> None:
        db = self._open_db()
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(b"\x00\x00", _ENTRIES_END)
        counts = [0] * PARTITION_COUNT
        batch.put(_META_COUNTS, _COUNTS.pack(*counts))
        db.write(batch)
        self._cache.clear()
        self._dirty.clear()
        self._cached = 0
        self._disk_counts = counts
        self._count = 0

    def flush(self) -> None:
        """Write every cached change and the entry count in one synced, atomic WriteBatch."""
        self._flush(self._sync)

    def _flush(self, options: WriteOptions) -> None:
        db = self._open_db()
        if self._dirty:
            self._write(db, self._dirty.items(), options)
            self._dirty.clear()

    # --- snapshots as RocksDB files ----------------------------------------------------------

    snapshot_as_files: bool = True
    """Whether processors snapshot this state as a RocksDB checkpoint (:meth:`checkpoint`).
    False makes them save it entry by entry, as with the in-memory backend: every entry read
    back and serialized (the benchmark measures both paths; set it on the class)."""

    def checkpoint(self) -> SnapshotFiles:
        """Flushes the write-back cache (one WriteBatch) and takes a RocksDB checkpoint: hard
        links to the database's SST files and copies of its small metadata files, in a new
        directory beside the database. The result is what a snapshot saves.

        The directory is deleted by the next checkpoint (by then the snapshot store has linked
        the files into its own directory) and by :meth:`destroy`.
        """
        db = self._open_db()
        # the batch skips the write-ahead log: the checkpoint writes the memtable out to
        # synced SST files at once, which is what makes the batch durable
        self._flush(self._no_wal)
        os.makedirs(self._checkpoints, exist_ok=True)
        for old in os.listdir(self._checkpoints):
            shutil.rmtree(os.path.join(self._checkpoints, old), ignore_errors=True)
        self._checkpoint_seq += 1
        target = os.path.join(self._checkpoints, str(self._checkpoint_seq))
        # RocksDB writes the memtable out first, so the files hold every entry of the flush
        Checkpoint(db).create_checkpoint(target)
        return SnapshotFiles(target, list_files(target), checkpoint_meta(self._disk_counts))

    def restore_checkpoints(self, checkpoints: Iterable[SnapshotFiles],
                            owned_partitions: Iterable[int]) -> None:
        """Replaces this (empty) backend's database with the ``owned_partitions`` of saved
        checkpoints (of one or more processors of an earlier execution).

        The checkpoint holding most entries of those partitions becomes the database (its SST
        files hard-linked, the rest copied; the partitions not owned are range-deleted); the
        owned partitions of the others are copied in as raw bytes. The saved files are never
        modified. Raises ValueError when two checkpoints hold the same partition, or when this
        backend already has entries.
        """
        owned = set(wanted_partitions(owned_partitions))
        if self._count or self._dirty:
            raise ValueError(f"restore_checkpoints needs an empty backend; {self._path} has "
                             f"{self._count} entries")
        plans: list[tuple[SnapshotFiles, list[int], int]] = []
        holder: dict[int, str] = {}
        for files in checkpoints:
            if not isinstance(files, SnapshotFiles):
                raise TypeError(f"restore_checkpoints takes SnapshotFiles, got "
                                f"{type(files).__name__}")
            saved = checkpoint_partitions(files)
            mine = sorted(p for p, c in saved.items() if c and p in owned)
            for p in mine:
                if p in holder:
                    raise ValueError(
                        f"partition {p} is saved twice, in {holder[p]} and {files.directory}: "
                        "the checkpoints are not of one snapshot's processors")
                holder[p] = files.directory
            if mine:
                plans.append((files, mine, sum(saved[p] for p in mine)))
        if not plans:
            return
        plans.sort(key=lambda plan: -plan[2])
        base, base_parts, _ = plans[0]
        # the fresh, empty database makes room for the base checkpoint
        self._drop_db()
        Rdict.destroy(self._path, self._options)
        shutil.rmtree(self._path, ignore_errors=True)
        materialize(base, self._path)
        db = self._db = Rdict(self._path, self._options)
        counts = _read_counts(db)
        batch = WriteBatch(raw_mode=True)
        not_owned = [p for p in range(PARTITION_COUNT) if p not in owned]
        for first, end in partition_runs(not_owned):
            if any(counts[first:end]):
                batch.delete_range(PARTITION_PREFIX.pack(first), PARTITION_PREFIX.pack(end))
        for p in not_owned:
            counts[p] = 0
        batch.put(_META_COUNTS, _COUNTS.pack(*counts))
        db.write(batch)
        for files, parts, _ in plans[1:]:
            self._copy_partitions(db, files, parts, counts)
        # one synced write: the counts, and with the log every copied entry before them
        db.put(_META_COUNTS, _COUNTS.pack(*counts), self._sync)
        self._disk_counts = counts
        self._count = sum(counts)

    def _copy_partitions(self, db: Rdict, files: SnapshotFiles, parts: list[int],
                         counts: list[int]) -> None:
        """Copies the entries of ``parts`` from a saved checkpoint into ``db``, raw."""
        tmp = f"{self._path}.restore"
        shutil.rmtree(tmp, ignore_errors=True)
        materialize(files, tmp)
        src = Rdict(tmp, self._options)
        try:
            src_counts = _read_counts(src)
            batch = WriteBatch(raw_mode=True)
            for first, end in partition_runs(parts):
                read_opt = ReadOptions()
                read_opt.set_iterate_upper_bound(PARTITION_PREFIX.pack(end))
                for kb, data in src.items(from_key=PARTITION_PREFIX.pack(first), read_opt=read_opt):
                    batch.put(kb, data)
                    if len(batch) >= 10_000:
                        db.write(batch)
                        batch = WriteBatch(raw_mode=True)
            if len(batch):
                db.write(batch)
            for p in parts:
                counts[p] = src_counts[p]
        finally:
            src.close()
            Rdict.destroy(tmp, self._options)
            shutil.rmtree(tmp, ignore_errors=True)

    def close(self) -> None:
        """Flush, then close the database; calling it again does nothing."""
        if self._db is None:
            return
        self.flush()
        self._drop_db()

    def destroy(self) -> None:
        """Close without flushing and delete the directory."""
        if self._db is not None:
            self._drop_db()
        Rdict.destroy(self._path, self._options)
        shutil.rmtree(self._path, ignore_errors=True)
        shutil.rmtree(self._checkpoints, ignore_errors=True)
        shutil.rmtree(f"{self._path}.restore", ignore_errors=True)

    def _drop_db(self) -> None:
        db, self._db = self._db, None
        self._cache.clear()
        self._dirty.clear()
        self._cached = 0
        assert db is not None  # dropped only while open
        db.close()

    def _open_db(self) -> Rdict:
        if self._db is None:
            raise RuntimeError(f"state backend at {self._path} is closed")
        return self._db

    def _on_disk(self, kb: bytes) -> bool:
        db = self._open_db()
        if not db.key_may_exist(kb):
            return False
        return db.get(kb) is not None

    def _load(self, kb: bytes) -> _Entry:
        data = self._open_db().get(kb)
        if data is None:
            entry = _Entry(_ABSENT, None, False, False, len(kb) + ENTRY_OVERHEAD_BYTES)
        else:
            entry = _Entry(loads(data), None, False, True,
                           len(kb) + len(data) + ENTRY_OVERHEAD_BYTES)
        self._cache[kb] = entry
        self._cached += entry.size
        if self._cached > self._cache_bytes:
            self._evict()
        return entry

    def _evict(self) -> None:
        db = self._open_db()
        cache = self._cache
        dirty: list[tuple[bytes, _Entry]] = []
        while self._cached > self._low_water and cache:
            kb, entry = cache.popitem(last=False)
            self._cached -= entry.size
            if entry.dirty:
                dirty.append((kb, entry))
                del self._dirty[kb]
        if dirty:
            self._write(db, dirty, None)

    def _write(self, db: Rdict, dirty: Iterable[tuple[bytes, _Entry]],
               options: WriteOptions | None) -> None:
        # ``dirty`` is iterated twice; a dict's items() view, not a list of new tuples, for a
        # flush of many entries
        batch = WriteBatch(raw_mode=True)
        counts = self._disk_counts[:]
        for kb, entry in dirty:
            if entry.value is _ABSENT:
                batch.delete(kb)
                counts[kb[0] << 8 | kb[1]] -= 1
            elif entry.on_disk:
                batch.put(kb, entry.data)
            else:
                batch.put(kb, entry.data)
                counts[kb[0] << 8 | kb[1]] += 1
        batch.put(_META_COUNTS, _COUNTS.pack(*counts))
        if options is None:
            db.write(batch)
        else:
            db.write(batch, options)
        self._disk_counts = counts
        for _, entry in dirty:
            entry.on_disk = entry.value is not _ABSENT
            entry.dirty = False
            entry.data = None

    def _scan(self, partitions: Iterable[int] | None, with_values: bool) -> Iterator[Any]:
        wanted = wanted_partitions(partitions)
        db = self._open_db()
        prefixes = {PARTITION_PREFIX.pack(p) for p in wanted}
        cached: dict[bytes, list[tuple[bytes, Any]]] = {}
        for kb, entry in self._cache.items():
            prefix = kb[:2]
            if prefix in prefixes:
                cached.setdefault(prefix, []).append((kb, entry.value))
        return self._merge(db, wanted, cached, with_values)

    @staticmethod
    def _merge(db: Rdict, wanted: list[int], cached: dict[bytes, list[tuple[bytes, Any]]],
               with_values: bool) -> Iterator[Any]:
        for p in wanted:
            prefix = PARTITION_PREFIX.pack(p)
            overlay = sorted(cached.get(prefix, ()), key=itemgetter(0))
            read_opt = ReadOptions()
            read_opt.set_iterate_upper_bound(PARTITION_PREFIX.pack(p + 1))
            disk: Iterator[tuple[Any, Any]]
            if with_values:
                disk = db.items(from_key=prefix, read_opt=read_opt)
            else:
                disk = ((k, None) for k in db.keys(from_key=prefix, read_opt=read_opt))
            i, n = 0, len(overlay)
            for kb, data in cast(Iterator[tuple[bytes, Any]], disk):  # raw mode: bytes keys
                while i < n and overlay[i][0] < kb:
                    ckb, value = overlay[i]
                    i += 1
                    if value is not _ABSENT:
                        yield (loads(ckb[2:]), value) if with_values else loads(ckb[2:])
                if i < n and overlay[i][0] == kb:
                    value = overlay[i][1]
                    i += 1
                    if value is not _ABSENT:
                        yield (loads(kb[2:]), value) if with_values else loads(kb[2:])
                    continue
                yield (loads(kb[2:]), loads(data)) if with_values else loads(kb[2:])
            for ckb, value in overlay[i:]:
                if value is not _ABSENT:
                    yield (loads(ckb[2:]), value) if with_values else loads(ckb[2:])


def _read_counts(db: Rdict) -> list[int]:
    """Entries per partition stored in ``db``; counted once by a key scan in a database
    written before the per-partition counts existed."""
    raw = db.get(_META_COUNTS)
    if raw is not None:
        if len(raw) != _COUNTS.size:
            raise ValueError(f"the entry counts in {db.path()} are for another partition count "
                             f"({len(raw) // 8}, this version has {PARTITION_COUNT})")
        return list(_COUNTS.unpack(raw))
    counts = [0] * PARTITION_COUNT
    if db.get(_META_COUNT) is not None:
        read_opt = ReadOptions()
        read_opt.set_iterate_upper_bound(_ENTRIES_END)
        for kb in cast(Iterator[bytes], db.keys(from_key=b"\x00\x00", read_opt=read_opt)):
            counts[kb[0] << 8 | kb[1]] += 1
    return counts
