"""Sliding and tumbling windows by frames, in two stages (docs/windowing.md, "The frame algorithm").

The time axis is cut into frames one slide long. Stage 1 (:class:`FrameAccumulateProcessor`,
local, one per upstream processor) accumulates each event into the accumulator of its
``(frame, key)`` with the operation's batch path, and when the watermark passes the end of a
frame sends that frame's ``(key, frame_start, acc)`` items over a distributed partitioned edge.
Stage 2 (:class:`WindowCombineProcessor`) combines the partial frames of a key arriving from
every stage-1 processor, and when the watermark passes the end of a window builds the window
from its frames: with ``deduct``, by adding the frame that entered and deducting the frame that
left the previous window; without, by combining the window's frames afresh. A tumbling window
is the case of one frame per window.

An operation without ``combine`` runs in one stage (:class:`SlidingWindowProcessor`): items go
over the partitioned edge and each event is accumulated into every window that holds it.

Both stages handle several inputs (``aggregate2``): input ``i`` is accumulated with operation
``i`` and the accumulator of a frame is then the list of the per-input accumulators.

An event is *late* when its frame has already been closed by the watermark (equivalently, when
its timestamp is below the watermark rounded down to a frame): some window holding it has been
emitted, so it is counted in the ``late_events`` metric and dropped, or sent to the side output
when the user routes late events to a sink.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from itertools import repeat
from typing import Any, Callable, Iterable, Iterator, Sequence

from jetwake.engine.core.functions import identity
from jetwake.engine.operations.aggregate import AggregateOperation
from jetwake.engine.operations.window_definition import WindowDefinition, items_by_frame
from jetwake.engine.operations.window_result import KeyedWindowResult, WindowResult
from jetwake.engine.core.processor import BroadcastKey, Inbox, ProcessorContext
from jetwake.engine.core.stream_items import Watermark
from jetwake.engine.operations.watermark_policy import NO_WATERMARK
from jetwake.engine.processors.event_time_base import MISSING, EventTimeProcessor, first, second
from jetwake.engine.processors.window_entries import WindowEntries

__all__ = ["FrameAccumulateProcessor", "WindowCombineProcessor", "SlidingWindowProcessor",
           "FrameWindows", "composite_operation", "accumulate_frames", "accumulate_windows",
           "close_windows", "frame_items"]


# results are built with tuple.__new__, skipping the Python-level __new__ (one call per result)
_new = tuple.__new__
_KWR = KeyedWindowResult
_WR = WindowResult


def composite_operation(ops: Sequence[AggregateOperation]) -> AggregateOperation:
    """The operation on lists of per-input accumulators (``aggregate2``): combine, deduct,
    export and finish element by element; the result is a tuple of the ops' results."""
    ops = tuple(ops)
    n = len(ops)

    def combine(a: list, b: list) -> list:
        return [ops[i].combine(a[i], b[i]) for i in range(n)]  # type: ignore[misc]

    deduct = None
    if all(op.can_deduct for op in ops):
        def deduct(a: list, b: list) -> list:  # type: ignore[misc]
            return [ops[i].deduct(a[i], b[i]) for i in range(n)]  # type: ignore[misc]

    def accumulate(a: list, x: Any) -> list:
        raise TypeError("a composite window operation accumulates per input")

    return AggregateOperation(
        lambda: [op.create() for op in ops], accumulate, combine, deduct,
        export=lambda a: tuple(ops[i].export(a[i]) for i in range(n)),
        finish=lambda a: tuple(ops[i].finish(a[i]) for i in range(n)))


def accumulate_frames(table_of: Callable[[int], dict], tss: list[int], xs: list,
                      slide: int, key_fn: Callable[[Any], Any] | None,
                      accumulate_grouped: Callable[[dict, Iterable, list], None]) -> None:
    """The per-key step of the windows' first stage over a run of events (times ``tss``,
    items ``xs``): each item accumulated into its key's accumulator of its frame, in the
    table ``table_of(frame start)``, with one ``accumulate_grouped`` call per frame (one per
    run when the run lies in one frame, the common case). The member's accumulating processor
    and the Spark backfill both accumulate frames with this."""
    lo, hi = min(tss), max(tss)
    f_lo = lo - lo % slide
    if f_lo == hi - hi % slide:
        accumulate_grouped(table_of(f_lo), map(key_fn, xs) if key_fn is not None
                           else repeat(None, len(xs)), xs)
        return
    for f, items in items_by_frame(zip(tss, xs), slide).items():
        accumulate_grouped(table_of(f), map(key_fn, items) if key_fn is not None
                           else repeat(None, len(items)), items)


