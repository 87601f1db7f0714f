"""Snapshots of RocksDB keyed state as RocksDB's own files, and restores from them.

A snapshot of a :class:`~jetwake.snapshot.state.keyed_state.RocksDBStateBackend` is a RocksDB
checkpoint: after the write-back cache is flushed in one WriteBatch, RocksDB writes its memtable
out and creates a directory of hard links to its SST files (plus small copies of the MANIFEST,
CURRENT and OPTIONS files). The processor offers that directory as one snapshot entry,
``(BroadcastKey((vertex, processor index, state name)), SnapshotFiles)``, and the snapshot store
hard-links the files into the snapshot. SST files never change once written, so a file that
is still live at the next snapshot is the same inode again: each snapshot costs only the files
written since the previous one (what the flush and RocksDB's compactions produced).

Because the key of every entry starts with its partition id, one partition is one key range.
A restore therefore rebuilds a processor's database from the saved files of every processor
of the old execution: the saved set holding most of the partitions it owns now becomes its
database (hard links again, and a range deletion of the partitions it does not own); the
entries of its partitions in the other sets are copied over as raw bytes. The snapshot's own
files are only ever linked or copied from, never opened in place: RocksDB writes into the
directory of a database it opens.

The processor side (save and restore of one named keyed state, whatever the backend) is
:func:`state_snapshot_entries`, :func:`saved_state_files` and :func:`restore_keyed_state`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from jetwake.engine.core.partitioning import PARTITION_COUNT
from jetwake.engine.core.processor import BroadcastKey
from jetwake.engine.core.serialization import loads
from jetwake.snapshot.store.snapshot_files import SnapshotFiles, _check_name

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.core.processor import ProcessorContext

__all__ = [
    "CHECKPOINT_FORMAT", "checkpoint_meta", "checkpoint_partitions", "materialize",
    "partition_runs", "state_snapshot_entries", "saved_state_files", "restore_keyed_state",
    "read_checkpoint_entries",
]

CHECKPOINT_FORMAT = "jetwake-rocksdb-checkpoint"
CHECKPOINT_VERSION = 1

# files RocksDB writes once and never changes: linking them is safe. Every other file of a
# checkpoint (MANIFEST, CURRENT, OPTIONS, the write-ahead log) may be appended to, truncated or
# rewritten by a database opened on it, so it is copied.
_IMMUTABLE_SUFFIXES = (".sst", ".blob")


def checkpoint_meta(counts: list[int]) -> dict:
    """The ``meta`` of a checkpoint's :class:`SnapshotFiles`: its format and the number of
    entries of every non-empty partition, so a restore can skip saved sets holding none of its
    partitions without opening them."""
    return {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
            "partitions": [[p, c] for p, c in enumerate(counts) if c]}


def checkpoint_partitions(files: SnapshotFiles) -> dict[int, int]:
    """Partition -> entry count of a saved checkpoint; ValueError when ``files`` is not one."""
    meta = files.meta
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{files.directory} does not hold a RocksDB state checkpoint "
                         f"(meta {meta!r:.200})")
    if meta.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"the RocksDB state checkpoint in {files.directory} has version "
                         f"{meta.get('version')!r}; this jetwake reads version "
                         f"{CHECKPOINT_VERSION}")
    out: dict[int, int] = {}
    for entry in meta.get("partitions", ()):
        p, c = entry
        if not (isinstance(p, int) and 0 <= p < PARTITION_COUNT and isinstance(c, int)
                and c >= 0):
            raise ValueError(f"the RocksDB state checkpoint in {files.directory} lists a bad "
                             f"partition count {entry!r}")
        out[p] = c
    return out


def list_files(directory: str) -> list[str]:
    """Every file under ``directory``, as "/"-separated names relative to it, sorted."""
    names = []
    for root, _dirs, files in os.walk(directory):
        rel = os.path.relpath(root, directory)
        for f in files:
            names.append(f if rel == "." else f"{rel.replace(os.sep, '/')}/{f}")
    return sorted(names)


def materialize(files: SnapshotFiles, db_dir: str) -> None:
    """Builds a RocksDB directory ``db_dir`` (which must not exist) from saved checkpoint files:
    SST files are hard-linked (copied when linking fails), every other file is copied, so
    nothing the database does later can change the saved files."""
    if os.path.lexists(db_dir):
        raise FileExistsError(f"{db_dir} exists; a checkpoint is restored into a new directory")
    os.makedirs(db_dir)
    for name in files.files:
        _check_name(name)
        src = files.path(name)
        dst = os.path.join(db_dir, *name.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if name.endswith(_IMMUTABLE_SUFFIXES):
            try:
                os.link(src, dst)
                continue
            except OSError:
                pass  # another file system, or no links allowed: copy
        shutil.copyfile(src, dst)


def partition_runs(partitions: Iterable[int]) -> list[tuple[int, int]]:
    """Consecutive partitions as ``(first, last + 1)`` ranges: one key range each."""
    runs: list[tuple[int, int]] = []
    for p in sorted(set(partitions)):
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs


# --- the processor side ------------------------------------------------------------------------

def _uses_files(state: Any) -> bool:
    from jetwake.snapshot.state.keyed_state import RocksDBStateBackend
    return isinstance(state, RocksDBStateBackend) and state.snapshot_as_files


def state_snapshot_entries(context: "ProcessorContext", name: str, state: Any
                           ) -> Iterator[tuple[Any, Any]] | None:
    """The snapshot entry of the keyed state ``name`` as files, or None when it is saved entry
    by entry (a dict, the in-memory backend, or RocksDB with ``snapshot_as_files`` off).

    Phase 1: flushes the write-back cache in one WriteBatch, takes a RocksDB checkpoint and
    returns one entry ``(BroadcastKey((vertex, processor index, name)), SnapshotFiles)``. The
    key is a broadcast key because after a change of parallelism every processor may own some
    of the partitions in these files.
    """
    if not _uses_files(state):
        return None
    key = BroadcastKey((context.vertex_name, context.global_processor_index, name))
    return iter(((key, state.checkpoint()),))


def saved_state_files(key: Any, value: Any, name: str) -> SnapshotFiles | None:
    """``value`` when the restored entry ``(key, value)`` is saved files of the state ``name``
    (see :func:`state_snapshot_entries`), else None."""
    if type(value) is not SnapshotFiles or type(key) is not BroadcastKey:
        return None
    k = key.key
    if isinstance(k, (tuple, list)) and len(k) == 3 and k[2] == name:
        return value
    return None


def restore_keyed_state(state: Any, saved: list[SnapshotFiles],
                        owned_partitions: Iterable[int]) -> None:
    """Restores the ``owned_partitions`` of the saved checkpoints into ``state``: a RocksDB
    backend opens the files (:meth:`RocksDBStateBackend.restore_checkpoints`); any other state
    (a dict, or a backend in memory) receives their entries one by one."""
    from jetwake.snapshot.state.keyed_state import RocksDBStateBackend
    if isinstance(state, RocksDBStateBackend):
        state.restore_checkpoints(saved, owned_partitions)
        return
    for key, value in read_checkpoint_entries(saved, owned_partitions):
        state[key] = value


def read_checkpoint_entries(saved: list[SnapshotFiles], partitions: Iterable[int]
                            ) -> Iterator[tuple[Any, Any]]:
    """The (key, value) entries of ``partitions`` in saved checkpoints, read through a
    temporary copy of each (for state that does not live in RocksDB)."""
    from jetwake.snapshot.state.keyed_state import _rocksdb_options, _PREFIX
    from rocksdict import ReadOptions, Rdict
    wanted = set(partitions)
    for files in saved:
        present = [p for p, c in checkpoint_partitions(files).items() if c and p in wanted]
        if not present:
            continue
        tmp = tempfile.mkdtemp(prefix="jetwake-checkpoint-")
        db_dir = os.path.join(tmp, "db")
        try:
            materialize(files, db_dir)
            db = Rdict(db_dir, _rocksdb_options())
            try:
                for first, end in partition_runs(present):
                    read_opt = ReadOptions()
                    read_opt.set_iterate_upper_bound(_PREFIX.pack(end))
                    for kb, data in db.items(from_key=_PREFIX.pack(first), read_opt=read_opt):
                        yield loads(kb[2:]), loads(data)
            finally:
                db.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
