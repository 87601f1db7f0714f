"""Control items that travel in-band with the data, between chunks, on every edge queue."""

from __future__ import annotations

import sys

__all__ = ["Watermark", "SnapshotBarrier", "DONE", "IDLE_TIMESTAMP", "IDLE_MESSAGE",
           "NO_WATERMARK"]

IDLE_TIMESTAMP = sys.maxsize
"""A watermark with this timestamp says "this input is idle": coalescing ignores it."""

NO_WATERMARK = -(2**63)
"""The event time of an input before its first watermark."""


class Watermark:
    """Event time has reached ``timestamp`` on this input: no item older than it follows."""

    __slots__ = ("timestamp",)

    def __init__(self, timestamp: int) -> None:
        self.timestamp = timestamp

    @property
    def is_idle(self) -> bool:
        return self.timestamp == IDLE_TIMESTAMP

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Watermark) and other.timestamp == self.timestamp

    def __hash__(self) -> int:
        return hash(("wm", self.timestamp))

    def __repr__(self) -> str:
        return "Watermark(IDLE)" if self.is_idle else f"Watermark({self.timestamp})"


IDLE_MESSAGE = Watermark(IDLE_TIMESTAMP)


class SnapshotBarrier:
    """Marks the point in a stream where snapshot ``snapshot_id`` is taken."""

    __slots__ = ("snapshot_id", "is_terminal")

    def __init__(self, snapshot_id: int, is_terminal: bool = False) -> None:
        self.snapshot_id = snapshot_id
        self.is_terminal = is_terminal

    def __repr__(self) -> str:
        return f"SnapshotBarrier({self.snapshot_id}{', terminal' if self.is_terminal else ''})"


class _Done:
    """The end of a stream: the upstream processor has completed."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DONE"

    def __reduce__(self) -> str:
        return "DONE"


DONE = _Done()
