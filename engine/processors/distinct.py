"""Distinct: the first item of each key passes, later ones are dropped (seed 003 shuffles by
key first, so each key is seen by one processor)."""

from __future__ import annotations

from typing import Any, Callable

from ..processor import Inbox, Processor

__all__ = ["DistinctProcessor"]


class DistinctProcessor(Processor):
    def __init__(self, key_fn: Callable[[Any], Any] | None) -> None:
        self.key_fn = key_fn
        self.seen: set = set()

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self.outbox.has_room():
            return
        seen = self.seen
        out = []
        key_fn = self.key_fn
        for item in inbox.drain():
            k = item if key_fn is None else key_fn(item)
            if k not in seen:
                seen.add(k)
                out.append(item)
        self.outbox.offer_chunk(-1, out)
