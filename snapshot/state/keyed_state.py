"""Keyed state for stateful processors: the interface and the in-memory backend.

A stateful processor keeps one value per key. A backend stores each entry under
``partition id (2 bytes, big-endian) + dumps(key)``, so the entries of one partition are a
contiguous key range: they can be iterated per partition and handed to another processor when
parallelism or membership changes.

Two backends share one interface, :class:`KeyedStateBackend`:

- :class:`InMemoryStateBackend` (here) keeps everything in dicts; for small jobs and tests.
- :class:`~jetwake.snapshot.state.rocksdb_backend.RocksDBStateBackend` keeps state in RocksDB
  behind a bounded write-back cache, so state may be far larger than RAM; its snapshots are
  RocksDB checkpoints (``snapshot/state/rocksdb_files.py``).

Values are returned by reference, not copied. A processor that mutates a value it got from
:meth:`KeyedStateBackend.get` must ``put`` it again: without the ``put`` the change may be lost
whenever the entry leaves a cache, and it is never written by :meth:`flush`.

A backend belongs to one processor and is not thread-safe.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from typing import Any, Iterable, Iterator

from jetwake.engine.core.partitioning import PARTITION_COUNT, partition_of
from jetwake.engine.core.serialization import dumps

__all__ = [
    "KeyedStateBackend", "InMemoryStateBackend", "partition_prefix", "storage_key",
    "ENTRY_OVERHEAD_BYTES", "in_memory_state_factory", "PARTITION_PREFIX", "wanted_partitions",
]

PARTITION_PREFIX = struct.Struct(">H")
"""Packs a partition id into the prefix of its stored keys, unchecked: also the end of a key
range (``PARTITION_PREFIX.pack(PARTITION_COUNT)``); :func:`partition_prefix` checks the id."""

ENTRY_OVERHEAD_BYTES = 160
"""Estimated Python memory of one cache entry beyond its key and value bytes."""


def partition_prefix(partition: int) -> bytes:
    """The 2-byte big-endian prefix of every stored key of ``partition``."""
    if not isinstance(partition, int) or not 0 <= partition < PARTITION_COUNT:
        raise ValueError(f"partition must be an int in [0, {PARTITION_COUNT}), got {partition!r}")
    return PARTITION_PREFIX.pack(partition)


def storage_key(key: Any) -> bytes:
    """The stored form of ``key``: its partition prefix, then its serialized bytes."""
    return PARTITION_PREFIX.pack(partition_of(key)) + dumps(key)


def wanted_partitions(partitions: Iterable[int] | None) -> list[int]:
    """The partitions a backend's ``items(partitions)`` reads, sorted: every one for None;
    raises ValueError for an id that is no partition."""
    if partitions is None:
        return list(range(PARTITION_COUNT))
    wanted = sorted(set(partitions))
    for p in wanted:
        partition_prefix(p)
    return wanted


_ABSENT = object()


class KeyedStateBackend(ABC):
    """Key -> value state of one processor, addressable per partition.

    Keys and values are any values :func:`jetwake.engine.core.serialization.dumps` accepts. Two keys
    are the same key when their serialized bytes are equal (so ``1`` and ``1.0`` differ).
    """

    @abstractmethod
    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default``. Mutating it requires a ``put`` afterwards."""

    @abstractmethod
    def put(self, key: Any, value: Any) -> None:
        """Set the value of ``key``."""

    @abstractmethod
    def delete(self, key: Any) -> None:
        """Remove ``key``; no error when it is absent."""

    @abstractmethod
    def __contains__(self, key: Any) -> bool:
        """Whether ``key`` has a value."""

    @abstractmethod
    def __len__(self) -> int:
        """The exact number of keys."""

    @abstractmethod
    def items(self, partitions: Iterable[int] | None = None) -> Iterator[tuple[Any, Any]]:
        """Entries of the given partitions (all when None), partition by partition.

        Within a partition entries come in the order of their serialized keys, the same for
        every backend. Changes made while iterating may or may not be seen.
        """

    @abstractmethod
    def keys(self, partitions: Iterable[int] | None = None) -> Iterator[Any]:
        """Keys of the given partitions (all when None), in the order of :meth:`items`."""

    @abstractmethod
    def clear(self) -> None:
        """Remove every entry."""

    @abstractmethod
    def flush(self) -> None:
        """Make every change so far durable, atomically; snapshot phase 1 calls it."""

    @abstractmethod
    def close(self) -> None:
        """Flush and release resources; the backend is unusable afterwards."""

    @abstractmethod
    def destroy(self) -> None:
        """Close without flushing and delete any files."""

    def __iter__(self) -> Iterator[Any]:
        return self.keys()

    # the dict protocol, so a processor can hold either a dict or a backend
    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, _ABSENT)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:
        if key not in self:
            raise KeyError(key)
        self.delete(key)

    def pop(self, key: Any, *default: Any) -> Any:
        value = self.get(key, _ABSENT)
        if value is _ABSENT:
            if default:
                return default[0]
            raise KeyError(key)
        self.delete(key)
        return value

    def __enter__(self) -> "KeyedStateBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InMemoryStateBackend(KeyedStateBackend):
    """State in dicts, one per partition: bounded by RAM, gone with the process.

    Values are checked to serialize on ``put``, so a job that works here works on RocksDB.
    """

    def __init__(self) -> None:
        # one dict per partition: dumps(key) -> (key, value)
        self._parts: list[dict[bytes, tuple[Any, Any]]] = [{} for _ in range(PARTITION_COUNT)]
        self._count = 0

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._parts[partition_of(key)].get(dumps(key))
        return default if entry is None else entry[1]

    def put(self, key: Any, value: Any) -> None:
        part = self._parts[partition_of(key)]
        kb = dumps(key)
        dumps(value)
        if kb not in part:
            self._count += 1
        part[kb] = (key, value)

    def delete(self, key: Any) -> None:
        if self._parts[partition_of(key)].pop(dumps(key), None) is not None:
            self._count -= 1

    def __contains__(self, key: Any) -> bool:
        return dumps(key) in self._parts[partition_of(key)]

    def __len__(self) -> int:
        return self._count

    def items(self, partitions: Iterable[int] | None = None) -> Iterator[tuple[Any, Any]]:
        for p in wanted_partitions(partitions):
            part = self._parts[p]
            for kb in sorted(part):
                entry = part.get(kb)
                if entry is not None:
                    yield entry

    def keys(self, partitions: Iterable[int] | None = None) -> Iterator[Any]:
        return (k for k, _ in self.items(partitions))

    def clear(self) -> None:
        for part in self._parts:
            part.clear()
        self._count = 0

    def flush(self) -> None:
        """Nothing to do: in-memory state is never durable."""

    def close(self) -> None:
        self.clear()

    def destroy(self) -> None:
        self.clear()


def in_memory_state_factory(vertex: str, index: int, name: str) -> InMemoryStateBackend:
    """The state factory of jobs with ``JobConfig(state_backend="memory")``."""
    return InMemoryStateBackend()
