"""The keyed stages of a backfill as plain functions over one Spark partition.

Each function gets the records of one Spark partition, every key's records in order (event
time, then position in the source, see ``translate.py``), and yields what the stage emits as
``("o", element)`` and, when the run exports a snapshot, the state the streaming job would hold
at the hand-off as ``("s", (vertex, key, value))``, written with the processors' own snapshot
codecs (``RollingEntries``, ``MapStatefulEntries``, ``WindowEntries``), so their restore code
reads them unchanged (the hand-off tests check it against a real snapshot).

The per-key steps are the processors' own: ``roll`` (rolling aggregates), ``KeyedStates``
(``map_stateful``: a key's state, its ttl and its eviction, ``step`` and ``expire``),
``add_to_sessions`` and ``close_sessions`` (sessions merged and closed), ``accumulate_frames``
and ``FrameWindows`` (frames accumulated, then combined into windows), ``accumulate_windows``
and ``close_windows`` (windows of operations without combine); what is here is how a Spark
partition's rows reach them, in order, with the watermark each would have met (at the end of
a bounded run, ``END_OF_TIME``).

An element is the item or, when ``timed``, ``(ts, wm, item)``: ``ts`` its event time, ``wm``
the watermark the streaming job would have had just before the item (None when it cannot be
known in advance, then no item is late); see ``chunks.py``. A stage's output elements have the
shape of its input's.
"""

from __future__ import annotations

from itertools import islice
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator

from jetwake.engine.operations.aggregate import AggregateOperation
from jetwake.engine.processors.event_time_base import call_with_arity
from jetwake.engine.processors.map_stateful import (
    END_OF_TIME, NOT_EXPIRED, KeyedStates, MapStatefulEntries,
)
from jetwake.engine.processors.rolling_aggregate import RollingEntries, roll
from jetwake.engine.backfill.chunks import CHUNK
from jetwake.engine.processors.session_window import add_to_sessions, close_sessions
from jetwake.engine.processors.sliding_window import (
    FrameWindows, accumulate_frames, accumulate_windows, close_windows,
)
from jetwake.engine.processors.window_entries import WindowEntries

__all__ = ["rolling", "map_stateful", "frame_windows", "sessions", "sliding_no_combine",
           "NO_CUT"]

NO_CUT = None  # a bounded run: every window closes, as at the end of a batch job
_TS, _WM, _ITEM = itemgetter(0), itemgetter(1), itemgetter(2)

Row = tuple  # ((partition id, order...), element)


def rolling(rows: Iterable[Row], op: AggregateOperation, key_fn: Callable | None,
            vertex: str, export_state: bool, timed: bool) -> Iterator[tuple]:
    """``rolling_aggregate``: each item updates its key's accumulator and emits the result
    (``(key, result)`` keyed, the result alone keyless), keeping the item's time; a chunk of
    rows at a time through the processor's own step (``roll``)."""
    create, accumulate = op.create, op.accumulate
    export = op.detached_export(create())
    accs: dict = {}
    rows = iter(rows)
    while True:
        es = [e for _, e in islice(rows, CHUNK)]
        if not es:
            break
        if not timed:
            for r in roll(accs, es, key_fn, create, accumulate, export):
                yield "o", r
            continue
        for e, r in zip(es, roll(accs, map(_ITEM, es), key_fn, create, accumulate, export)):
            yield "o", (e[0], e[1], r)
    if export_state:
        for k, acc in accs.items():
            yield "s", (vertex, *RollingEntries.accumulator(k, acc))


