"""Named lists held by a member (Jet's IList): what ``Sinks.list`` writes to."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Iterable, Iterator, overload

__all__ = ["NamedList"]


class NamedList(Sequence[Any]):
    """A thread-safe, append-only-by-sinks list; reading gives a consistent view."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: list[Any] = []
        self._lock = threading.Lock()
        # writer id -> id of the last snapshot whose items it committed (exactly-once sinks)
        self._markers: dict[str, int] = {}

    def add_all(self, items: Iterable[Any]) -> None:
        with self._lock:
            self._items.extend(items)

    def add(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)

    def commit(self, items: list[Any], writer: str, snapshot_id: int) -> bool:
        """Appends ``items`` and records ``snapshot_id`` for ``writer`` in one step; does
        nothing (False) if that snapshot's items were committed already."""
        with self._lock:
            if self._markers.get(writer, -1) >= snapshot_id:
                return False
            self._items.extend(items)
            self._markers[writer] = snapshot_id
            return True

    def committed_snapshot(self, writer: str) -> int:
        with self._lock:
            return self._markers.get(writer, -1)

    def clear(self) -> None:
        with self._lock:
            self._items = []

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        with self._lock:
            return iter(list(self._items))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NamedList):
            return self._items == other._items
        if isinstance(other, (list, tuple)):
            return self._items == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"NamedList({self.name!r}, {len(self)} items)"