def accumulate_windows(windows: dict[int, dict], events: Iterable[tuple[int, Any]],
                       key_fn: Callable[[Any], Any] | None, slide: int, size: int,
                       accumulate_grouped: Callable[[dict, Iterable, list], None]) -> None:
    """The per-key step of sliding windows whose operation cannot combine, over a run of
    ``(time, item)`` events: each item accumulated into its key's accumulator of every window
    holding it (``size // slide`` windows), in ``windows`` (window end -> key -> acc), with one
    ``accumulate_grouped`` call per window end. The member's processor and the Spark backfill
    both accumulate with this."""
    by_end: dict[int, tuple[list, list]] = {}
    for t, x in events:
        f = t - t % slide
        k = key_fn(x) if key_fn is not None else None
        for e in range(f + slide, f + size + 1, slide):
            kb = by_end.get(e)
            if kb is None:
                by_end[e] = ([k], [x])
            else:
                kb[0].append(k)
                kb[1].append(x)
    for e, (keys, xs) in by_end.items():
        table = windows.get(e)
        if table is None:
            table = windows[e] = {}
        accumulate_grouped(table, keys, xs)


def close_windows(windows: dict[int, dict], limit: int, op: AggregateOperation, size: int,
                  keyed: bool) -> Iterator[list]:
    """The windows of an operation without ``combine`` that end at or before ``limit``, taken
    out of ``windows`` (window end -> key -> acc): their results, a list per window end, in
    order. The member's processor and the Spark backfill both close windows with this."""
    finish = op.finish
    for e in sorted(e for e in windows if e <= limit):
        table = windows.pop(e)
        if keyed:
            yield [KeyedWindowResult(e - size, e, k, finish(a)) for k, a in table.items()]
        else:
            yield [WindowResult(e - size, e, finish(a)) for a in table.values()]


def frame_items(f: int, tables: list[dict], ops: Sequence[AggregateOperation]) -> list:
    """The ``(key, frame start, acc)`` partials of frame ``f`` from its per-input tables
    (key -> accumulator): the accumulator alone of one input, else the list of the inputs'
    (``create()`` for an input without the key). The accumulating processor sends these, and
    a reader of its saved or live state builds the open windows from them."""
    if len(tables) == 1:
        return [(k, f, a) for k, a in tables[0].items()]
    keys: dict = {}
    for t in tables:
        keys.update(dict.fromkeys(t))
    return [(k, f, [t[k] if k in t else ops[i].create() for i, t in enumerate(tables)])
            for k in keys]


class WindowProcessorBase(EventTimeProcessor):
    def __init__(self, stage_name: str, wdef: WindowDefinition, side_output: bool) -> None:
        self.stage_name = stage_name
        self.wdef = wdef
        self.slide = wdef.slide
        self.size = wdef.size
        self.side_output = side_output
        self.min_ts = NO_WATERMARK  # events below this are late
        self._restored_wm: int | None = None
        self._completing = False

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        context.metrics.setdefault("late_events", 0)

    def _split_late(self, items: list) -> list:
        """Drops (or routes) the late timestamped values; returns the others."""
        min_ts = self.min_ts
        late = [p[1] for p in items if p[0] < min_ts]
        if not late:
            return items
        self._count_late(len(late))
        if self.side_output:
            self._emit_side(late)
        return [p for p in items if p[0] >= min_ts]

    def _frame_floor(self, ts: int) -> int:
        return ts - ts % self.slide

    def _advance_watermark(self, ts: int) -> None:
        limit = self._frame_floor(ts)
        if limit > self.min_ts:
            self.min_ts = limit
            self._close_upto(limit)

    def _close_upto(self, limit: int) -> None:
        """Every frame (or window) ending at or before ``limit`` is complete: emit it."""

    def restore_watermark(self, value: int) -> None:
        # every processor's watermark reaches every processor: the lowest is the safe one
        self._restored_wm = value if self._restored_wm is None else min(self._restored_wm, value)

    def finish_snapshot_restore(self) -> bool:
        if self._restored_wm is not None:
            self.min_ts = self._restored_wm
        return True


