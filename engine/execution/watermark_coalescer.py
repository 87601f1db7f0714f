"""Coalesces watermarks of several input queues into one (docs/windowing.md, "Watermarks").

The output watermark is the minimum over the inputs that are neither done nor idle. When every
live input is idle, the output is the idle marker so that downstream stops waiting too; first,
though, event time advances to the highest watermark any input reached (as Jet does), so the
result does not depend on which input fell idle first. When an input becomes active again, the
last watermark is repeated to say so. The output never goes backwards.
"""

from __future__ import annotations

from jetwake.engine.core.stream_items import NO_WATERMARK, IDLE_TIMESTAMP

__all__ = ["WatermarkCoalescer", "NO_WATERMARK"]



class WatermarkCoalescer:
    __slots__ = ("_wms", "_done", "_last", "_idle", "_top", "_deferred_idle")

    def __init__(self, queue_count: int) -> None:
        self._wms = [NO_WATERMARK] * queue_count
        self._done = [False] * queue_count
        self._last = NO_WATERMARK  # highest real watermark emitted
        self._idle = False         # whether the idle marker was the last output
        self._top = NO_WATERMARK   # highest real watermark any input reached
        self._deferred_idle = False

    @property
    def last_emitted(self) -> int:
        return self._last

    def observe(self, queue: int, timestamp: int) -> int | None:
        """Records a watermark (or the idle marker) of one queue; returns a new output or None."""
        current = self._wms[queue]
        if timestamp == IDLE_TIMESTAMP or current == IDLE_TIMESTAMP or timestamp > current:
            self._wms[queue] = timestamp
        if timestamp != IDLE_TIMESTAMP and timestamp > self._top:
            self._top = timestamp
        return self._coalesce()

    def take_deferred(self) -> int | None:
        """The idle marker owed after a watermark that :meth:`observe` returned when every
        input fell idle; None when nothing is owed."""
        if not self._deferred_idle:
            return None
        self._deferred_idle = False
        self._idle = True
        return IDLE_TIMESTAMP

    def queue_done(self, queue: int) -> int | None:
        self._done[queue] = True
        return self._coalesce()

    def _coalesce(self) -> int | None:
        wm = None
        any_live = False
        for w, done in zip(self._wms, self._done):
            if done:
                continue
            any_live = True
            if w != IDLE_TIMESTAMP and (wm is None or w < wm):
                wm = w
        if not any_live:
            return None
        if wm is None:  # every live input is idle
            if self._idle or self._deferred_idle:
                return None
            if self._top > self._last:
                # what the inputs promised before falling idle holds: emit it, then idle
                self._last = self._top
                self._deferred_idle = True
                return self._top
            self._idle = True
            return IDLE_TIMESTAMP
        self._deferred_idle = False
        if wm == NO_WATERMARK:
            return None
        if wm > self._last:
            self._last = wm
            self._idle = False
            return wm
        if self._idle:
            self._idle = False
            return self._last
        return None
