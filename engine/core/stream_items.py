"""What travels on the edge queues: control items in-band with the data (watermarks, snapshot
barriers, the end of a stream) and :data:`Timestamped`, the form of a data item that carries
its event time."""

from __future__ import annotations

import sys
from typing import Any, TypeAlias

__all__ = ["Watermark", "SnapshotBarrier", "DONE", "IDLE_TIMESTAMP", "IDLE_MESSAGE",
           "NO_WATERMARK", "Timestamped", "TIMESTAMP", "ITEM", "timestamped"]

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


Timestamped: TypeAlias = "tuple[int, Any]"
"""An item with its event time, ``(timestamp, item)``: how items travel between the stages of a
pipeline after ``with_timestamps`` (the timestamp is read once, where watermarks are inserted,
and every event-time stage downstream reads it from here). The planner knows which outputs
carry these (``ItemForm.TIMESTAMPED`` in engine/pipeline/planner.py) and takes the timestamps
off on the edge into a stage that works on plain items, so user functions never see them.

An exact 2-tuple, read by index (:data:`TIMESTAMP`, :data:`ITEM`) and built many at a time with
``zip``. Not a class of its own: CPython's collector untracks an exact tuple of untracked
values (ints, strings, other such tuples) the first time it sees it, but never an instance of a
tuple subclass (a NamedTuple included), so the millions of values waiting in the queues would
stay tracked and trigger full collections: a tuple subclass made the windows benchmark about
40% slower (docs/architecture.md, "How a pipeline becomes a DAG").
"""

TIMESTAMP = 0
"""The index of a :data:`Timestamped` value's event time."""
ITEM = 1
"""The index of a :data:`Timestamped` value's item."""


def timestamped(timestamp: int, item: Any) -> Timestamped:
    """The :data:`Timestamped` value of ``item`` at ``timestamp`` (loops build them with
    ``zip`` instead, without a call per item)."""
    return (timestamp, item)
