"""Tumbling and sliding windows end to end, against brute-force references."""

from __future__ import annotations

import pytest

from jetwake import (
    AggregateOperation, AggregateOperations as ops, KeyedWindowResult, Member, Pipeline, Sinks,
    Sources, WindowDefinition, WindowResult,
)
from support.window_reference import (
    check_late, make_events, multiset_minus, sliding_reference, step_of,
)


def run(p: Pipeline, *lists: str) -> tuple[list, ...] | list:
    with Member(local_parallelism=2) as m:
        job = m.new_job(p)
        job.join(timeout=60)
        out = tuple(list(m.get_list(name)) for name in lists)
        late_metric = sum(v.get("late_events", 0) for v in job.metrics().values())
    return out + (late_metric,)


def windowed_counts(events, wdef, lag, op=None, late_sink=True):
    p = Pipeline()
    w = (p.read_from(Sources.items(events))
          .with_timestamps(lambda e: e[0], allowed_lag=lag)
          .window(wdef))
    if late_sink:
        w = w.late_events_to(Sinks.list("late"))
    (w.group_by(lambda e: e[1])
      .aggregate(op or ops.counting())
      .write_to(Sinks.list("out")))
    out, late, metric = run(p, "out", "late")
    return sorted(tuple(r) for r in out), late, metric


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tumbling_counts_match_brute_force_with_disorder_below_the_lag(seed):
    events = make_events(20_000, keys=50, disorder=40, seed=seed)
    got, late, metric = windowed_counts(events, WindowDefinition.tumbling(100), lag=50)
    assert late == [] and metric == 0
    assert got == sliding_reference(events, 100, 100)


@pytest.mark.parametrize("seed", [4, 5])
def test_sliding_counts_match_brute_force_with_disorder_below_the_lag(seed):
    events = make_events(20_000, keys=50, disorder=90, seed=seed)
    got, late, metric = windowed_counts(events, WindowDefinition.sliding(500, 100), lag=100)
    assert late == [] and metric == 0
    assert got == sliding_reference(events, 500, 100)


@pytest.mark.parametrize("size,slide", [(100, 100), (400, 100)])
def test_disorder_above_the_lag_routes_late_events_and_windows_hold_the_rest(size, slide):
    events = make_events(20_000, keys=20, disorder=300, seed=size)
    got, late, metric = windowed_counts(events, WindowDefinition.sliding(size, slide), lag=50)
    assert late, "disorder above the lag must produce late events"
    assert metric == len(late)
    check_late(events, late, lag=50, step=step_of(slide))
    assert got == sliding_reference(multiset_minus(events, late), size, slide)


def test_very_late_events_are_always_late():
    events = make_events(40_000, keys=10, disorder=0, seed=9)
    stragglers = [(5, "k1", 1, -1), (17, "k2", 1, -2), (1_000, "k3", 1, -3)]
    events = events[:100] + events[100:] + stragglers
    got, late, metric = windowed_counts(events, WindowDefinition.tumbling(100), lag=10)
    assert sorted(late) == sorted(stragglers)
    assert metric == 3
    assert got == sliding_reference(events[:-3], 100, 100)


def test_late_events_are_dropped_and_counted_without_a_late_sink():
    events = make_events(40_000, keys=10, disorder=0, seed=10) + [(3, "k1", 1, -1)]
    got, _late, metric = windowed_counts(events, WindowDefinition.tumbling(100), lag=10,
                                         late_sink=False)
    assert metric == 1
    assert got == sliding_reference(events[:-1], 100, 100)


def test_results_are_keyed_window_results_with_named_fields():
    events = [(0, "a", 1), (5, "a", 2), (12, "b", 3)]
    p = Pipeline()
    (p.read_from(Sources.items(events))
      .with_timestamps(lambda e: e[0], allowed_lag=0)
      .window(WindowDefinition.tumbling(10))
      .group_by(lambda e: e[1])
      .aggregate(ops.all_of(ops.counting(), ops.summing(lambda e: e[2])))
      .write_to(Sinks.list("out")))
    (out, _) = run(p, "out")
    out.sort()
    assert out == [KeyedWindowResult(0, 10, "a", (2, 3)), KeyedWindowResult(10, 20, "b", (1, 3))]
    r = out[0]
    assert isinstance(r, KeyedWindowResult)
    assert (r.start, r.end, r.key, r.result, r.is_early) == (0, 10, "a", (2, 3), False)