def map_stateful(rows: Iterable[Row], create_fn: Callable, map_fn: Callable,
                 key_fn: Callable | None, timestamped: bool, ttl: int | None,
                 on_evict: Callable | None, vertex: str, bounded: bool, cut: int | None,
                 export_state: bool, last_watermark: int | None,
                 late: Callable[[int], None], timed: bool) -> Iterator[tuple]:
    """``map_stateful``: one state per key, ``map_fn(state, key, item)`` (keyless:
    ``map_fn(state, item)``); with a ttl a key's state is evicted once the watermark passes
    its last event time + ttl (``on_evict``'s result is emitted at that watermark), and at the
    end of a bounded run, after the watermark that follows its last event
    (``last_watermark``, when known), every state is evicted, as when a finite stream ends.

    Over Kafka (not ``bounded``) each record carries the watermark of its own partition, and
    the rows of several partitions come merged (``rows``' keys end with the Spark partition,
    one per Kafka partition, and the record's index in it). A key's records all come from one
    partition, so its state is evicted by its own partition's watermark only: before each of
    its records, and for the keys not seen again at the lowest watermark over the partitions
    this task has read (never above any key's own). A record more than the ttl behind its own
    partition's watermark is late, as windows judge over Kafka."""
    evict_fn = call_with_arity(on_evict, 3) if on_evict is not None else None
    expiring = ttl is not None and timestamped
    keyed = KeyedStates(create_fn, map_fn, key_fn is not None, ttl if expiring else None)
    apply = keyed.step()
    cur_wm = None
    n_late = 0
    part_wms: dict = {}  # over Kafka: the Spark partition -> its records' highest watermark

    def evict(wm: int) -> Iterator[tuple]:
        for k, state in keyed.expire(wm):
            yield from evicted(k, state, wm)

    def evicted(k: Any, state: Any, wm: int) -> Iterator[tuple]:
        if evict_fn is not None:
            r = evict_fn(state, k, wm)
            if r is not None:
                yield "o", ((wm, wm, r) if timed else r)

    for rk, e in rows:
        if timed:
            ts, wm, x = e
        else:
            ts = wm = None
            x = e
        k = key_fn(x) if key_fn is not None else None
        if expiring and not bounded:
            # a partition counts in the lowest from its first record (before it has a
            # watermark): a key's state exists only after one of its partition's records
            p = rk[-2]
            if p not in part_wms:
                part_wms[p] = _NO_WM
        if expiring and wm is not None:
            if bounded:  # one ordered input: its watermark is every key's
                if cur_wm is None or wm > cur_wm:
                    cur_wm = wm
                    yield from evict(wm)
            else:
                if wm > part_wms[p]:
                    part_wms[p] = wm
                    low = min(part_wms.values())
                    if cur_wm is None or low > cur_wm:
                        cur_wm = low
                        yield from evict(low)
                state = keyed.expire_key(k, wm)
                if state is not NOT_EXPIRED:
                    yield from evicted(k, state, wm)
            if ts < wm - ttl:  # type: ignore[operator]
                n_late += 1
                continue
        r = apply(k, ts, x)
        if r is not None:
            yield "o", ((ts, wm, r) if timed else r)
    if n_late:
        late(n_late)
    if expiring:
        if bounded:
            if last_watermark is not None:
                yield from evict(last_watermark)
            yield from evict(END_OF_TIME)
        elif cut is not None:
            yield from evict(cut)
    if export_state:
        wm_entry = cut if cut is not None else (cur_wm if cur_wm is not None else _NO_WM)
        yield "s", (vertex, *MapStatefulEntries.watermark(wm_entry))
        for k, state in keyed.states.items():
            yield "s", (vertex, *MapStatefulEntries.state(k, state, keyed.last_ts.get(k)))


_NO_WM = -(2 ** 63)  # watermark_policy.NO_WATERMARK


