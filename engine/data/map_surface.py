"""The dict-like surface of a named map, shared by a member's own maps
(:class:`~jetwake.engine.data.named_maps.KeyValueMap`) and the cluster's maps in Kafka
(``ClusterMap`` in engine/cluster/cluster_maps.py).

:class:`MapSurface` holds what both offer the same way: ``get``/``put``/``merge``/``pop`` and
the rest of the mapping API, the checks of their arguments and the encoding of keys and values.
Each kind of map implements only a few primitives over serialized keys and values (read one
entry, change one entry under its write lock, write many, list the entries of some
partitions, count them); how atomic a change is, and how it is journaled, is the map's own.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import ItemsView, KeysView, MutableMapping, ValuesView
from enum import Enum
from typing import Any, Callable, Final, Iterable, Iterator, Mapping

from jetwake.engine.core.partitioning import PARTITION_COUNT, partition_of
from jetwake.engine.core.serialization import dumps, loads

__all__ = ["MapSurface", "KEEP", "Change", "decode_value"]


class _Keep(Enum):
    """The type of :data:`KEEP`."""

    KEEP = "keep"


#: what a :data:`Change` returns to leave the entry as it is: nothing is written
KEEP: Final = _Keep.KEEP

#: given an entry's serialized value (None when absent), its new one: bytes to store, None to
#: remove it, or :data:`KEEP`
Change = Callable[[bytes | None], bytes | None | _Keep]


def _key_bytes(key: Any) -> tuple[int, bytes]:
    kb = dumps(key)
    return partition_of(key), kb


def _value_bytes(value: Any) -> bytes:
    if value is None:
        raise ValueError("None is not a valid map value (it means absent): use remove()")
    return dumps(value)


def decode_value(vb: bytes | None) -> Any:
    """A stored value decoded (None: no value)."""
    return None if vb is None else loads(vb)


class _ItemsView(ItemsView[Any, Any]):
    _mapping: MapSurface  # set by ItemsView.__init__

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self._mapping.entries()


class _ValuesView(ValuesView[Any]):
    _mapping: MapSurface  # set by ValuesView.__init__

    def __iter__(self) -> Iterator[Any]:
        return (v for _, v in self._mapping.entries())


class MapSurface(MutableMapping[Any, Any]):
    """A named mutable mapping whose keys and values are stored serialized; reads return fresh
    copies and ``None`` is not a value (it means "absent").

    A subclass implements the primitives :meth:`_read`, :meth:`_modify`, :meth:`_put_entries`,
    :meth:`_entry_bytes` and :meth:`size`, plus ``clear`` and its journal.
    """

    _MISSING = object()

    #: whether a read may wait for the network (a cluster's map asks Kafka for its topic's
    #: end first): a processor reading such a map runs on a thread of its own
    remote_reads = False

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        """The map's name."""
        return self._name

    # -- the primitives -------------------------------------------------------------------

    @abstractmethod
    def _read(self, partition: int, kb: bytes) -> bytes | None:
        """The serialized value of the key serialized as ``kb`` (in ``partition``), or None."""

    @abstractmethod
    def _modify(self, partition: int, kb: bytes, change: Change) -> bytes | None:
        """Applies ``change`` to the key's current value under the map's write lock, writing
        what it returns unless :data:`KEEP`; the value before, serialized (None if absent)."""

    @abstractmethod
    def _put_entries(self, encoded: list[tuple[int, bytes, bytes]]) -> None:
        """Stores (partition, serialized key, serialized value) entries, in order (not empty)."""

    @abstractmethod
    def _entry_bytes(self, partitions: list[int] | None) -> Iterator[tuple[bytes, bytes]]:
        """Serialized (key, value) pairs of ``partitions`` (sorted; all when None) at one point
        in time, ordered by partition, then by serialized key."""

    @abstractmethod
    def size(self) -> int:
        """The number of entries."""

    # -- reading --------------------------------------------------------------------------

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        vb = self._read(*_key_bytes(key))
        return default if vb is None else loads(vb)

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """The values of those of ``keys`` the map holds, as a dict, read at once: a cluster's
        map catches up with its topic once for all of them, not once per key (Jet's
        ``getAll``)."""
        wanted = list(dict.fromkeys(keys))
        found = self._read_many([_key_bytes(k) for k in wanted])
        return {k: loads(vb) for k, vb in zip(wanted, found) if vb is not None}

    def _read_many(self, keys: list[tuple[int, bytes]]) -> list[bytes | None]:
        """The serialized values of ``(partition, serialized key)`` pairs, in order (None:
        absent); one :meth:`_read` each unless the map reads them together."""
        return [self._read(p, kb) for p, kb in keys]

    def __getitem__(self, key: Any) -> Any:
        vb = self._read(*_key_bytes(key))
        if vb is None:
            raise KeyError(key)
        return loads(vb)

    def __contains__(self, key: Any) -> bool:
        return self._read(*_key_bytes(key)) is not None

    def __len__(self) -> int:
        return self.size()

    def entries(self, partitions: Iterable[int] | None = None) -> Iterator[tuple[Any, Any]]:
        """(key, value) pairs of the given partitions (all when None), at one point in time.

        Ordered by partition, then by serialized key. A partitioned batch source reads the
        partitions its processor owns.
        """
        wanted = None
        if partitions is not None:
            wanted = sorted(set(partitions))
            bad = [p for p in wanted if not (isinstance(p, int) and 0 <= p < PARTITION_COUNT)]
            if bad:
                raise ValueError(f"partitions must be in [0, {PARTITION_COUNT}), got {bad}")
        return ((loads(kb), loads(vb)) for kb, vb in self._entry_bytes(wanted))

    def __iter__(self) -> Iterator[Any]:
        return (k for k, _ in self.entries())

    def keys(self) -> KeysView[Any]:
        return KeysView(self)

    def items(self) -> ItemsView[Any, Any]:
        return _ItemsView(self)

    def values(self) -> ValuesView[Any]:
        return _ValuesView(self)

    # -- writing --------------------------------------------------------------------------

    def put(self, key: Any, value: Any) -> Any:
        """Store ``value`` under ``key``; the previous value, or None."""
        partition, kb = _key_bytes(key)
        vb = _value_bytes(value)
        return decode_value(self._modify(partition, kb, lambda old: vb))

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def put_all(self, entries: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        """Store many entries, one journal event each, in order (whether as one atomic write
        depends on the map: see its class)."""
        pairs = entries.items() if isinstance(entries, Mapping) else entries
        encoded = [(*_key_bytes(k), _value_bytes(v)) for k, v in pairs]
        if encoded:
            self._put_entries(encoded)

    def update(self, other: Any = (), /, **kwds: Any) -> None:
        """Like ``dict.update``, as one :meth:`put_all`."""
        if isinstance(other, Mapping):
            pairs = list(other.items())
        elif hasattr(other, "keys"):
            pairs = [(k, other[k]) for k in other.keys()]
        else:
            pairs = list(other)
        pairs.extend(kwds.items())
        self.put_all(pairs)

    def put_if_absent(self, key: Any, value: Any) -> Any:
        """Store ``value`` only when ``key`` is absent; the existing value, or None if stored."""
        partition, kb = _key_bytes(key)
        vb = _value_bytes(value)
        return decode_value(self._modify(partition, kb, lambda old: vb if old is None else KEEP))

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, storing ``default`` first when absent."""
        existing = self.put_if_absent(key, default)
        return default if existing is None else existing

    def remove(self, key: Any) -> Any:
        """Remove ``key``; its previous value, or None when it was absent (nothing is
        written then)."""
        partition, kb = _key_bytes(key)
        return decode_value(self._modify(partition, kb, lambda old: KEEP if old is None else None))

    def __delitem__(self, key: Any) -> None:
        if self.remove(key) is None:
            raise KeyError(key)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        """Remove ``key`` and return its value (or ``default``; KeyError without one)."""
        old = self.remove(key)
        if old is not None:
            return old
        if default is self._MISSING:
            raise KeyError(key)
        return default

    def merge(self, key: Any, value: Any, merge_fn: Callable[[Any, Any], Any]) -> Any:
        """Store ``merge_fn(old, value)``, or ``value`` when absent; None from it removes.

        Returns the new value (None when the key ends up absent). ``merge_fn`` runs under the
        map's write lock: it must be quick and must not use this map.
        """
        partition, kb = _key_bytes(key)
        new: Any = None

        def change(old: bytes | None) -> bytes | None | _Keep:
            nonlocal new
            new = value if old is None else merge_fn(loads(old), value)
            if new is None:
                return KEEP if old is None else None
            return _value_bytes(new)

        self._modify(partition, kb, change)
        return new
