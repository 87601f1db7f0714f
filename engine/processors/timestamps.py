"""Reading event timestamps off items, and placing watermarks among them.

Both places that start event time use these: the stage that inserts watermarks
(``insert_watermarks.py``) and a partitioned source that runs the timestamp policy per
partition (``source_event_time.py``).

- :class:`TimestampReader` reads each item's timestamp with the user's function (or checks a
  source's ``(timestamp, item)`` pairs) and turns the items into timestamped values; an item
  whose timestamp cannot be read, or is not an integer, fails the job with a message naming
  the stage and the item, or goes to the side output (``bad_events_to``).
- :func:`place_watermarks` appends a run of timestamped values to the pending output with each
  watermark right after the item that advanced it, so which events are late downstream does
  not depend on how items were chunked.
"""

from __future__ import annotations

import numbers
from bisect import bisect_left
from collections import deque
from itertools import accumulate
from typing import Any, Callable

from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.core.stream_items import NO_WATERMARK, Timestamped, Watermark, timestamped
from jetwake.engine.operations.watermark_policy import throttle
from jetwake.engine.processors.event_time_base import CONTROL, DATA, first, short_repr

__all__ = ["TimestampError", "TimestampReader", "place_watermarks", "NO_CAP"]

#: the cap of :func:`place_watermarks` when nothing else limits the watermark
NO_CAP = 2 ** 63


class TimestampError(JetwakeError, TypeError, ValueError):
    """An item's timestamp cannot be read, or is not an integer; the message names the stage
    and shows the item."""


class TimestampReader:
    """Reads the timestamps of a stage's items (see the module docstring)."""

    def __init__(self, stage_name: str, timestamp_fn: Callable[[Any], Any] | None,
                 side_output: bool) -> None:
        """``timestamp_fn`` None: the items are a source's ``(timestamp, item)`` pairs."""
        self.stage_name = stage_name
        self.timestamp_fn = timestamp_fn
        self.side_output = side_output

    def read(self, items: list) -> tuple[list, list, list]:
        """``(stamped, timestamps, bad)``: the timestamped values of the items whose
        timestamp could be read, their timestamps, and the items that go to the side
        output."""
        fn = self.timestamp_fn
        if fn is None:
            tss = list(map(first, items))
            if _all_ints(tss):
                return items, tss, []  # the pairs already are timestamped values
            return self._check_pairs(items)
        try:
            tss = list(map(fn, items))
        except Exception:  # noqa: BLE001 - find the item, then report or route it
            return self._check_items(items)
        if not _all_ints(tss):
            return self._check_items(items)
        stamped: list[Timestamped] = list(zip(tss, items))
        return stamped, tss, []

    def _check_items(self, items: list) -> tuple[list, list, list]:
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
        return stamped, tss, bad

    def _check_pairs(self, pairs: list) -> tuple[list, list, list]:
        bad: list
        good, tss, bad = [], [], []
        for t, x in pairs:
            t = self._as_int(t, x, bad)
            if t is not None:
                good.append(timestamped(t, x))
                tss.append(t)
        return good, tss, bad

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


def place_watermarks(pending: deque, stamped: list, tss: list, top: int, last: int,
                     lag: int, step: int, cap: int = NO_CAP) -> tuple[int, int]:
    """Appends the timestamped values ``stamped`` (timestamps ``tss``, in arrival order) to
    ``pending`` with the watermarks they advance, and returns the new ``(top, last)``.

    ``top``: the highest timestamp before them; ``last``: the watermark emitted last. The
    watermark after an item is ``top so far - lag``, no higher than ``cap`` (the other
    partitions of a source hold it there), rounded down to a multiple of ``step``; it is
    appended right after the item that advanced it. ``step`` 0 (no window downstream): at most
    one watermark, after the whole run."""
    hi = max(tss)
    new_top = hi if hi > top else top
    if step <= 0:
        pending.append((DATA, stamped))
        wm = min(new_top - lag, cap)
        if wm > last:
            pending.append((CONTROL, Watermark(wm)))
            last = wm
        return new_top, last
    limit = throttle(cap, step) if cap != NO_CAP else NO_CAP
    if hi <= top or min(throttle(hi - lag, step), limit) <= last:
        pending.append((DATA, stamped))
        return new_top, last
    # the running maximum is monotonic: bisect for each item that moves the watermark
    running = list(accumulate(tss, max, initial=top))
    del running[0]
    n = len(stamped)
    pos = 0
    while pos < n and last < limit:
        threshold = NO_WATERMARK if last == NO_WATERMARK else throttle(last, step) + step + lag
        i = bisect_left(running, threshold, pos)
        if i >= n:
            break
        wm = min(throttle(running[i] - lag, step), limit)
        pending.append((DATA, stamped[pos:i + 1]))
        if wm > last:
            pending.append((CONTROL, Watermark(wm)))
            last = wm
        pos = i + 1
    if pos < n:
        pending.append((DATA, stamped[pos:]))
    return new_top, last


def _all_ints(values: list) -> bool:
    types = set(map(type, values))
    return len(types) == 1 and int in types
