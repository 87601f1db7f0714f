"""Inserting watermarks after the stage that assigns timestamps (docs/windowing.md, "Watermarks").

The processor reads each item's timestamp, emits the item as a timestamped
``(timestamp, item)`` value (the form every event-time stage downstream works on), and inserts a watermark
into the stream whenever the policy's watermark, rounded down to the throttling step,
advances. The watermark is inserted exactly after the item that advanced it, whatever the
chunking, so which events are late does not depend on how items were batched.

An input that delivers nothing for ``idle_timeout`` ms of wall-clock time is marked idle (the
IDLE message) so that the stages downstream stop waiting for it; its next item makes it active
again. Watermarks arriving from upstream are dropped: this stage starts a new event time.

After a source that emits its own watermarks (``Source(emits_watermarks=True)``, such as the
Kafka source tracking event time per partition) and ``with_native_timestamps(lag)``, the stage
*follows* them instead: each upstream watermark, minus the lag and throttled, is the stage's
watermark, and the source's idle marker is forwarded; items only become timestamped values.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from jetwake.engine.core.stream_items import IDLE_MESSAGE, Watermark
from jetwake.engine.core.processor import BroadcastKey, Inbox, ProcessorContext
from jetwake.engine.operations.watermark_policy import NO_WATERMARK, WatermarkPolicy, throttle
from jetwake.engine.processors.event_time_base import EventTimeProcessor
from jetwake.engine.processors.timestamps import (
    TimestampError, TimestampReader, place_watermarks,
)

__all__ = ["InsertWatermarksProcessor", "TimestampError"]


class InsertWatermarksProcessor(EventTimeProcessor):
    def __init__(self, stage_name: str, timestamp_fn: Callable[[Any], Any] | None,
                 policy_factory: Callable[[], WatermarkPolicy], step: int = 1,
                 idle_timeout: int = 60_000, side_output: bool = False,
                 follow_upstream: bool = False) -> None:
        """``timestamp_fn`` None: the items are ``(timestamp, item)`` pairs (a source with
        native timestamps). ``side_output``: route items without a readable timestamp
        to output ordinal 0 instead of failing the job. ``follow_upstream``: the watermarks
        come from the source (see the module docstring)."""
        self.stage_name = stage_name
        self.timestamp_fn = timestamp_fn
        self.policy_factory = policy_factory
        self.step = max(1, int(step))
        # no windows downstream (step 0): one watermark per chunk of items is enough
        self.per_chunk = step <= 0
        self.idle_timeout = idle_timeout
        self.side_output = side_output
        self.follow_upstream = follow_upstream
        self.last_wm = NO_WATERMARK
        self.top = NO_WATERMARK

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.policy = self.policy_factory()
        self.reader = TimestampReader(self.stage_name, self.timestamp_fn, self.side_output)
        self.real_time = self.policy.is_real_time
        self.lag = self.policy.lag
        self._last_activity = time.monotonic()
        self._idle = False
        context.metrics.setdefault("bad_timestamps", 0)

    # --- items -------------------------------------------------------------------------------

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        stamped, tss, bad = self.reader.read(inbox.drain())
        if bad:
            self.context.metrics["bad_timestamps"] += len(bad)
            self._emit_side(bad)
        self._last_activity = time.monotonic()
        if not stamped:
            return
        if self.follow_upstream:
            self._emit(stamped)  # the source's watermarks follow in-band
            self._flush()
            return
        was_idle = self._idle
        self._idle = False
        if self.real_time:
            self._emit(stamped)
            if not self._advance_real_time() and was_idle:
                self._emit_control(Watermark(self.last_wm))
            self._flush()
            return
        before = self.last_wm
        self._insert(stamped, tss)
        if was_idle and self.last_wm == before:
            # tell the coalescers downstream that this input is active again
            self._emit_control(Watermark(self.last_wm))
        self._flush()

    def _insert(self, stamped: list, tss: list) -> None:
        if self.per_chunk and max(tss) <= self.top:
            self._emit(stamped)  # a chunk that does not move the top changes nothing
            return
        self.top, self.last_wm = place_watermarks(
            self._pending, stamped, tss, self.top, self.last_wm, self.lag,
            0 if self.per_chunk else self.step)

    def _advance_real_time(self) -> bool:
        wm = throttle(self.policy.current(), self.step)
        if wm > self.last_wm:
            self.last_wm = wm
            self._emit_control(Watermark(wm))
            return True
        return False

    # --- time-driven work --------------------------------------------------------------------

    def try_process(self) -> bool:
        if not self._flush():
            return False
        if self.follow_upstream:
            return True  # the source decides when it is idle
        if self.real_time:
            self._advance_real_time()
        if (self.idle_timeout and not self._idle
                and (time.monotonic() - self._last_activity) * 1000 >= self.idle_timeout):
            self._idle = True
            self._emit_control(IDLE_MESSAGE)
        return self._flush()

    def try_process_watermark(self, watermark: Watermark) -> bool:
        if not self.follow_upstream:
            return True  # this stage starts a new event time: upstream watermarks end here
        if not self._flush():
            return False
        if watermark.is_idle:
            if not self._idle:
                self._idle = True
                self._emit_control(IDLE_MESSAGE)
        else:
            wm = throttle(watermark.timestamp - self.lag, self.step)
            if wm > self.last_wm:
                self.last_wm = wm
                self._emit_control(Watermark(wm))
            elif self._idle:  # active again: say so without moving back
                self._emit_control(Watermark(self.last_wm))
            self._idle = False
        self._flush()
        return True

    def complete(self) -> bool:
        return self._flush()

    # --- snapshots ---------------------------------------------------------------------------

    def _snapshot_entries(self):
        yield BroadcastKey(("insert-watermarks", self.context.global_processor_index)), \
            [self.top, self.last_wm]

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for key, (top, last) in inbox.drain():
            # several processors' entries reach every processor: keep the most conservative
            if self._restored_any:
                self.top = min(self.top, top)
                self.last_wm = min(self.last_wm, last)
            else:
                self.top, self.last_wm = top, last
                self._restored_any = True

    _restored_any = False