def test_keyless_window_emits_window_results():
    events = make_events(5_000, keys=5, disorder=20, seed=11)
    p = Pipeline()
    (p.read_from(Sources.items(events))
      .with_timestamps(lambda e: e[0], allowed_lag=30)
      .window(WindowDefinition.sliding(200, 50))
      .aggregate(ops.summing(lambda e: e[2]))
      .write_to(Sinks.list("out")))
    (out, _) = run(p, "out")
    assert all(type(r) is WindowResult for r in out)
    assert sorted(tuple(r) for r in out) == sliding_reference(
        events, 200, 50, keyed=False, value=lambda e: e[2])


def test_operation_without_deduct_recombines_frames():
    events = make_events(10_000, keys=30, disorder=20, seed=12)
    got, late, _ = windowed_counts(events, WindowDefinition.sliding(300, 100), lag=30,
                                   op=ops.max_by(lambda e: e[2]))
    assert late == []
    ref = sliding_reference(events, 300, 100, value=lambda e: e,
                            combine=lambda a, b: b if b[2] > a[2] else a)
    # equal maxima may pick different items: compare the maximum values
    assert [(s, e, k, v[2]) for s, e, k, v in got] == [(s, e, k, v[2]) for s, e, k, v in ref]


def test_operation_without_combine_runs_in_one_stage():
    events = make_events(5_000, keys=10, disorder=20, seed=13)
    count_only = AggregateOperation(create=lambda: 0, accumulate=lambda a, x: a + 1)
    p = Pipeline()
    (p.read_from(Sources.items(events))
      .with_timestamps(lambda e: e[0], allowed_lag=30)
      .window(WindowDefinition.sliding(200, 100))
      .group_by(lambda e: e[1])
      .aggregate(count_only)
      .write_to(Sinks.list("out")))
    assert not any(v.name.endswith("-accumulate") for v in p.to_dag(2).vertices)
    (out, _) = run(p, "out")
    assert sorted(tuple(r) for r in out) == sliding_reference(events, 200, 100)


def test_two_stage_plan_uses_a_distributed_partitioned_edge_between_stages():
    p = Pipeline()
    (p.read_from(Sources.items([(1, "a")]))
      .with_timestamps(lambda e: e[0], 0)
      .window(WindowDefinition.sliding(10, 5))
      .group_by(lambda e: e[1])
      .aggregate(ops.counting())
      .write_to(Sinks.list("out")))
    dag = p.to_dag(2)
    (edge,) = [e for e in dag.edges if e.source.name.endswith("-accumulate")]
    assert edge.is_distributed and edge.routing.value == "partitioned"


def test_jet_order_group_by_then_window_gives_the_same_results():
    events = make_events(3_000, keys=7, disorder=10, seed=14)
    p = Pipeline()
    (p.read_from(Sources.items(events))
      .with_timestamps(lambda e: e[0], allowed_lag=20)
      .group_by(lambda e: e[1])
      .window(WindowDefinition.tumbling(100))
      .aggregate(ops.counting())
      .write_to(Sinks.list("out")))
    (out, _) = run(p, "out")
    assert sorted(tuple(r) for r in out) == sliding_reference(events, 100, 100)


def test_timestamps_survive_stateless_stages_before_the_window():
    events = make_events(3_000, keys=7, disorder=10, seed=15)
    p = Pipeline()
    (p.read_from(Sources.items(events))
      .with_timestamps(lambda e: e[0], allowed_lag=20)
      .map(lambda e: {"key": e[1], "v": e[2]})      # the timestamp is no longer in the item
      .filter(lambda d: d["v"] > 50)
      .window(WindowDefinition.tumbling(100))
      .group_by(lambda d: d["key"])
      .aggregate(ops.counting())
      .write_to(Sinks.list("out")))
    (out, _) = run(p, "out")
    assert sorted(tuple(r) for r in out) == sliding_reference(
        [e for e in events if e[2] > 50], 100, 100)


def test_end_of_a_finite_stream_emits_every_open_window():
    events = [(0, "a", 1), (250, "a", 1), (999, "b", 1)]
    p = Pipeline()
    (p.read_from(Sources.items(events))
      .with_timestamps(lambda e: e[0], allowed_lag=10_000)  # no watermark closes anything
      .window(WindowDefinition.sliding(200, 100))
      .group_by(lambda e: e[1])
      .aggregate(ops.counting())
      .write_to(Sinks.list("out")))
    (out, _) = run(p, "out")
    assert sorted(tuple(r) for r in out) == sliding_reference(events, 200, 100)