class FrameAccumulateProcessor(WindowProcessorBase):
    """Stage 1: timestamped items -> per-frame accumulators; emits ``(key, frame, acc)``."""

    def __init__(self, stage_name: str, wdef: WindowDefinition,
                 ops: Sequence[AggregateOperation],
                 key_fns: Sequence[Callable[[Any], Any] | None], side_output: bool = False) -> None:
        super().__init__(stage_name, wdef, side_output)
        self.ops = list(ops)
        self.key_fns = list(key_fns)
        self.n = len(self.ops)
        self.frames: dict[int, list[dict]] = {}

    def _tables(self, frame: int) -> list[dict]:
        tables = self.frames.get(frame)
        if tables is None:
            tables = self.frames[frame] = [{} for _ in range(self.n)]
        return tables

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        items = inbox.drain()
        if not items:
            return
        tss = list(map(first, items))
        lo = min(tss)
        if lo < self.min_ts:
            items = self._split_late(items)
            self._flush()
            if not items:
                return
            tss = list(map(first, items))
            lo = min(tss)
        accumulate_frames(lambda f: self._tables(f)[ordinal], tss, list(map(second, items)),
                          self.slide, self.key_fns[ordinal], self.ops[ordinal].accumulate_grouped)

    def _frame_items(self, f: int, tables: list[dict]) -> list:
        return frame_items(f, tables, self.ops)

    def _close_upto(self, limit: int) -> None:
        frames = self.frames
        for f in sorted(f for f in frames if f < limit):
            self._emit(self._frame_items(f, frames.pop(f)))

    def try_process(self) -> bool:
        return self._flush()

    def try_process_watermark(self, watermark: Watermark) -> bool:
        if watermark.is_idle and self.frames:
            # an input that falls idle stops counting downstream, and a combiner whose inputs
            # all fell idle moves on to the highest watermark any reached: the partial frames
            # held here leave first (as partials, combined with any that follow), or they
            # would arrive behind that watermark and be dropped as late
            if not self._flush():
                return False
            frames = self.frames
            for f in sorted(frames):
                self._emit(self._frame_items(f, frames.pop(f)))
        return super().try_process_watermark(watermark)

    def complete(self) -> bool:
        if not self._completing:
            self._completing = True
            frames = self.frames
            for f in sorted(frames):
                self._emit(self._frame_items(f, frames.pop(f)))
        return self._flush()

    def _snapshot_entries(self):
        yield WindowEntries.watermark(self.min_ts)
        for f, tables in self.frames.items():
            for i, t in enumerate(tables):
                for k, a in t.items():
                    yield WindowEntries.frame_partial(k, f, i, a)

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for key, value in inbox.drain():
            if isinstance(key, BroadcastKey):
                if key.key == WindowEntries.WATERMARK:
                    self.restore_watermark(value)
                continue
            f, i, acc = value
            t = self._tables(f)[i]
            old = t.get(key, MISSING)
            t[key] = acc if old is MISSING else self.ops[i].combine(old, acc)  # type: ignore[misc]


