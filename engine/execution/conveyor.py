"""The bounded queue between two processors: a deque of chunks and control items.

One producer and one consumer per queue (Jet's one-to-one conveyor). CPython's deque
``append`` and ``popleft`` are atomic, and only the producer adds, so checking the length
before appending bounds the queue without a lock.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["ChunkQueue"]


class ChunkQueue:
    __slots__ = ("_dq", "capacity", "append", "popleft", "name")

    def __init__(self, capacity: int = 64, name: str = "") -> None:
        self._dq: deque[Any] = deque()
        self.capacity = capacity
        self.append = self._dq.append
        self.popleft = self._dq.popleft
        self.name = name

    def offer(self, entry: Any) -> bool:
        """Adds a chunk (list) or a control item; False when the queue is full."""
        if len(self._dq) >= self.capacity:
            return False
        self.append(entry)
        return True

    def __len__(self) -> int:
        return len(self._dq)

    def __bool__(self) -> bool:
        return bool(self._dq)

    def __repr__(self) -> str:
        return f"ChunkQueue({self.name}, {len(self._dq)}/{self.capacity})"
