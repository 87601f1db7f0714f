"""Emitting many items cooperatively, a chunk at a time, across calls."""

from __future__ import annotations

from itertools import islice
from typing import Any, Iterable, Iterator

from jetwake.engine.core.processor import Outbox

__all__ = ["ChunkEmitter", "iter_chunks", "CHUNK_SIZE"]

CHUNK_SIZE = 1024


def iter_chunks(items: Iterable[Any], size: int = CHUNK_SIZE) -> Iterator[list[Any]]:
    """Yields lists of at most ``size`` items."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


class ChunkEmitter:
    """Offers the items of an iterable to an outbox while it has room; resumes next call.

    ``emit()`` returns True once every item has been offered.
    """

    __slots__ = ("_chunks", "_pending", "_ordinal")

    def __init__(self, items: Iterable[Any], ordinal: int = -1, size: int = CHUNK_SIZE) -> None:
        self._chunks = iter_chunks(items, size)
        self._pending: list[Any] | None = None
        self._ordinal = ordinal

    def emit(self, outbox: Outbox) -> bool:
        ordinal = self._ordinal
        while outbox.has_room(ordinal):
            chunk = self._pending if self._pending is not None else next(self._chunks, None)
            self._pending = None
            if chunk is None:
                return True
            outbox.offer_chunk(ordinal, chunk)
        if self._pending is None:
            self._pending = next(self._chunks, None)
            if self._pending is None:
                return True
        return False