class FrameWindows:
    """The second stage's rule, over the frames of every key it holds: a key's combined
    accumulator per frame, and the windows they make once the watermark passes a window's end.
    The member's combining processor keeps its frames in one and the Spark backfill combines
    its tasks' frames in one, so both emit the same windows from the same frames.

    With ``deduct`` a window is built from the previous one (the frame that entered added, the
    one that left deducted); without, by combining its frames afresh. A tumbling window is the
    case of one frame per window."""

    def __init__(self, op: AggregateOperation, size: int, slide: int, keyed: bool) -> None:
        self.op = op
        self.size = size
        self.slide = slide
        self.keyed = keyed
        self.frames: dict[int, dict] = {}  # frame start -> key -> combined acc
        self.starts: list[int] = []        # sorted frame starts present in ``frames``
        self.next_end: int | None = None   # the end of the next window to emit
        self.win: dict = {}                # deduct path: key -> [acc, frames holding the key]
        self.win_end: int | None = None    # the window ``win`` holds, by its end

    def add(self, partials: Iterable[tuple], min_ts: int = NO_WATERMARK) -> int:
        """Combines ``(key, frame start, acc)`` partials into the frames; a partial of a frame
        before ``min_ts`` (the frame the watermark is in) is late and left out. Returns how
        many were."""
        frames = self.frames
        combine = self.op.combine
        late = 0
        for k, f, a in partials:
            if f < min_ts:
                late += 1
                continue
            t = frames.get(f)
            if t is None:
                t = frames[f] = {}
                insort(self.starts, f)
            old = t.get(k, MISSING)
            t[k] = a if old is MISSING else combine(old, a)  # type: ignore[misc]
        return late

    def windows_upto(self, limit: int) -> Iterator[list]:
        """The results of every window whose end is at most ``limit`` (a frame boundary), a
        list per window end, in order; the frames no later window needs are forgotten."""
        starts = self.starts
        size, slide = self.size, self.slide
        e = self.next_end
        if starts:
            if e is None:
                e = starts[0] + slide
            while e <= limit:
                i = bisect_left(starts, e - size)
                if i == len(starts):
                    break  # no frames left for windows up to ``limit``
                if starts[i] >= e:
                    e = starts[i] + slide  # skip windows without frames
                    continue
                yield self._window(e)
                e += slide
                self._evict(e)
        # every window ending at or before ``limit`` is done; a frame arriving from now on
        # starts at ``limit`` or later, so its first window ends at ``limit + slide`` or later
        nxt = limit + slide
        if self.next_end is None or nxt > self.next_end:
            self.next_end = nxt
        self._evict(self.next_end)

    def every_window(self) -> Iterator[list]:
        """The results of every window the frames make (the input ended)."""
        if self.starts:
            yield from self.windows_upto(self.starts[-1] + self.size)

    def early_results(self) -> Iterator[list]:
        """Early results of the open windows, a list per window end; the frames live on."""
        starts = self.starts
        if not starts:
            return
        size, slide = self.size, self.slide
        e = self.next_end if self.next_end is not None else starts[0] + slide
        last = starts[-1] + size
        export = self.op.export
        while e <= last:
            accs = self._combine_frames(e - size, e)
            if self.keyed:
                yield [KeyedWindowResult(e - size, e, k, export(a), True)
                       for k, a in accs.items()]
            else:
                yield [WindowResult(e - size, e, export(a), True) for a in accs.values()]
            e += slide

    def _window(self, e: int) -> list:
        size, slide = self.size, self.slide
        start = e - size
        op = self.op
        frames = self.frames
        if op.can_deduct:
            win = self.win
            if self.win_end is not None and e == self.win_end + slide:
                entering = frames.get(e - slide)
                if entering:
                    self._add(entering)
                leaving = frames.get(start - slide)
                if leaving:
                    self._deduct(leaving)
            else:
                win.clear()
                for f in self._frames_in(start, e):
                    self._add(frames[f])
            self.win_end = e
            # the window's accumulators change in place as it slides: a result must not
            export = op.detached_export(next(iter(win.values()))[0]) if win else op.export
            if self.keyed:
                if export is identity:
                    return [_new(_KWR, (start, e, k, v[0])) for k, v in win.items()]
                return [_new(_KWR, (start, e, k, export(v[0]))) for k, v in win.items()]
            return [_new(_WR, (start, e, export(v[0]))) for v in win.values()]
        accs = self._combine_frames(start, e)
        finish = op.finish
        if self.keyed:
            return [_new(_KWR, (start, e, k, finish(a))) for k, a in accs.items()]
        return [_new(_WR, (start, e, finish(a))) for a in accs.values()]

    def _frames_in(self, start: int, end: int) -> list[int]:
        starts = self.starts
        return starts[bisect_left(starts, start):bisect_left(starts, end)]

    def _combine_frames(self, start: int, end: int) -> dict:
        op = self.op
        create, combine = op.create, op.combine
        accs: dict = {}
        get = accs.get
        for f in self._frames_in(start, end):
            for k, a in self.frames[f].items():
                acc = get(k, MISSING)
                if acc is MISSING:
                    acc = create()
                accs[k] = combine(acc, a)  # type: ignore[misc]
        return accs

    def _add(self, frame: dict) -> None:
        win = self.win
        create, combine = self.op.create, self.op.combine
        get = win.get
        for k, a in frame.items():
            cur = get(k)
            if cur is None:
                win[k] = [combine(create(), a), 1]  # type: ignore[misc]
            else:
                cur[0] = combine(cur[0], a)  # type: ignore[misc]
                cur[1] += 1

    def _deduct(self, frame: dict) -> None:
        win = self.win
        deduct = self.op.deduct
        for k, a in frame.items():
            cur = win[k]
            if cur[1] == 1:
                del win[k]
            else:
                cur[0] = deduct(cur[0], a)  # type: ignore[misc]
                cur[1] -= 1

    def _evict(self, next_end: int) -> None:
        """Forgets the frames no window from ``next_end`` on needs (the deduct path keeps the
        frame that leaves next)."""
        keep_from = next_end - self.size - (self.slide if self.op.can_deduct else 0)
        starts = self.starts
        j = bisect_left(starts, keep_from)
        if j:
            frames = self.frames
            for f in starts[:j]:
                del frames[f]
            del starts[:j]

    def restore(self, partials: Iterable[tuple], next_end: int | None) -> None:
        """Restored ``(key, frame start, acc)`` partials and the end of the next window
        (every processor's reaches every processor: the lowest is the safe one); a sliding
        window is built afresh at the next window."""
        self.add(partials)
        if next_end is not None:
            self.next_end = next_end if self.next_end is None else min(self.next_end, next_end)
        self.win.clear()
        self.win_end = None


