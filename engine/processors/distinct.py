"""Distinct: the first item of each key passes, later ones are dropped (the planner shuffles
by key first, so each key is seen by one processor)."""

from __future__ import annotations

from typing import Any, Callable

from jetwake.engine.core.processor import Inbox, Processor
from jetwake.snapshot.protocol.state_saver import StateSaver

__all__ = ["DistinctProcessor", "DistinctEntries"]


class DistinctEntries:
    """The snapshot entries of a distinct stage, one codec for its processor and for the
    Spark backfill's hand-off: one entry per key seen."""

    @staticmethod
    def seen(key: Any) -> tuple[Any, bool]:
        return key, True


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

    _saver: StateSaver | None = None

    def save_to_snapshot(self) -> bool:
        if self._saver is None:
            self._saver = StateSaver(DistinctEntries.seen(k) for k in list(self.seen))
        if self._saver.save(self.outbox):
            self._saver = None
            return True
        return False

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        self.seen.update(k for k, _ in inbox.drain())
