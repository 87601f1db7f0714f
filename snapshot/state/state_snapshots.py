"""Saving and restoring one named keyed state of a processor, whatever its backend.

With RocksDB state the snapshot entry is the backend's checkpoint files
(``snapshot/state/rocksdb_files.py``); a dict or the in-memory backend is saved entry by entry
by the processor itself (``save_to_snapshot`` with a :class:`StateSaver`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

from jetwake.engine.core.processor import BroadcastKey
from jetwake.snapshot.state.keyed_state import KeyedStateBackend
from jetwake.snapshot.state.rocksdb_backend import RocksDBStateBackend
from jetwake.snapshot.state.rocksdb_files import read_checkpoint_entries
from jetwake.snapshot.store.snapshot_files import SnapshotFiles

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.core.processor import ProcessorContext

__all__ = ["KeyedState", "state_snapshot_entries", "saved_state_files", "restore_keyed_state"]

#: a processor's keyed state: a backend (``ProcessorContext.keyed_state``) or a plain dict
KeyedState = KeyedStateBackend | dict[Any, Any]


def state_snapshot_entries(context: "ProcessorContext", name: str, state: KeyedState
                           ) -> Iterator[tuple[Any, Any]] | None:
    """The snapshot entry of the keyed state ``name`` as files, or None when it is saved entry
    by entry (a dict, the in-memory backend, or RocksDB with ``snapshot_as_files`` off).

    Phase 1: flushes the write-back cache in one WriteBatch, takes a RocksDB checkpoint and
    returns one entry ``(BroadcastKey((vertex, processor index, name)), SnapshotFiles)``. The
    key is a broadcast key because after a change of parallelism every processor may own some
    of the partitions in these files.
    """
    if not isinstance(state, RocksDBStateBackend) or not state.snapshot_as_files:
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


def restore_keyed_state(state: KeyedState, saved: list[SnapshotFiles],
                        owned_partitions: Iterable[int]) -> None:
    """Restores the ``owned_partitions`` of the saved checkpoints into ``state``: a RocksDB
    backend opens the files (:meth:`RocksDBStateBackend.restore_checkpoints`); any other state
    (a dict, or a backend in memory) receives their entries one by one."""
    if isinstance(state, RocksDBStateBackend):
        state.restore_checkpoints(saved, owned_partitions)
        return
    for key, value in read_checkpoint_entries(saved, owned_partitions):
        state[key] = value
