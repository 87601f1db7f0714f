"""Saving a large state to a snapshot cooperatively, a chunk of entries per call."""

from __future__ import annotations

from typing import Any, Iterable

from jetwake.engine.core.chunk_emitter import CHUNK_SIZE, iter_chunks
from jetwake.engine.core.processor import Outbox

__all__ = ["StateSaver"]


class StateSaver:
    """``save(outbox)`` offers (key, value) entries until done (True) or the snapshot buffer
    is full (False: call again). Start a new saver for each snapshot."""

    __slots__ = ("_chunks", "_pending")

    def __init__(self, entries: Iterable[tuple[Any, Any]]) -> None:
        self._chunks = iter_chunks(entries, CHUNK_SIZE)
        self._pending: list[Any] | None = None

    def save(self, outbox: Outbox) -> bool:
        while True:
            chunk = self._pending if self._pending is not None else next(self._chunks, None)
            if chunk is None:
                return True
            if not outbox.offer_all_to_snapshot(chunk):
                self._pending = chunk
                return False
            self._pending = None
