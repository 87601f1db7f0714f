"""Every built-in stateful processor, and the connectors with a position or a transaction, run
through jetwake.testing.verify_processor: plainly, with a refusing outbox, and with a snapshot
(saved and serialized at once) and a restore into a fresh processor after every chunk.

Their state is changed in place on purpose: lists that accumulators append to, dicts, and a
custom accumulator object that mutates itself. A snapshot that is not a true cut of that state,
or a restore that loses or repeats any of it, changes the output of the restoring run. The
expected outputs come from brute-force references in this file, not from the processors.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from jetwake import (
    AggregateOperation, AggregateOperations as ops, KeyedWindowResult, Member, Sinks, Sources,
    WindowDefinition, WindowResult, register_type,
)
from jetwake.connectors.files import FileSourceProcessor
from jetwake.connectors.items_source import ItemsSourceProcessor
from jetwake.connectors.maps import MapJournalSourceProcessor, MapSourceProcessor
from jetwake.engine.core.stream_items import Watermark
from jetwake.engine.processors.aggregation import (
    AccumulateProcessor, AggregateProcessor, CombineProcessor,
)
from jetwake.engine.processors.distinct import DistinctProcessor
from jetwake.engine.processors.hash_join import HashJoinProcessor
from jetwake.engine.processors.map_stateful import END_OF_TIME, MapStatefulProcessor
from jetwake.engine.processors.rolling_aggregate import RollingAggregateProcessor
from jetwake.engine.processors.session_window import SessionWindowProcessor
from jetwake.engine.processors.sliding_window import (
    FrameAccumulateProcessor, SlidingWindowProcessor, WindowCombineProcessor, composite_operation,
)
from jetwake.engine.processors.sort import MergeSortedProcessor, SortProcessor
from jetwake.testing import verify_processor, wm

NO_WM = -(2**63)


# --- a custom accumulator that mutates itself ------------------------------------------------

class Bag:
    """Items and their total; ``add`` and ``merge`` change the bag in place."""

    def __init__(self, items: list | None = None, total: int = 0) -> None:
        self.items = items if items is not None else []
        self.total = total

    def add(self, value: int) -> "Bag":
        self.items.append(value)
        self.total += value
        return self

    def merge(self, other: "Bag") -> "Bag":
        self.items.extend(other.items)
        self.total += other.total
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Bag) and (self.items, self.total) == (other.items, other.total)

    def __repr__(self) -> str:
        return f"Bag({self.items}, {self.total})"


register_type(171, Bag, lambda b: [b.items, b.total], lambda v: Bag(v[0], v[1]))


def bag_op() -> AggregateOperation:
    """Sums ``item[1]`` in a Bag; its export is a copy, so results never alias the bag."""
    return AggregateOperation(Bag, lambda b, x: b.add(x[1]), Bag.merge,
                              export=lambda b: (b.total, tuple(b.items)))


def list_op_without_combine() -> AggregateOperation:
    """Like to_list but without combine: the single-stage processors run it."""
    def append(acc: list, x: Any) -> list:
        acc.append(x)
        return acc
    return AggregateOperation(list, append)


# --- inputs and checks -----------------------------------------------------------------------

def keyed_items(n: int = 60, keys: int = 4, seed: int = 1) -> list[tuple[str, int]]:
    rnd = random.Random(seed)
    return [(f"k{rnd.randrange(keys)}", rnd.randint(1, 9)) for _ in range(n)]


def event_stream(n: int = 80, keys: int = 3, seed: int = 2, spacing: int = 3,
                 disorder: int = 8, lag: int = 4, every: int = 7) -> list:
    """``(ts, (key, value))`` events, slightly out of order, with a watermark (the highest
    timestamp minus ``lag``) after every ``every`` events; some events end up late."""
    rnd = random.Random(seed)
    out: list = []
    top = None
    last_wm = NO_WM
    for i in range(n):
        t = i * spacing - rnd.randint(0, disorder)
        out.append((t, (f"k{rnd.randrange(keys)}", rnd.randint(1, 9))))
        top = t if top is None else max(top, t)
        if i % every == every - 1 and top - lag > last_wm:
            last_wm = top - lag
            out.append(wm(last_wm))
    return out


def segments(items: list) -> list:
    """The items between watermarks as sorted runs, the watermarks in place."""
    out: list = []
    run: list = []
    for x in items:
        if isinstance(x, Watermark):
            out.append(sorted(run, key=repr))
            out.append(x)
            run = []
        else:
            run.append(x)
    out.append(sorted(run, key=repr))
    return out


def same_per_watermark(expected: list, actual: list) -> bool:
    """The order of results between two watermarks is not part of the contract."""
    return segments(expected) == segments(actual)


def same_items(expected: list, actual: list) -> bool:
    return sorted(expected, key=repr) == sorted(actual, key=repr)


# --- aggregation (batch) --------------------------------------------------------------------

def grouped(items, key=lambda x: x[0]) -> dict:
    out: dict = {}
    for x in items:
        out.setdefault(key(x), []).append(x)
    return out


def test_accumulate_keyed_to_list():
    items = keyed_items()
    verify_processor(lambda: AccumulateProcessor(ops.to_list(), lambda x: x[0])) \
        .input(items).output_checker(same_items) \
        .expect_output(list(grouped(items).items()))


def test_accumulate_keyless_to_list():
    items = keyed_items()
    verify_processor(lambda: AccumulateProcessor(ops.to_list(), None)) \
        .input(items).expect_output([items])


def test_accumulate_keyed_custom_mutable_accumulator():
    items = keyed_items()
    expected = [(k, Bag([x[1] for x in xs], sum(x[1] for x in xs)))
                for k, xs in grouped(items).items()]
    verify_processor(lambda: AccumulateProcessor(bag_op(), lambda x: x[0])) \
        .input(items).output_checker(same_items).expect_output(expected)


def test_combine_keyed_to_list_merges_partial_accumulators_in_place():
    # (key, partial list) from three upstream processors; combine extends the first list
    partials = [(f"k{i % 3}", [i, i + 100]) for i in range(30)]
    expected = [(k, [v for _, acc in ps for v in acc]) for k, ps in grouped(partials).items()]
    verify_processor(lambda: CombineProcessor(ops.to_list(), keyed=True)) \
        .input(partials).output_checker(same_items).expect_output(expected)


def test_combine_keyless_to_list():
    partials = [[i, -i] for i in range(20)]
    verify_processor(lambda: CombineProcessor(ops.to_list(), keyed=False)) \
        .input(partials).expect_output([[v for p in partials for v in p]])


def test_combine_keyed_custom_mutable_accumulator():
    partials = [(f"k{i % 4}", Bag([i], i)) for i in range(24)]
    expected = [(k, (sum(b.total for _, b in ps), tuple(b.items[0] for _, b in ps)))
                for k, ps in grouped(partials).items()]
    verify_processor(lambda: CombineProcessor(bag_op(), keyed=True)) \
        .input(partials).output_checker(same_items).expect_output(expected)


def test_aggregate_single_stage_keyed_and_keyless_without_combine():
    items = keyed_items()
    verify_processor(lambda: AggregateProcessor(list_op_without_combine(), lambda x: x[0])) \
        .input(items).output_checker(same_items).expect_output(list(grouped(items).items()))
    verify_processor(lambda: AggregateProcessor(list_op_without_combine(), None)) \
        .input(items).expect_output([items])


# --- windows ------------------------------------------------------------------------------------

def frames_reference(stream: list, slide: int, ops_count: int = 1) -> list:
    """What FrameAccumulateProcessor emits with to_list on every input: (key, frame, acc)
    when the watermark passes the frame (acc a list, or a list of lists per input)."""
    frames: dict = {}
    min_ts = NO_WM
    out: list = []

    def emit(f):
        for k, accs in frames.pop(f).items():
            out.append((k, f, accs[0] if ops_count == 1 else accs))

    for ordinal, e in stream:
        if isinstance(e, Watermark):
            limit = e.timestamp - e.timestamp % slide
            if limit > min_ts:
                min_ts = limit
                for f in sorted(f for f in frames if f < limit):
                    emit(f)
            out.append(e)
            continue
        t, x = e
        if t < min_ts:
            continue  # late
        accs = frames.setdefault(t - t % slide, {}).setdefault(
            x[0], [[] for _ in range(ops_count)])
        accs[ordinal].append(x)
    for f in sorted(frames):
        emit(f)
    return out


def test_frame_accumulate_tumbling_to_list():
    stream = event_stream()
    wdef = WindowDefinition.tumbling(10)
    verify_processor(lambda: FrameAccumulateProcessor("w", wdef, [ops.to_list()],
                                                      [lambda x: x[0]])) \
        .input(stream).output_checker(same_per_watermark) \
        .expect_output(frames_reference([(0, e) for e in stream], 10))


def test_frame_accumulate_sliding_custom_mutable_accumulator():
    stream = event_stream(seed=5)
    wdef = WindowDefinition.sliding(30, 10)
    expected = [e if isinstance(e, Watermark) else
                (e[0], e[1], Bag([x[1] for x in e[2]], sum(x[1] for x in e[2])))
                for e in frames_reference([(0, e) for e in stream], 10)]
    verify_processor(lambda: FrameAccumulateProcessor("w", wdef, [bag_op()],
                                                      [lambda x: x[0]])) \
        .input(stream).output_checker(same_per_watermark).expect_output(expected)


def windows_reference(frame_items: list, size: int, slide: int, combine, finish,
                      keyed: bool = True) -> list:
    """What WindowCombineProcessor emits for (key, frame, acc) input: each window with a
    frame, once the watermark (rounded down to a frame) reaches its end."""
    frames: dict = {}
    min_ts = NO_WM
    next_end = None
    out: list = []

    def emit_upto(limit):
        nonlocal next_end
        if frames:
            e = next_end if next_end is not None else min(frames) + slide
            while e <= limit:
                in_window = sorted(f for f in frames if e - size <= f < e)
                accs: dict = {}
                for f in in_window:
                    for k, a in frames[f].items():
                        accs[k] = combine(accs[k], a) if k in accs else a
                for k, a in accs.items():
                    out.append(KeyedWindowResult(e - size, e, k, finish(a)) if keyed
                               else WindowResult(e - size, e, finish(a)))
                e += slide
        nxt = limit + slide
        if next_end is None or nxt > next_end:
            next_end = nxt

    for e in frame_items:
        if isinstance(e, Watermark):
            limit = e.timestamp - e.timestamp % slide
            if limit > min_ts:
                min_ts = limit
                emit_upto(limit)
            out.append(e)
            continue
        k, f, a = e
        if f < min_ts:
            continue
        t = frames.setdefault(f, {})
        t[k] = combine(t[k], a) if k in t else a
    if frames:
        emit_upto(max(frames) + size)
    return out


def test_window_combine_sliding_to_list_recombines_frames():
    stream = event_stream(seed=7)
    items = [e if isinstance(e, Watermark) else (e[0], e[1], list(e[2]))
             for e in frames_reference([(0, e) for e in stream], 10)]
    expected = windows_reference(items, 30, 10, lambda a, b: a + b, list)
    verify_processor(lambda: WindowCombineProcessor("w", WindowDefinition.sliding(30, 10),
                                                    ops.to_list(), keyed=True)) \
        .input(items).output_checker(same_per_watermark).expect_output(expected)


def test_window_combine_sliding_averaging_with_deduct_keeps_a_running_window():
    stream = event_stream(seed=8)
    items = [e if isinstance(e, Watermark) else
             (e[0], e[1], [sum(x[1] for x in e[2]), len(e[2])])
             for e in frames_reference([(0, e) for e in stream], 10)]
    expected = windows_reference(items, 40, 10, lambda a, b: [a[0] + b[0], a[1] + b[1]],
                                 lambda a: a[0] / a[1])
    verify_processor(lambda: WindowCombineProcessor(
        "w", WindowDefinition.sliding(40, 10), ops.averaging(lambda x: x[1]), keyed=True)) \
        .input(items).output_checker(same_per_watermark).expect_output(expected)


def counter_op_with_deduct() -> AggregateOperation:
    """Counts of each value in a dict that accumulate, combine and deduct change in place;
    export is the default (the accumulator itself)."""
    def accumulate(d: dict, x: Any) -> dict:
        d[x[1]] = d.get(x[1], 0) + 1
        return d

    def combine(a: dict, b: dict) -> dict:
        for v, n in b.items():
            a[v] = a.get(v, 0) + n
        return a

    def deduct(a: dict, b: dict) -> dict:
        for v, n in b.items():
            a[v] -= n
            if not a[v]:
                del a[v]
        return a
    return AggregateOperation(dict, accumulate, combine, deduct)


def test_window_combine_deduct_path_emits_results_that_later_windows_do_not_change():
    stream = event_stream(seed=10)
    items = []
    for e in frames_reference([(0, e) for e in stream], 10):
        if isinstance(e, Watermark):
            items.append(e)
        else:
            counts: dict = {}
            for x in e[2]:
                counts[x[1]] = counts.get(x[1], 0) + 1
            items.append((e[0], e[1], counts))

    def merged(a: dict, b: dict) -> dict:
        return {v: a.get(v, 0) + b.get(v, 0) for v in {**a, **b}}

    expected = windows_reference(items, 30, 10, merged, dict)
    verify_processor(lambda: WindowCombineProcessor("w", WindowDefinition.sliding(30, 10),
                                                    counter_op_with_deduct(), keyed=True)) \
        .input(items).output_checker(same_per_watermark).expect_output(expected)


def test_window_combine_tumbling_keyless_to_list():
    stream = event_stream(seed=9)
    items = [e if isinstance(e, Watermark) else (None, e[1], list(e[2]))
             for e in frames_reference([(0, e) for e in stream], 10)]
    # keyless: stage 1 sends one accumulator per frame, under the key None
    merged: list = []
    for e in items:
        if not isinstance(e, Watermark) and merged and not isinstance(merged[-1], Watermark) \
                and merged[-1][1] == e[1]:
            merged[-1] = (None, e[1], merged[-1][2] + e[2])
        else:
            merged.append(e)
    expected = windows_reference(merged, 10, 10, lambda a, b: a + b, list, keyed=False)
    verify_processor(lambda: WindowCombineProcessor("w", WindowDefinition.tumbling(10),
                                                    ops.to_list(), keyed=False)) \
        .input(merged).output_checker(same_per_watermark).expect_output(expected)


def sliding_one_stage_reference(stream: list, size: int, slide: int) -> list:
    windows: dict = {}
    min_ts = NO_WM
    out: list = []

    def emit(e):
        for k, acc in windows.pop(e).items():
            out.append(KeyedWindowResult(e - size, e, k, acc))

    for e in stream:
        if isinstance(e, Watermark):
            limit = e.timestamp - e.timestamp % slide
            if limit > min_ts:
                min_ts = limit
                for end in sorted(x for x in windows if x <= limit):
                    emit(end)
            out.append(e)
            continue
        t, x = e
        if t < min_ts:
            continue
        f = t - t % slide
        for end in range(f + slide, f + size + 1, slide):
            windows.setdefault(end, {}).setdefault(x[0], []).append(x)
    for end in sorted(windows):
        emit(end)
    return out


def test_sliding_window_one_stage_without_combine():
    stream = event_stream(seed=11)
    verify_processor(lambda: SlidingWindowProcessor("w", WindowDefinition.sliding(20, 5),
                                                    list_op_without_combine(),
                                                    lambda x: x[0])) \
        .input(stream).output_checker(same_per_watermark) \
        .expect_output(sliding_one_stage_reference(stream, 20, 5))


def session_reference(stream: list, gap: int) -> list:
    sessions: dict = {}  # key -> sorted [start, end, items]
    min_ts = NO_WM
    out: list = []

    def close(limit):
        done = []
        for k in list(sessions):
            keep = []
            for s in sessions[k]:
                (done if s[1] <= limit else keep).append((s, k))
            sessions[k] = [s for s, _ in keep]
            if not sessions[k]:
                del sessions[k]
        for s, k in sorted(done, key=lambda d: (d[0][1], d[0][0])):
            out.append(KeyedWindowResult(s[0], s[1], k, s[2]))

    for e in stream:
        if isinstance(e, Watermark):
            if e.timestamp > min_ts:
                min_ts = e.timestamp
                close(min_ts)
            out.append(e)
            continue
        t, x = e
        if t < min_ts:
            continue
        ss = sessions.setdefault(x[0], [])
        hits = [s for s in ss if s[0] < t + gap and t < s[1]]
        if not hits:
            ss.append([t, t + gap, [x]])
            ss.sort(key=lambda s: s[0])
            continue
        first = hits[0]
        for s in hits[1:]:
            first[2] = first[2] + s[2]
            first[1] = max(first[1], s[1])
            ss.remove(s)
        first[0] = min(first[0], t)
        first[1] = max(first[1], t + gap)
        first[2] = first[2] + [x]
    close(max((s[1] for ss in sessions.values() for s in ss), default=NO_WM))
    return out


def test_session_window_to_list_merges_sessions_in_place():
    stream = event_stream(seed=12, spacing=4, disorder=10)
    verify_processor(lambda: SessionWindowProcessor("s", WindowDefinition.session(6),
                                                    ops.to_list(), lambda x: x[0])) \
        .input(stream).output_checker(same_per_watermark) \
        .expect_output(session_reference(stream, 6))


# --- co-aggregation (aggregate2, windowed join) -------------------------------------------------

def test_co_aggregate_frames_of_two_inputs():
    left, right = event_stream(seed=21), event_stream(seed=22, keys=2)
    wdef = WindowDefinition.tumbling(10)
    # the engine coalesces the two inputs' watermarks: here each input keeps its own, and the
    # processor sees both (its frames close at the higher one, as the reference does)
    tagged = _interleave(left, right)
    verify_processor(lambda: FrameAccumulateProcessor(
        "w", wdef, [ops.to_list(), ops.to_list()], [lambda x: x[0], lambda x: x[0]])) \
        .inputs([left, right]).disable_snapshots().output_checker(same_items) \
        .expect_output(frames_reference(tagged, 10, ops_count=2))


def _interleave(left: list, right: list) -> list:
    """(ordinal, item) in the order the harness delivers two equal-priority inputs when it
    gives them whole runs between watermarks: a run of one, then of the other."""
    def runs(items):
        out, run = [], []
        for x in items:
            if isinstance(x, Watermark):
                if run:
                    out.append(run)
                    run = []
                out.append([x])
            else:
                run.append(x)
        if run:
            out.append(run)
        return out
    a, b = runs(left), runs(right)
    out: list = []
    for i in range(max(len(a), len(b))):
        out += [(0, x) for x in (a[i] if i < len(a) else [])]
        out += [(1, x) for x in (b[i] if i < len(b) else [])]
    return out


def test_co_aggregate_frames_of_two_inputs_through_snapshots():
    # watermarks only on the last input, where the engine would have coalesced both, so every
    # mode delivers the same items before each watermark
    left = [(t, ("k", t)) for t in range(0, 60, 3)]
    right = [(t, ("k" if t % 2 else "j", -t)) for t in range(1, 60, 4)]
    stream_right = right[:8] + [wm(20)] + right[8:] + [wm(40)]
    expected_frames = {}
    for ordinal, (t, x) in [(0, e) for e in left] + [(1, e) for e in right]:
        accs = expected_frames.setdefault((x[0], t - t % 10), [[], []])
        accs[ordinal].append((t, x))
    verify_processor(lambda: FrameAccumulateProcessor(
        "w", WindowDefinition.tumbling(10), [ops.to_list(), ops.to_list()],
        [lambda x: x[0], lambda x: x[0]])) \
        .inputs([[e for e in left], stream_right]) \
        .output_checker(_frames_regardless_of_arrival) \
        .expect_output([(k, f, [[p[1] for p in a[0]], [p[1] for p in a[1]]])
                        for (k, f), a in expected_frames.items()])


def _frames_regardless_of_arrival(expected: list, actual: list) -> bool:
    """Every frame's accumulators hold the same items; watermarks are ignored (their place
    depends on how the inputs interleave), items within an accumulator compared as sets."""
    def norm(items):
        return sorted((k, f, [sorted(a) for a in accs]) for k, f, accs in
                      (x for x in items if not isinstance(x, Watermark)))
    return norm(expected) == norm(actual)


def test_windowed_join_combines_both_sides_lists_per_window():
    op = composite_operation([ops.to_list(), ops.to_list()])
    frame_items = [("a", 0, [[1], ["x"]]), ("a", 10, [[2], []]), ("b", 0, [[], ["y"]]),
                   wm(10), ("a", 10, [[3], ["z"]]), ("b", 20, [[4], ["w"]]), wm(25),
                   ("a", 30, [[5], []])]
    expected = windows_reference(frame_items, 20, 10,
                                 lambda a, b: [a[0] + b[0], a[1] + b[1]], tuple)
    verify_processor(lambda: WindowCombineProcessor("j", WindowDefinition.sliding(20, 10), op,
                                                    keyed=True)) \
        .input(frame_items).output_checker(same_per_watermark).expect_output(expected)


# --- rolling aggregates and map_stateful ---------------------------------------------------------

def test_rolling_aggregate_keyed_to_list_emits_a_copy_per_item():
    items = keyed_items(40)
    seen: dict = {}
    expected = []
    for x in items:
        seen.setdefault(x[0], []).append(x)
        expected.append((x[0], list(seen[x[0]])))
    verify_processor(lambda: RollingAggregateProcessor("r", ops.to_list(), lambda x: x[0],
                                                       False)) \
        .input(items).expect_output(expected)


def test_rolling_aggregate_timestamped_custom_mutable_accumulator_forwards_watermarks():
    stream = event_stream(40, seed=31)
    bags: dict = {}
    expected = []
    for e in stream:
        if isinstance(e, Watermark):
            expected.append(e)
            continue
        t, x = e
        b = bags.setdefault(x[0], Bag()).add(x[1])
        expected.append((t, (x[0], (b.total, tuple(b.items)))))
    verify_processor(lambda: RollingAggregateProcessor("r", bag_op(), lambda x: x[0], True)) \
        .input(stream).expect_output(expected)


def test_rolling_aggregate_keyless():
    items = list(range(30))
    verify_processor(lambda: RollingAggregateProcessor("r", ops.to_list(), None, False)) \
        .input(items).expect_output([list(range(i + 1)) for i in range(30)])


def append_state(state: list, key: Any, x: Any) -> tuple:
    state.append(x[1])
    return key, tuple(state)


def test_map_stateful_keyed_list_state_changed_in_place():
    items = keyed_items(50)
    states: dict = {}
    expected = []
    for x in items:
        states.setdefault(x[0], []).append(x[1])
        expected.append((x[0], tuple(states[x[0]])))
    verify_processor(lambda: MapStatefulProcessor("m", list, append_state, lambda x: x[0],
                                                  False)) \
        .input(items).expect_output(expected)


def test_map_stateful_keyless_dict_state():
    def count(state: dict, x):
        state[x % 3] = state.get(x % 3, 0) + 1
        return dict(state)

    expected, state = [], {}
    for x in range(25):
        state[x % 3] = state.get(x % 3, 0) + 1
        expected.append(dict(state))
    verify_processor(lambda: MapStatefulProcessor("m", dict, count, None, False)) \
        .input(list(range(25))).expect_output(expected)


def map_stateful_ttl_reference(stream: list, ttl: int) -> list:
    states: dict = {}
    last: dict = {}
    wm_ts = NO_WM
    out: list = []

    def evict(limit):
        for k in sorted((k for k in states if last[k] + ttl < limit), key=repr):
            out.append((limit, ("evicted", k, tuple(states.pop(k)))))
            del last[k]

    for e in stream:
        if isinstance(e, Watermark):
            if e.timestamp > wm_ts:
                wm_ts = e.timestamp
                evict(wm_ts)
            out.append(e)
            continue
        t, x = e
        if wm_ts != NO_WM and t < wm_ts - ttl:
            continue  # late: its state may be gone
        k = x[0]
        if k not in states:
            states[k] = []
            last[k] = t
        else:
            last[k] = max(last[k], t)
        states[k].append(x[1])
        out.append((t, (k, tuple(states[k]))))
    evict(END_OF_TIME)
    return out


def test_map_stateful_with_ttl_evicts_and_restores_expiry():
    stream = event_stream(90, keys=5, seed=41, spacing=4, every=6)
    verify_processor(lambda: MapStatefulProcessor(
        "m", list, append_state, lambda x: x[0], True, ttl=15,
        on_evict=lambda state, key, watermark: ("evicted", key, tuple(state)))) \
        .input(stream).output_checker(same_per_watermark) \
        .expect_output(map_stateful_ttl_reference(stream, 15))


# --- distinct, sort, hash join --------------------------------------------------------------------

def test_distinct_keeps_the_first_item_of_each_key():
    items = [(i % 7, i) for i in range(40)]
    verify_processor(lambda: DistinctProcessor(lambda x: x[0])) \
        .input(items).expect_output(items[:7])


def test_sort_collects_and_emits_one_sorted_run():
    items = [random.Random(3).randint(0, 1000) for _ in range(60)]
    verify_processor(lambda: SortProcessor(None, False)).input(items) \
        .expect_output([sorted(items)])


def test_merge_sorted_merges_runs():
    rnd = random.Random(4)
    runs = [sorted(rnd.randint(0, 100) for _ in range(n)) for n in (5, 9, 0, 7)]
    verify_processor(lambda: MergeSortedProcessor(None, False)).input(runs) \
        .expect_output(sorted(x for r in runs for x in r))


@pytest.mark.parametrize("outer", [False, True])
def test_hash_join_builds_its_table_before_the_stream(outer):
    build = [(k, f"v{k}-{i}") for i in range(3) for k in range(4)]  # values appended per key
    stream = list(range(8))
    expected = []
    for item in stream:
        matches = [v for k, v in build if k == item % 5]
        expected += [(item, v) for v in matches] or ([(item, None)] if outer else [])
    verify_processor(lambda: HashJoinProcessor(lambda x: x % 5, lambda e: e[0], lambda e: e[1],
                                               lambda item, value: (item, value), outer)) \
        .inputs([stream, build], priorities=[0, -1]).expect_output(expected)


# --- sources ----------------------------------------------------------------------------------

def test_items_source_resumes_from_its_position():
    items = list(range(3000))
    verify_processor(lambda: ItemsSourceProcessor(items)).outbox_capacity(1) \
        .expect_output(items)


def test_file_source_resumes_inside_a_file(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("".join(f"{name}:{i:05}\n" for i in range(7000)))
    pattern = str(tmp_path / "*.txt")
    verify_processor(lambda: FileSourceProcessor(pattern, "utf-8")).outbox_capacity(1) \
        .expect_output([f"{n}:{i:05}" for n in ("a.txt", "b.txt") for i in range(7000)])


@pytest.fixture
def member():
    with Member() as m:
        yield m


def test_map_source_resumes_after_the_partitions_it_emitted(member):
    entries = {f"key{i}": [i, i * i] for i in range(200)}
    member.get_map("src").put_all(list(entries.items()))
    verify_processor(lambda: MapSourceProcessor("src")).context(member=member) \
        .outbox_capacity(1).output_checker(same_items) \
        .expect_output(list(entries.items()))


def test_map_journal_source_resumes_from_its_saved_sequence(member):
    m = member.get_map("journaled")
    for i in range(50):
        m.put(f"k{i % 10}", [i])
    verify_processor(lambda: MapJournalSourceProcessor("journaled", "oldest", "fail")) \
        .context(member=member).outbox_capacity(1).run_until_output_matches(10, 0.05) \
        .expect_output([(f"k{i % 10}", [i]) for i in range(50)])


def test_sources_items_from_the_catalogue():
    verify_processor(Sources.items(list(range(2500)))).outbox_capacity(1) \
        .expect_output(list(range(2500)))


# --- sinks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_list_sink_writes_each_item_once(member, guarantee):
    out = member.get_list("sink-out")
    items = [[i, "payload"] for i in range(40)]

    def check():
        assert list(out) == items

    verify_processor(Sinks.list("sink-out")).context(member=member,
                                                    processing_guarantee=guarantee) \
        .input(items).before_each_run(out.clear).after_each_run(check).expect_outputs([])


def test_map_sink_puts_every_entry(member):
    out = member.get_map("sink-map")
    items = [(f"k{i % 7}", [i]) for i in range(30)]
    final = dict(items)

    def check():
        assert dict(out.items()) == final

    verify_processor(Sinks.map("sink-map")).context(member=member).input(items) \
        .before_each_run(out.clear).after_each_run(check).expect_outputs([])


# --- the same with keyed state in RocksDB (snapshots are checkpoint files) ---------------------

def rocksdb_state(tmp_path):
    """A JobConfig(state_backend="rocksdb")-like state factory: a fresh database per processor
    instance, as every restored execution gets."""
    import itertools

    from jetwake.snapshot.state.rocksdb_backend import RocksDBStateBackend
    counter = itertools.count()

    def factory(vertex: str, index: int, name: str) -> RocksDBStateBackend:
        return RocksDBStateBackend(str(tmp_path / f"{vertex}-{index}-{name}-{next(counter)}"))
    return factory


def test_rolling_aggregate_with_rocksdb_state_restores_from_checkpoints(tmp_path):
    items = keyed_items(40)
    seen: dict = {}
    expected = []
    for x in items:
        seen.setdefault(x[0], []).append(x)
        expected.append((x[0], list(seen[x[0]])))
    verify_processor(lambda: RollingAggregateProcessor("r", ops.to_list(), lambda x: x[0],
                                                       False)) \
        .context(state_factory=rocksdb_state(tmp_path)) \
        .input(items).expect_output(expected)


def test_map_stateful_with_rocksdb_state_restores_from_checkpoints(tmp_path):
    items = keyed_items(50)
    states: dict = {}
    expected = []
    for x in items:
        states.setdefault(x[0], []).append(x[1])
        expected.append((x[0], tuple(states[x[0]])))
    verify_processor(lambda: MapStatefulProcessor("m", list, append_state, lambda x: x[0],
                                                  False)) \
        .context(state_factory=rocksdb_state(tmp_path)) \
        .input(items).expect_output(expected)
