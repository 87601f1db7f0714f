"""Named lists held by a member (Jet's IList): what ``Sinks.list`` writes to."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Iterable, Iterator

__all__ = ["NamedList"]


class NamedList(Sequence):
    """A thread-safe, append-only-by-sinks list; reading gives a consistent view."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: list = []
        self._lock = threading.Lock()

    def add_all(self, items: Iterable[Any]) -> None:
        with self._lock:
            self._items.extend(items)

    def add(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)

    def clear(self) -> None:
        with self._lock:
            self._items = []

    def __getitem__(self, index):  # type: ignore[override]
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