def frame_windows(records: Iterable[tuple], ops: list, op: AggregateOperation, size: int,
                  slide: int, keyed: bool, cut: int | None, vertex: str,
                  export_state: bool) -> Iterator[tuple]:
    """The second stage of sliding and tumbling windows (operations that combine), over one
    Spark partition of ``(partition, [(input index, frame, {key: acc})])`` (``op`` is
    ``ops[0]``, or with several inputs their ``composite_operation``): the tasks' partial
    frames combined and the windows ending at or before ``cut`` (a frame boundary; None: every
    window) emitted by the member's combining rule (``FrameWindows``).

    The frames of windows still open go to the state, as the streaming job holds them: frames
    the watermark passed in the combining vertex ``vertex``, later ones in
    ``vertex-accumulate``."""
    n = len(ops)
    frames = FrameWindows(op, size, slide, keyed)
    for _, parts in records:
        for i, f, table in parts:
            if n == 1:
                frames.add([(k, f, a) for k, a in table.items()])
            else:
                # as the member's accumulating processor sends a frame: one accumulator per
                # input, new ones for the inputs without the key
                frames.add([(k, f, [a if j == i else o.create() for j, o in enumerate(ops)])
                            for k, a in table.items()])
    for results in (frames.every_window() if cut is None else frames.windows_upto(cut)):
        for r in results:
            yield "o", r
    if export_state and cut is not None:
        for f, t in frames.frames.items():
            for key, a in t.items():
                if f < cut:
                    yield "s", (vertex, *WindowEntries.frame(key, f, a))
                elif n == 1:
                    yield "s", (f"{vertex}-accumulate",
                                *WindowEntries.frame_partial(key, f, 0, a))
                else:
                    for i in range(n):
                        yield "s", (f"{vertex}-accumulate",
                                    *WindowEntries.frame_partial(key, f, i, a[i]))


def window_watermark_entries(vertex: str, cut: int, slide: int, two_stage: bool,
                             session: bool) -> list[tuple]:
    """The broadcast entries of a window stage's processors at watermark ``cut``."""
    if session or not two_stage:
        return [(vertex, *WindowEntries.watermark(cut))]
    return [(vertex, *WindowEntries.watermark(cut)),
            (vertex, *WindowEntries.next_end(cut + slide)),
            (f"{vertex}-accumulate", *WindowEntries.watermark(cut))]


def sessions(rows: Iterable[Row], op: AggregateOperation, key_fn: Callable | None, gap: int,
             cut: int | None, vertex: str, export_state: bool) -> Iterator[tuple]:
    """Session windows of each key, its events applied in arrival order as the member's
    processor applies them (``add_to_sessions``): events less than ``gap`` apart form one
    session ``[first event, last event + gap)``, closed by the member's rule
    (``close_sessions``) when it ends at or before ``cut`` (None: every session; late events
    were dropped before, so no event reaches a session the watermark closed)."""
    create, accumulate, combine, finish = op.create, op.accumulate, op.combine, op.finish
    keyed = key_fn is not None
    by_key: dict = {}  # key -> its sessions, disjoint, sorted by start: [start, end, acc]
    out: list = []
    for _, (t, w, x) in rows:
        k = key_fn(x) if key_fn is not None else None
        ss = by_key.get(k)
        if ss is None:
            by_key[k] = [[t, t + gap, accumulate(create(), x)]]
            continue
        if add_to_sessions(ss, t, t + gap, x, create, accumulate, combine) and w is not None:
            # the sessions the watermark has closed: no later event reaches them (a later one
            # below the watermark was dropped as late), so a key keeps few sessions at a time;
            # the new one ends after the watermark (its event is not late), so ``ss`` keeps it
            close_sessions(ss, k, w if cut is None else min(w, cut), finish, keyed, out)
            if out:
                for r in out:
                    yield "o", r
                out.clear()
    for k, ss in by_key.items():
        close_sessions(ss, k, END_OF_TIME if cut is None else cut, finish, keyed, out)
        for r in out:
            yield "o", r
        out.clear()
        if export_state and ss:
            yield "s", (vertex, *WindowEntries.sessions(k, ss))


