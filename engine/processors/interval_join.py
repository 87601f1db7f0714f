"""The interval join of two timestamped streams (``Stage.join_interval``).

A left event at ``tl`` and a right event at ``tr`` with equal keys form a pair when
``tl + lower <= tr <= tl + upper`` (both bounds inclusive); the pair is emitted once, by the
processor that receives the second of the two, as ``fn(left, right)`` at the event time
``max(tl, tr)`` (Flink's rule).

State and watermark (``W``, the lowest of the two inputs' watermarks): events below ``W`` are
late (``stream_join``). A left entry can still meet a right event at
``tr <= tl + upper``, and right events to come have ``tr >= W``: it is dropped once
``tl + upper < W``. A right entry can still meet a left event at ``tl >= tr - upper`` and
``tl <= tr - lower``: it is dropped once ``tr - lower < W``. So no on-time event ever misses a
dropped entry, and the state holds only the last ``upper`` (left) and ``-lower`` (right) ms
of event time behind the watermark, whatever the stream's length.

Output watermark: the input watermark, unchanged. A pair is emitted when its later event
arrives, and that event is on time (``>= W``), so every pair emitted from now on has a time
``max(tl, tr) >= W``: no pair is ever late downstream, and a window after the join closes as
it would on any stream.

:class:`IntervalJoinState` is the join itself (probe, store, expire); the member's processor
and the Spark backfill both run it, and :class:`IntervalJoinEntries` is the snapshot codec
both write.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from typing import Any, Callable, Iterator

from jetwake.engine.core.stream_items import NO_WATERMARK
from jetwake.engine.processors.stream_join import (
    LEFT, JoinWatermark, StreamJoinProcessor,
)

__all__ = ["IntervalJoinState", "IntervalJoinEntries", "IntervalJoinProcessor"]


class IntervalJoinState:
    """The entries of both sides by key, each key's sorted by time (ties in arrival order),
    and an expiry heap per side holding, per key, when its earliest entry expires.
    :meth:`add` probes the other side and stores the event; :meth:`expire` drops what the
    watermark passed."""

    def __init__(self, lower: int, upper: int) -> None:
        self.lower = lower
        self.upper = upper
        # side -> key -> (times, items)
        self.sides: tuple[dict[Any, tuple[list[int], list[Any]]], ...] = ({}, {})
        # side -> heap of (expiry, seq, key); an item is current while it is the key's
        # scheduled expiry (side -> key -> expiry), others are skipped
        self.heaps: tuple[list[tuple[int, int, Any]], ...] = ([], [])
        self.scheduled: tuple[dict[Any, int], ...] = ({}, {})
        self.size = 0
        self._seq = 0

    def expiry(self, side: int, ts: int) -> int:
        """The time the watermark must pass (strictly) for an entry of ``side`` at ``ts``
        to be dropped: ``ts + upper`` (left), ``ts - lower`` (right)."""
        return ts + self.upper if side == LEFT else ts - self.lower

    def add(self, side: int, key: Any, ts: int, item: Any, wm: int) -> list[tuple[int, Any, Any]]:
        """Adds an on-time event of ``side`` at ``ts``; returns the pairs it completes,
        ``(max time, left, right)``. It is stored unless watermark ``wm`` already passed its
        expiry (possible when ``upper < 0`` or ``lower > 0``)."""
        out: list[tuple[int, Any, Any]] = []
        self.add_all(side, ((key, ts, item),), wm, out)
        return out

    def add_all(self, side: int, events: Any, wm: int, out: list, probe: bool = True) -> None:
        """:meth:`add` of each ``(key, ts, item)`` of ``events`` in turn, the pairs appended
        to ``out`` (one call for a chunk: the loop reads the state's parts once); without
        ``probe`` the events are stored only (a restore)."""
        other_side, mine = self.sides[1 - side], self.sides[side]
        heap, scheduled = self.heaps[side], self.scheduled[side]
        left = side == LEFT
        # the other side's times a new event at ts meets: [ts + lo, ts + hi]
        lo, hi = (self.lower, self.upper) if left else (-self.upper, -self.lower)
        # an entry at ts expires after ts + shift
        shift = self.upper if left else -self.lower
        get_other, get_mine = other_side.get, mine.get
        append = out.append
        stored = 0
        for key, ts, item in events:
            other = get_other(key) if probe else None
            if other is not None:
                times, items = other
                i, j = bisect_left(times, ts + lo), bisect_right(times, ts + hi)
                if left:
                    for k in range(i, j):
                        t2 = times[k]
                        append((t2 if t2 > ts else ts, item, items[k]))
                else:
                    for k in range(i, j):
                        t2 = times[k]
                        append((t2 if t2 > ts else ts, items[k], item))
            exp = ts + shift
            if exp < wm:
                continue  # no later event can meet it
            entry = get_mine(key)
            if entry is None:
                mine[key] = ([ts], [item])
            else:
                times, items = entry
                if ts >= times[-1]:
                    times.append(ts)
                    items.append(item)
                    stored += 1
                    continue  # not the key's earliest: its expiry is scheduled already
                pos = bisect_right(times, ts)
                times.insert(pos, ts)
                items.insert(pos, item)
                if pos:
                    stored += 1
                    continue
            # the key's earliest entry: schedule its expiry
            stored += 1
            scheduled[key] = exp
            self._seq += 1
            heapq.heappush(heap, (exp, self._seq, key))
        self.size += stored

    def expire(self, wm: int) -> int:
        """Drops every entry whose expiry is below ``wm``; returns how many."""
        dropped = 0
        for side in (0, 1):
            heap, entries, scheduled = self.heaps[side], self.sides[side], self.scheduled[side]
            # expiry < wm  <=>  ts below this bound
            shift = self.upper if side == LEFT else -self.lower
            bound = wm - shift
            while heap and heap[0][0] < wm:
                exp, _, key = heapq.heappop(heap)
                if scheduled.get(key) != exp:
                    continue  # superseded by an earlier entry's expiry
                times, items = entries[key]
                n = bisect_left(times, bound)
                del times[:n]
                del items[:n]
                dropped += n
                if times:
                    exp = scheduled[key] = times[0] + shift
                    self._seq += 1
                    heapq.heappush(heap, (exp, self._seq, key))
                else:
                    del entries[key]
                    del scheduled[key]
        self.size -= dropped
        return dropped

    def restore(self, key: Any, value: Any) -> None:
        """Adds the entries of one key's snapshot entry (:class:`IntervalJoinEntries`)."""
        for side, (times, items) in enumerate(IntervalJoinEntries.read(value)):
            self.add_all(side, ((key, ts, item) for ts, item in zip(times, items)),
                         NO_WATERMARK, [], probe=False)

    def entries(self) -> Iterator[tuple[Any, Any]]:
        """The snapshot entries of the state, one per key."""
        left, right = self.sides
        for key in left.keys() | right.keys():
            yield IntervalJoinEntries.key_state(key, left.get(key, _EMPTY),
                                                right.get(key, _EMPTY))


_EMPTY: tuple[list[int], list[Any]] = ([], [])


class IntervalJoinEntries:
    """The snapshot entries of an interval join, one codec for its processor (which saves and
    restores them) and for the Spark backfill's hand-off (which writes them): the watermark
    (:class:`JoinWatermark`) and per join key ``[left times, left items, right times, right
    items]``."""

    @staticmethod
    def key_state(key: Any, left: tuple[list[int], list[Any]],
                  right: tuple[list[int], list[Any]]) -> tuple[Any, list]:
        return key, [list(left[0]), list(left[1]), list(right[0]), list(right[1])]

    @staticmethod
    def read(value: list) -> tuple[tuple[list[int], list[Any]], tuple[list[int], list[Any]]]:
        lt, lx, rt, rx = value
        return (lt, lx), (rt, rx)

    watermark = staticmethod(JoinWatermark.entry)


class IntervalJoinProcessor(StreamJoinProcessor):
    def __init__(self, stage_name: str, key_fn: Callable[[Any], Any],
                 other_key_fn: Callable[[Any], Any], lower: int, upper: int,
                 fn: Callable[[Any, Any], Any] | None, side_output: bool = False) -> None:
        super().__init__(stage_name, key_fn, other_key_fn, fn, side_output)
        self.state = IntervalJoinState(lower, upper)

    def _add_all(self, side: int, events: list[tuple[Any, int, Any]], out: list) -> None:
        pairs: list[tuple[int, Any, Any]] = []
        self.state.add_all(side, events, self.wm, pairs)
        if not pairs:
            return
        fn = self.fn
        if fn is None:
            out.extend([(t, (left, right)) for t, left, right in pairs])
            return
        for t, left, right in pairs:
            r = fn(left, right)
            if r is not None:
                out.append((t, r))

    def _size(self) -> int:
        return self.state.size

    def _on_watermark(self, wm: int) -> None:
        self._evicted(self.state.expire(wm))
        self.context.metrics["join_state_entries"] = self.state.size

    def complete(self) -> bool:
        return self._flush()

    def _snapshot_entries(self) -> Iterator[tuple[Any, Any]]:
        yield IntervalJoinEntries.watermark(self.wm)
        yield from self.state.entries()

    def _restore_key(self, key: Any, value: Any) -> None:
        self.state.restore(key, value)
