"""The as-of join of two timestamped streams (``Stage.join_asof``).

Each left event at ``tl`` is joined with the latest right event of the same key at or before
``tl`` (``tr <= tl``; with a ``tolerance``, also ``tr >= tl - tolerance``); among right events
of one key at the same time, the one that arrived last. The result ``fn(left, right)`` keeps
the left event's time. Without a match, ``how="left"`` emits ``fn(left, None)`` and
``how="inner"`` nothing.

Deterministic in event time: a right event at ``tr <= tl`` may arrive as long as the
watermark ``W`` (the lowest of the two inputs') is at most ``tl``, so a left event waits,
and is emitted when ``W`` passes ``tl`` (``W > tl``), before that watermark is forwarded.
Everything emitted later has a time ``>= W`` (pending left events are at or above it, and
later ones are on time), so the output watermark is the input watermark, unchanged, and no
result is late downstream. Events below ``W`` are late (``stream_join``).

Right state, per key: what a left event at or above ``W`` can still need, the latest right
event below ``W`` (none when the tolerance has passed it: ``tr < W - tolerance``) and every
one at or above ``W``. When a finite stream ends, every waiting left event is emitted.

:class:`AsofJoinState` is the join itself; the member's processor and the Spark backfill both
run it, and :class:`AsofJoinEntries` is the snapshot codec both write.
"""

from __future__ import annotations

import heapq
import sys
from bisect import bisect_left, bisect_right
from typing import Any, Callable, Iterator

from jetwake.engine.processors.map_stateful import END_OF_TIME
from jetwake.engine.processors.stream_join import LEFT, JoinWatermark, StreamJoinProcessor

__all__ = ["AsofJoinState", "AsofJoinEntries", "AsofJoinProcessor", "NO_MATCH", "END_OF_TIME"]


class _NoMatch:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_MATCH"

    def __reduce__(self) -> str:
        return "NO_MATCH"


NO_MATCH = _NoMatch()
"""What :meth:`AsofJoinState.advance` gives a left event without a right one."""


class AsofJoinState:
    """Waiting left events (a heap by time) and each key's right events (sorted by time,
    ties in arrival order). :meth:`advance` emits the left events a watermark completes and
    drops the right events no later left event can need."""

    def __init__(self, tolerance: int | None) -> None:
        self.tolerance = tolerance
        self.rights: dict[Any, tuple[list[int], list[Any]]] = {}
        self.waiting: list[tuple[int, int, Any, Any]] = []  # (tl, seq, key, item)
        # (watermark to pass, seq, key): when a key's earliest right event is pruned, the
        # watermark passing its next one's time (or its own plus the tolerance); an item is
        # current while it is the key's scheduled one (key -> time), others are skipped
        self.prune_at: list[tuple[int, int, Any]] = []
        self.scheduled: dict[Any, int] = {}
        self.size = 0
        self._seq = 0

    def add_left(self, key: Any, ts: int, item: Any) -> None:
        self.add_lefts(((key, ts, item),))

    def add_lefts(self, events: Any) -> None:
        """Each ``(key, ts, item)`` of ``events`` waits for the watermark to pass ``ts``."""
        waiting, push = self.waiting, heapq.heappush
        seq = self._seq
        n = 0
        for key, ts, item in events:
            seq += 1
            n += 1
            push(waiting, (ts, seq, key, item))
        self._seq = seq
        self.size += n

    def add_right(self, key: Any, ts: int, item: Any) -> None:
        self.add_rights(((key, ts, item),))

    def add_rights(self, events: Any) -> None:
        """Stores each ``(key, ts, item)`` of ``events`` among its key's right events."""
        rights, scheduled, tol = self.rights, self.scheduled, self.tolerance
        get = rights.get
        n = 0
        for key, ts, item in events:
            n += 1
            entry = get(key)
            if entry is None:
                rights[key] = ([ts], [item])
                if tol is not None:
                    self._schedule(key, ts + tol)
                continue
            times, items = entry
            if ts >= times[-1]:
                times.append(ts)
                items.append(item)
            else:
                pos = bisect_right(times, ts)
                times.insert(pos, ts)
                items.insert(pos, item)
            nxt = self._next_prune(times)
            if nxt < scheduled.get(key, _NEVER):
                self._schedule(key, nxt)
        self.size += n

    def _next_prune(self, times: list[int]) -> int:
        """When the key's earliest right event becomes useless: the watermark passing its
        next one (that one then answers every later left event) or its tolerance."""
        nxt = times[1] if len(times) > 1 else _NEVER
        if self.tolerance is not None and times[0] + self.tolerance < nxt:
            nxt = times[0] + self.tolerance
        return nxt

    def _schedule(self, key: Any, at: int) -> None:
        self.scheduled[key] = at
        self._seq += 1
        heapq.heappush(self.prune_at, (at, self._seq, key))

    def match(self, key: Any, ts: int) -> Any:
        """The latest right event of ``key`` at or before ``ts`` (within the tolerance), or
        :data:`NO_MATCH`."""
        entry = self.rights.get(key)
        if entry is None:
            return NO_MATCH
        times, items = entry
        i = bisect_right(times, ts) - 1
        if i < 0 or (self.tolerance is not None and times[i] < ts - self.tolerance):
            return NO_MATCH
        return items[i]

    def advance(self, wm: int) -> tuple[list[tuple[int, Any, Any]], int]:
        """Watermark ``wm``: ``(tl, left, right or NO_MATCH)`` of every waiting left event
        below it, in time order, and how many right events it made obsolete (dropped)."""
        out = []
        waiting = self.waiting
        while waiting and waiting[0][0] < wm:
            tl, _, key, item = heapq.heappop(waiting)
            out.append((tl, item, self.match(key, tl)))
        self.size -= len(out)
        return out, self._prune(wm)

    def _prune(self, wm: int) -> int:
        heap, rights, scheduled, tol = self.prune_at, self.rights, self.scheduled, \
            self.tolerance
        dropped = 0
        while heap and heap[0][0] < wm:
            at, _, key = heapq.heappop(heap)
            if scheduled.get(key) != at:
                continue  # superseded
            del scheduled[key]
            times, items = rights[key]
            i = bisect_left(times, wm)  # times[:i] are below the watermark
            keep = i - 1 if i > 0 else 0  # the latest below it stays...
            if i > 0 and tol is not None and times[i - 1] < wm - tol:
                keep = i  # ...unless no later left event is within the tolerance of it
            if keep:
                del times[:keep]
                del items[:keep]
                dropped += keep
            if not times:
                del rights[key]
                continue
            nxt = self._next_prune(times)
            if nxt != _NEVER:
                self._schedule(key, nxt)
        self.size -= dropped
        return dropped

    def restore(self, key: Any, value: Any) -> None:
        """Adds one key's snapshot entry (:class:`AsofJoinEntries`)."""
        (lt, lx), (rt, rx) = AsofJoinEntries.read(value)
        for ts, item in zip(rt, rx):
            self.add_right(key, ts, item)
        for ts, item in zip(lt, lx):
            self.add_left(key, ts, item)

    def entries(self) -> Iterator[tuple[Any, Any]]:
        """The snapshot entries of the state, one per key: its waiting left events (in
        arrival order) and its right events."""
        lefts: dict[Any, tuple[list[int], list[Any]]] = {}
        for ts, _, key, item in sorted(self.waiting, key=_seq_of):
            e = lefts.get(key)
            if e is None:
                e = lefts[key] = ([], [])
            e[0].append(ts)
            e[1].append(item)
        for key in lefts.keys() | self.rights.keys():
            yield AsofJoinEntries.key_state(key, lefts.get(key, _EMPTY),
                                            self.rights.get(key, _EMPTY))