class WindowCombineProcessor(WindowProcessorBase):
    """Stage 2: combines ``(key, frame, acc)`` from every stage-1 processor into windows
    (:class:`FrameWindows`)."""

    def __init__(self, stage_name: str, wdef: WindowDefinition, op: AggregateOperation,
                 keyed: bool, side_output: bool = False) -> None:
        super().__init__(stage_name, wdef, side_output)
        self.op = op
        self.windows = FrameWindows(op, wdef.size, wdef.slide, keyed)
        self.early_period = wdef.early_results_period

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        # a partial is late only after a restore or when an idle input woke up
        late = self.windows.add(inbox.drain(), self.min_ts)
        if late:
            self._count_late(late)

    def _close_upto(self, limit: int) -> None:
        for results in self.windows.windows_upto(limit):
            self._emit(results)

    def complete(self) -> bool:
        if not self._completing:
            self._completing = True
            for results in self.windows.every_window():
                self._emit(results)
        return self._flush()

    def try_process(self) -> bool:
        if not self._flush():
            return False
        if self._early_results_due():
            for results in self.windows.early_results():
                self._emit(results)
        return self._flush()

    # --- snapshots ---------------------------------------------------------------------------

    def _snapshot_entries(self):
        yield WindowEntries.watermark(self.min_ts)
        w = self.windows
        if w.next_end is not None:
            yield WindowEntries.next_end(w.next_end)
        for f, t in w.frames.items():
            for k, a in t.items():
                yield WindowEntries.frame(k, f, a)

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        partials = []
        next_end = None
        for key, value in inbox.drain():
            if isinstance(key, BroadcastKey):
                if key.key == WindowEntries.WATERMARK:
                    self.restore_watermark(value)
                elif key.key == WindowEntries.NEXT_END:
                    next_end = value if next_end is None else min(next_end, value)
                continue
            f, acc = value
            partials.append((key, f, acc))
        self.windows.restore(partials, next_end)


class SlidingWindowProcessor(WindowProcessorBase):
    """One stage, for operations that cannot combine: each event is accumulated into every
    window that holds it (``size // slide`` windows)."""

    def __init__(self, stage_name: str, wdef: WindowDefinition, op: AggregateOperation,
                 key_fn: Callable[[Any], Any] | None, side_output: bool = False) -> None:
        super().__init__(stage_name, wdef, side_output)
        self.op = op
        self.key_fn = key_fn
        self.windows: dict[int, dict] = {}  # window end -> key -> acc
        self.early_period = wdef.early_results_period

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        items = self._split_late(inbox.drain())
        self._flush()
        accumulate_windows(self.windows, items, self.key_fn, self.slide, self.size,
                           self.op.accumulate_grouped)

    def _emit_upto(self, limit: int) -> None:
        for results in close_windows(self.windows, limit, self.op, self.size,
                                     self.key_fn is not None):
            self._emit(results)

    def _close_upto(self, limit: int) -> None:
        self._emit_upto(limit)

    def try_process(self) -> bool:
        if not self._flush():
            return False
        if self._early_results_due():
            export = self.op.export
            size = self.size
            for e in sorted(self.windows):
                table = self.windows[e]
                if table:  # early results: the window's accumulators live on
                    export = self.op.detached_export(next(iter(table.values())))
                if self.key_fn is not None:
                    self._emit([KeyedWindowResult(e - size, e, k, export(a), True)
                                for k, a in table.items()])
                else:
                    self._emit([WindowResult(e - size, e, export(a), True)
                                for a in table.values()])
        return self._flush()

    def complete(self) -> bool:
        if not self._completing:
            self._completing = True
            if self.windows:
                self._emit_upto(max(self.windows))
        return self._flush()

    def _snapshot_entries(self):
        yield WindowEntries.watermark(self.min_ts)
        for e, t in self.windows.items():
            for k, a in t.items():
                yield WindowEntries.window(k, e, a)

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for key, value in inbox.drain():
            if isinstance(key, BroadcastKey):
                if key.key == WindowEntries.WATERMARK:
                    self.restore_watermark(value)
                continue
            e, acc = value
            self.windows.setdefault(e, {})[key] = acc