def test_window_results_are_written_to_a_sink_of_the_results_stage_and_mapped():
    events = make_events(1_000, keys=3, disorder=0, seed=16)
    p = Pipeline()
    results = (p.read_from(Sources.items(events))
                .with_timestamps(lambda e: e[0], allowed_lag=0)
                .window(WindowDefinition.tumbling(100))
                .group_by(lambda e: e[1])
                .aggregate(ops.counting()))
    results.map(lambda r: (r.key, r.end, r.result)).write_to(Sinks.list("mapped"))
    results.write_to(Sinks.list("raw"))
    mapped, raw, _ = run(p, "mapped", "raw")
    assert sorted(mapped) == sorted((r.key, r.end, r.result) for r in raw)
    assert len(raw) == len(sliding_reference(events, 100, 100))


def test_a_frame_accumulator_whose_input_falls_idle_sends_its_partial_frames_first():
    """A combiner whose inputs all fall idle moves on to the highest watermark any reached;
    frames still held by an accumulator whose input is idle would then arrive late and be
    dropped. They leave before the idle marker instead."""
    from jetwake import AggregateOperations as ops
    from jetwake.engine.core.processor import Inbox, Outbox, ProcessorContext
    from jetwake.engine.core.stream_items import IDLE_MESSAGE, Watermark
    from jetwake.engine.processors.sliding_window import FrameAccumulateProcessor

    acc = FrameAccumulateProcessor("w", WindowDefinition.tumbling(100), [ops.counting()],
                                   [None], False)
    acc.outbox = Outbox(1, 1_000)
    acc.init(ProcessorContext("j", "j", "w-accumulate", 0, 0, 1, 1, 0, 1))
    acc.process(0, Inbox([(10, "a"), (150, "b"), (160, "c")]))
    assert acc.try_process_watermark(Watermark(100))
    assert acc.outbox.drain(0) == [(None, 0, 1), Watermark(100)]
    assert acc.try_process_watermark(IDLE_MESSAGE)
    assert acc.outbox.drain(0) == [(None, 100, 2), IDLE_MESSAGE]


@pytest.mark.parametrize("op", [ops.counting(), AggregateOperation(
    lambda: 0, lambda a, x: a + 1, combine=lambda a, b: a + b)], ids=["deduct", "no-deduct"])
def test_the_combining_rule_closes_the_windows_the_watermark_passed_from_any_partials(op):
    # FrameWindows is the combining processor's state and the backfill's second stage: frames
    # as partials of several tasks, in any order, give each window once, when a watermark
    # passes its end, and it keeps the frames only of the windows still open (with deduct,
    # also the frame that leaves the next window)
    from jetwake.engine.processors.sliding_window import FrameWindows
    size, slide = 30, 10
    frames = FrameWindows(op, size, slide, keyed=True)
    partials = [("a", 0, 1), ("b", 10, 2), ("a", 20, 3), ("a", 0, 4), ("a", 50, 5),
                ("b", 10, 6)]
    assert frames.add(partials[3:]) == 0 and frames.add(partials[:3]) == 0
    by_frame = {("a", 0): 5, ("b", 10): 8, ("a", 20): 3, ("a", 50): 5}

    def expected(ends):
        return sorted(KeyedWindowResult(e - size, e, k, sum(n for (kk, f), n in by_frame.items()
                                                         if kk == k and e - size <= f < e))
                      for e in ends for k in "ab"
                      if any(kk == k and e - size <= f < e for kk, f in by_frame))

    first = [r for rs in frames.windows_upto(30) for r in rs]
    assert sorted(first) == expected([10, 20, 30])
    assert frames.next_end == 40
    assert min(frames.frames) == (0 if op.can_deduct else 10)  # the windows from 40 on
    # a frame the watermark has passed is late (after a restore, or an idle input woke up)
    assert frames.add([("a", 30, 1)], min_ts=30) == 0
    assert frames.add([("b", 20, 1)], min_ts=30) == 1
    by_frame[("a", 30)] = 1
    rest = [r for rs in frames.every_window() for r in rs]
    assert sorted(rest) == expected(range(40, 90, 10))
    # no window is open: only the frame the next window would deduct may be left
    left = set(frames.frames)
    assert left <= ({frames.next_end - size - slide} if op.can_deduct else set())
