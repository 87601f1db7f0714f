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

import numbers
import time
from bisect import bisect_left
from itertools import accumulate
from typing import Any, Callable

from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.core.stream_items import IDLE_MESSAGE, Timestamped, Watermark, timestamped
from jetwake.engine.core.processor import BroadcastKey, Inbox, ProcessorContext
from jetwake.engine.operations.watermark_policy import NO_WATERMARK, WatermarkPolicy, throttle
from jetwake.engine.processors.event_time_base import EventTimeProcessor, first, short_repr

__all__ = ["InsertWatermarksProcessor", "TimestampError"]


class TimestampError(JetwakeError, TypeError, ValueError):
    """An item's timestamp cannot be read, or is not an integer; the message names the stage
    and shows the item."""


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
        self.real_time = self.policy.is_real_time
        self.lag = self.policy.lag
        self._last_activity = time.monotonic()
        self._idle = False
        context.metrics.setdefault("bad_timestamps", 0)

    # --- items -------------------------------------------------------------------------------

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        items = inbox.drain()
        if self.timestamp_fn is not None:
            stamped, tss = self._read_timestamps(items)
        else:
            # the source's (timestamp, item) pairs already are timestamped values
            stamped = items
            tss = list(map(first, items))
            if not _all_ints(tss):
                stamped, tss = self._check_pairs(items)
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
        lag, step = self.lag, self.step
        hi = max(tss)
        top = self.top
        last = self.last_wm
        if self.per_chunk and hi > top:
            self._emit(stamped)
            self.top = hi
            if hi - lag > last:
                self.last_wm = hi - lag
                self._emit_control(Watermark(hi - lag))
            return
        if hi <= top or throttle(hi - lag, step) <= last:
            self._emit(stamped)
            if hi > top:
                self.top = hi
            return
        # the running maximum is monotonic: bisect for each item that moves the watermark
        running = list(accumulate(tss, max, initial=top))
        del running[0]
        n = len(stamped)
        pos = 0
        while pos < n:
            threshold = NO_WATERMARK if last == NO_WATERMARK else \
                throttle(last, step) + step + lag
            i = bisect_left(running, threshold, pos)
            if i >= n:
                break
            wm = throttle(running[i] - lag, step)
            self._emit(stamped[pos:i + 1])
            if wm > last:
                self._emit_control(Watermark(wm))
                last = wm
            pos = i + 1
        if pos < n:
            self._emit(stamped[pos:])
        self.last_wm = last
        self.top = running[-1]

    def _advance_real_time(self) -> bool:
        wm = throttle(self.policy.current(), self.step)
        if wm > self.last_wm:
            self.last_wm = wm
            self._emit_control(Watermark(wm))
            return True
        return False

    # --- reading timestamps ------------------------------------------------------------------

    def _read_timestamps(self, items: list) -> tuple[list, list]:
        fn = self.timestamp_fn
        try:
            tss = list(map(fn, items))  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - find the item, then report or route it
            return self._check_items(items)
        if not _all_ints(tss):
            return self._check_items(items)
        stamped: list[Timestamped] = list(zip(tss, items))
        return stamped, tss

    def _check_items(self, items: list) -> tuple[list, list]:
        stamped, tss, bad = [], [], []
        fn = self.timestamp_fn
        for x in items:
            try:
                t = fn(x)  # type: ignore[misc]
            except Exception as e:  # noqa: BLE001
                if not self.side_output:
                    raise TimestampError(
                        f"stage {self.stage_name!r}: cannot read the timestamp of item "
                        f"{short_repr(x)}: {type(e).__name__}: {e}") from e
                bad.append(x)
                continue
            t = self._as_int(t, x, bad)
            if t is not None:
                stamped.append(timestamped(t, x))
                tss.append(t)
        self._route_bad(bad)
        return stamped, tss

    def _check_pairs(self, pairs: list) -> tuple[list, list]:
        good, tss, bad = [], [], []
        for t, x in pairs:
            t = self._as_int(t, x, bad)
            if t is not None:
                good.append(timestamped(t, x))
                tss.append(t)
        self._route_bad(bad)
        return good, tss

    def _as_int(self, t: Any, item: Any, bad: list) -> int | None:
        if type(t) is int:
            return t
        if isinstance(t, numbers.Integral) and not isinstance(t, bool):
            return int(t)
        if not self.side_output:
            raise TimestampError(
                f"stage {self.stage_name!r}: the timestamp function returned "
                f"{type(t).__qualname__} {short_repr(t, 60)} for item {short_repr(item)}; "
                "timestamps must be integers (milliseconds by convention), for example "
                "int(dt.timestamp() * 1000)")
        bad.append(item)
        return None

    def _route_bad(self, bad: list) -> None:
        if bad:
            self.context.metrics["bad_timestamps"] += len(bad)
            self._emit_side(bad)

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


def _all_ints(values: list) -> bool:
    types = set(map(type, values))
    return len(types) == 1 and int in types