_NEVER = sys.maxsize


def _seq_of(w: tuple) -> int:
    return w[1]


_EMPTY: tuple[list[int], list[Any]] = ([], [])


class AsofJoinEntries:
    """The snapshot entries of an as-of join, one codec for its processor (which saves and
    restores them) and for the Spark backfill's hand-off (which writes them): the watermark
    (:class:`JoinWatermark`) and per join key ``[waiting left times, their items, right
    times, right items]``."""

    @staticmethod
    def key_state(key: Any, lefts: tuple[list[int], list[Any]],
                  rights: tuple[list[int], list[Any]]) -> tuple[Any, list]:
        return key, [list(lefts[0]), list(lefts[1]), list(rights[0]), list(rights[1])]

    @staticmethod
    def read(value: list) -> tuple[tuple[list[int], list[Any]], tuple[list[int], list[Any]]]:
        lt, lx, rt, rx = value
        return (lt, lx), (rt, rx)

    watermark = staticmethod(JoinWatermark.entry)


def asof_results(matched: list[tuple[int, Any, Any]], fn: Callable[[Any, Any], Any] | None,
                 inner: bool) -> list[tuple[int, Any]]:
    """The timestamped results of matched left events: ``fn(left, right)`` (the tuple by
    default; ``right`` None without a match, or nothing with ``inner``), None results
    dropped. The member's processor and the Spark backfill both emit with this."""
    out = []
    for tl, left, right in matched:
        if right is NO_MATCH:
            if inner:
                continue
            right = None
        r = (left, right) if fn is None else fn(left, right)
        if r is not None:
            out.append((tl, r))
    return out


class AsofJoinProcessor(StreamJoinProcessor):
    def __init__(self, stage_name: str, key_fn: Callable[[Any], Any],
                 other_key_fn: Callable[[Any], Any], tolerance: int | None,
                 fn: Callable[[Any, Any], Any] | None, how: str,
                 side_output: bool = False) -> None:
        super().__init__(stage_name, key_fn, other_key_fn, fn, side_output)
        self.state = AsofJoinState(tolerance)
        self.inner = how == "inner"

    def _add_all(self, side: int, events: list[tuple[Any, int, Any]], out: list) -> None:
        if side == LEFT:
            self.state.add_lefts(events)
        else:
            self.state.add_rights(events)

    def _size(self) -> int:
        return self.state.size

    def _on_watermark(self, wm: int) -> None:
        self._release(wm)

    def _release(self, wm: int) -> None:
        matched, dropped = self.state.advance(wm)
        self._evicted(dropped)
        self._emit_results(asof_results(matched, self.fn, self.inner))

    def complete(self) -> bool:
        if not self._completed:
            # the end of a finite stream: no right event follows, every left one is complete
            self._completed = True
            self._release(END_OF_TIME)
        return self._flush()

    _completed = False

    def _snapshot_entries(self) -> Iterator[tuple[Any, Any]]:
        yield AsofJoinEntries.watermark(self.wm)
        yield from self.state.entries()

    def _restore_key(self, key: Any, value: Any) -> None:
        self.state.restore(key, value)