def sliding_no_combine(rows: Iterable[Row], op: AggregateOperation, key_fn: Callable | None,
                       size: int, slide: int, cut: int | None, vertex: str,
                       export_state: bool) -> Iterator[tuple]:
    """Sliding windows of an operation without ``combine``: each event is accumulated into
    every window holding it (the one-stage plan, the processor's ``accumulate_windows``), a
    chunk of rows at a time, and the windows ending at or before ``cut`` (None: every window)
    closed by the processor's ``close_windows``; the others go to the state."""
    windows: dict = {}  # window end -> key -> acc
    rows = iter(rows)
    while True:
        events = [(e[0], e[2]) for _, e in islice(rows, CHUNK)]
        if not events:
            break
        accumulate_windows(windows, events, key_fn, slide, size, op.accumulate_grouped)
    for results in close_windows(windows, END_OF_TIME if cut is None else cut, op, size,
                                 key_fn is not None):
        for r in results:
            yield "o", r
    if export_state:
        for e in sorted(windows):
            for k, acc in windows[e].items():
                yield "s", (vertex, *WindowEntries.window(k, e, acc))


def frame_partials(chunks: Iterable[Any], op: AggregateOperation, key_fn: Callable | None,
                   slide: int, input_index: int, n_inputs: int,
                   late: Callable[[int], None], columnar: bool = False,
                   partitions: int = 1,
                   partition_fn: Callable[[Any], int] = hash,
                   judge_late: bool = True) -> Iterator[tuple]:
    """The first stage of sliding and tumbling windows, over one Spark partition's chunks of
    ``(ts, wm, item)`` (``columnar``: chunks as the three lists ``(times, watermarks, items)``,
    as the watermark stage makes them, each chunk's watermarks non-decreasing): drops the late
    events, and accumulates the others per frame and key with the operation's chunk-wise
    ``accumulate_grouped`` (as the member's accumulating processor does: one call per chunk
    when the chunk lies in one frame); yields, for each of the ``partitions`` partitions of
    the shuffle that has keys here, ``(partition, [(input index, frame, {key: acc})])``:
    ``partition_fn(key) % partitions`` places a key. Without ``judge_late`` the watermarks
    are not read: no event is late."""
    frames: dict = {}
    n_late = 0
    accumulate_grouped = op.accumulate_grouped

    def table_of(f: int) -> dict:
        table = frames.get(f)
        if table is None:
            table = frames[f] = {}
        return table
    for chunk in chunks:
        if columnar:
            tss, wms, xs = chunk
            if not tss:
                continue
            top = wms[-1]  # the highest: a partition's watermarks never go down
        else:
            tss, wms, xs = list(map(_TS, chunk)), list(map(_WM, chunk)), list(map(_ITEM, chunk))
            if not tss:
                continue
            marks = set(wms) if judge_late else ()
            top = max((w for w in marks if w is not None), default=None)
        if not judge_late:
            top = None
        if top is not None and min(tss) < top - top % slide:
            # an event is late when it is before the frame of the watermark it met
            keep = [i for i, (t, w) in enumerate(zip(tss, wms))
                    if w is None or t >= w - w % slide]
            n_late += len(tss) - len(keep)
            if not keep:
                continue
            tss = [tss[i] for i in keep]
            xs = [xs[i] for i in keep]
        accumulate_frames(table_of, tss, xs, slide, key_fn, accumulate_grouped)
    if n_late:
        late(n_late)
    if partitions == 1:
        if frames:
            yield 0, [(input_index, f, table) for f, table in frames.items()]
        return
    # a record per partition of the shuffle, each frame's accumulators of that partition's
    # keys in one dict: a few records of plain dicts rather than one per key (the shuffle's
    # Python cost is per record and per tuple); each key is one object in all the frames, so
    # that it is pickled once per record
    keys: dict = {}
    for table in frames.values():
        keys.update(dict.fromkeys(table))
    mine: list[list] = [[] for _ in range(partitions)]
    for k in keys:
        mine[partition_fn(k) % partitions].append(k)
    for p, ks in enumerate(mine):
        if not ks:
            continue
        out = []
        for f, table in frames.items():
            part = {k: table[k] for k in ks if k in table}
            if part:
                out.append((input_index, f, part))
        yield p, out
