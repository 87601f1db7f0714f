"""One input ordinal of a processor: the queues from every upstream processor, drained together.

Data chunks go into the processor's inbox; watermarks go to the tasklet's coalescer; a DONE
marks a queue finished; a snapshot barrier is recorded, and under exactly-once the queue is not
drained further until every input has delivered the same barrier (alignment; see
docs/fault-tolerance.md, "The two phases").
"""

from __future__ import annotations

from typing import Any

from jetwake.engine.core.stream_items import DONE, SnapshotBarrier, Watermark
from jetwake.engine.execution.conveyor import ChunkQueue
from jetwake.engine.execution.watermark_coalescer import WatermarkCoalescer

__all__ = ["InboundEdgeStream"]


class InboundEdgeStream:
    __slots__ = ("ordinal", "priority", "queues", "_done", "_live", "_offset", "_coalescer",
                 "_align", "_barrier", "_blocked", "_next")

    def __init__(self, ordinal: int, priority: int, queues: list[ChunkQueue],
                 coalescer: WatermarkCoalescer, queue_offset: int, align_barriers: bool) -> None:
        self.ordinal = ordinal
        self.priority = priority
        self.queues = queues
        self._done = [False] * len(queues)
        self._live = len(queues)
        self._coalescer = coalescer
        self._offset = queue_offset  # this edge's first index in the coalescer
        self._align = align_barriers
        self._barrier = [-1] * len(queues)  # last snapshot id seen per queue
        self._blocked = [False] * len(queues)
        self._next = 0  # queue to drain first next time, for fairness

    @property
    def is_done(self) -> bool:
        return self._live == 0

    def drain(self, sink: list[Any], limit: int) -> tuple[bool, int | None]:
        """Moves items into ``sink`` until ``limit``; returns (progress, coalesced watermark)."""
        progress = False
        new_wm = None
        queues = self.queues
        n = len(queues)
        start = self._next
        for k in range(n):
            i = (start + k) % n
            if self._done[i] or self._blocked[i]:
                continue
            q = queues[i]
            popleft = q.popleft
            while q and len(sink) < limit:
                entry = popleft()
                progress = True
                if type(entry) is list:
                    sink.extend(entry)
                elif entry is DONE:
                    self._done[i] = True
                    self._live -= 1
                    wm = self._coalescer.queue_done(self._offset + i)
                    if wm is not None:
                        new_wm = wm
                    break
                elif type(entry) is Watermark:
                    wm = self._coalescer.observe(self._offset + i, entry.timestamp)
                    if wm is not None:
                        new_wm = wm
                        # stop at the watermark: what follows it in this queue is drained
                        # only after the processor has seen the watermark (Jet does so too)
                        break
                elif type(entry) is SnapshotBarrier:
                    self._barrier[i] = entry.snapshot_id
                    # a terminal barrier is always aligned: nothing after it may be processed
                    if self._align or entry.is_terminal:
                        self._blocked[i] = True
                        break
                else:
                    raise TypeError(f"unexpected entry in a queue: {entry!r}")
            if len(sink) >= limit:
                self._next = i
                break
        return progress, new_wm

    def has_barrier(self, snapshot_id: int) -> bool:
        """Whether every queue that has not ended delivered barrier ``snapshot_id``."""
        for i, sid in enumerate(self._barrier):
            if not self._done[i] and sid < snapshot_id:
                return False
        return True

    def unblock(self) -> None:
        self._blocked = [False] * len(self.queues)
