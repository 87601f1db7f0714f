"""Session windows, in one stage after a partitioned edge (docs/windowing.md, "Window kinds").

An event at ``ts`` covers the interval ``[ts, ts + gap)``. A key's sessions are the unions of
overlapping event intervals: an event that overlaps a session extends it, one that overlaps two
sessions merges them (their accumulators are combined), and one that overlaps none starts a new
session. A session ``[start, end)`` holds events from ``start`` to ``end - gap``: its result's
start is the first event's time and its end the last event's time plus the gap. When the
watermark reaches ``end`` the session is closed and emitted.

An event below the watermark is late: it might belong to a session already emitted, so it is
counted and dropped (or routed to the late-events sink).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from typing import Any, Callable

from jetwake.engine.operations.aggregate import AggregateOperation
from jetwake.engine.operations.window_definition import WindowDefinition
from jetwake.engine.operations.window_result import KeyedWindowResult, WindowResult
from jetwake.engine.core.processor import BroadcastKey, Inbox
from jetwake.engine.processors.sliding_window import WindowProcessorBase
from jetwake.engine.processors.window_entries import WindowEntries

__all__ = ["SessionWindowProcessor", "add_to_sessions", "close_sessions"]


def _start(s: list) -> int:
    return s[0]


def _end(s: list) -> int:
    return s[1]


def add_to_sessions(ss: list[list], t: int, t_end: int, x: Any, create: Callable[[], Any],
                    accumulate: Callable[[Any, Any], Any],
                    combine: Callable[[Any, Any], Any] | None) -> bool:
    """Adds the event ``x`` covering ``[t, t_end)`` to a key's sessions ``ss`` (not empty,
    disjoint, sorted by start, each ``[start, end, acc]``): it extends the session it overlaps, merges
    the sessions it overlaps (their accumulators combined), or starts one. True when it started
    one. The member's processor and the Spark backfill both apply events this way, in the order
    they arrive, so a session's accumulator sees its events in the same order."""
    last = ss[-1]
    if t >= last[0]:  # in order (the common case): only the last session reaches this far
        if t < last[1]:
            if t_end > last[1]:
                last[1] = t_end
            last[2] = accumulate(last[2], x)
            return False
        ss.append([t, t_end, accumulate(create(), x)])
        return True
    # disjoint and sorted by start, so sorted by end too: the sessions the event overlaps are
    # the run from the first that ends after t to the last that starts before t_end
    lo = bisect_right(ss, t, key=_end)
    hi = bisect_left(ss, t_end, lo, key=_start)
    if lo == hi:
        ss.insert(lo, [t, t_end, accumulate(create(), x)])
        return True
    first = ss[lo]
    for s in ss[lo + 1:hi]:
        first[2] = combine(first[2], s[2])  # type: ignore[misc]
        if s[1] > first[1]:
            first[1] = s[1]
    del ss[lo + 1:hi]
    if t < first[0]:
        first[0] = t
    if t_end > first[1]:
        first[1] = t_end
    first[2] = accumulate(first[2], x)
    return False


def close_sessions(ss: list[list], key: Any, limit: int, finish: Callable[[Any], Any],
                   keyed: bool, out: list) -> None:
    """Closes a key's sessions ``ss`` (disjoint, sorted by start) that end at or before
    ``limit``: each one's result appended to ``out`` and the session taken out of ``ss``. The
    member's processor and the Spark backfill both close sessions with this."""
    # disjoint and sorted by start, so sorted by end too: the closed ones are a prefix (a scan
    # of every session made a backlog of open sessions quadratic)
    n = len(ss)
    i = 0
    while i < n and ss[i][1] <= limit:
        s = ss[i]
        r = finish(s[2])
        out.append(KeyedWindowResult(s[0], s[1], key, r) if keyed
                   else WindowResult(s[0], s[1], r))
        i += 1
    if i:
        del ss[:i]


class SessionWindowProcessor(WindowProcessorBase):
    def __init__(self, stage_name: str, wdef: WindowDefinition, op: AggregateOperation,
                 key_fn: Callable[[Any], Any] | None, side_output: bool = False) -> None:
        super().__init__(stage_name, wdef, side_output)
        self.op = op
        self.key_fn = key_fn
        self.gap = wdef.gap
        # key -> sessions sorted by start, each [start, end, acc]; sessions of a key are disjoint
        self.sessions: dict[Any, list[list]] = {}
        # (earliest end of a key's sessions, key), lazily corrected when popped
        self._deadlines: list[tuple[int, int, Any]] = []
        self._seq = 0  # breaks ties between keys that do not compare
        self.early_period = wdef.early_results_period

    def _push(self, end: int, key: Any) -> None:
        self._seq += 1
        heapq.heappush(self._deadlines, (end, self._seq, key))

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        items = self._split_late(inbox.drain())
        self._flush()
        gap = self.gap
        op = self.op
        create, accumulate, combine = op.create, op.accumulate, op.combine
        key_fn = self.key_fn
        sessions = self.sessions
        for t, x in items:
            k = key_fn(x) if key_fn is not None else None
            t_end = t + gap
            ss = sessions.get(k)
            if ss is None:
                sessions[k] = [[t, t_end, accumulate(create(), x)]]
                self._push(t_end, k)
                continue
            if len(ss) == 1:
                s = ss[0]
                if s[0] < t_end and t < s[1]:  # the common case: the event extends the session
                    if t < s[0]:
                        s[0] = t
                    if t_end > s[1]:
                        s[1] = t_end
                    s[2] = accumulate(s[2], x)
                    continue
            if add_to_sessions(ss, t, t_end, x, create, accumulate, combine):
                self._push(t_end, k)

    def _close_upto(self, limit: int) -> None:
        """Emits the sessions that end at or before ``limit``."""
        heap = self._deadlines
        sessions = self.sessions
        finish = self.op.finish
        out: list = []
        keyed = self.key_fn is not None
        while heap and heap[0][0] <= limit:
            _, _, k = heapq.heappop(heap)
            ss = sessions.get(k)
            if not ss:
                continue
            close_sessions(ss, k, limit, finish, keyed, out)
            if ss:
                self._push(ss[0][1], k)  # the next deadline: the first session left
            else:
                del sessions[k]
        out.sort(key=lambda r: (r[1], r[0]))
        self._emit(out)

    def _advance_watermark(self, ts: int) -> None:
        if ts > self.min_ts:
            self.min_ts = ts
            self._close_upto(ts)

    def try_process(self) -> bool:
        if not self._flush():
            return False
        if self._early_results_due():
            detached = self.op.detached_export
            keyed = self.key_fn is not None
            # the sessions live on after their early results: emit copies
            export = lambda a: detached(a)(a)  # noqa: E731
            self._emit([KeyedWindowResult(s[0], s[1], k, export(s[2]), True) if keyed
                        else WindowResult(s[0], s[1], export(s[2]), True)
                        for k, ss in self.sessions.items() for s in ss])
        return self._flush()

    def complete(self) -> bool:
        if not self._completing:
            self._completing = True
            if self.sessions:
                self._close_upto(max(s[1] for ss in self.sessions.values() for s in ss))
        return self._flush()

    def _snapshot_entries(self):
        yield WindowEntries.watermark(self.min_ts)
        for k, ss in self.sessions.items():
            yield WindowEntries.sessions(k, ss)

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for key, value in inbox.drain():
            if isinstance(key, BroadcastKey):
                if key.key == WindowEntries.WATERMARK:
                    self.restore_watermark(value)
                continue
            ss = WindowEntries.read_sessions(value)
            self.sessions[key] = ss
            self._push(min(s[1] for s in ss), key)


