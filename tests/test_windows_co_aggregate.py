"""Windowed co-aggregation of two streams (aggregate2) and the windowed stream-to-stream join."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import pytest

from jetwake import (
    AggregateOperations as ops, KeyedWindowResult, Member, Pipeline, PipelineError, Sinks,
    Sources, TestSources, WindowDefinition, WindowResult,
)
from support.waiting import wait_until
from support.window_reference import make_events


def two_streams(p, left, right, lag=30):
    a = p.read_from(Sources.items(left)).with_timestamps(lambda e: e[0], allowed_lag=lag)
    b = p.read_from(Sources.items(right)).with_timestamps(lambda e: e[0], allowed_lag=lag)
    return a, b


def collect(p, *names):
    with Member(local_parallelism=2) as m:
        m.new_job(p).join(timeout=60)
        return [list(m.get_list(n)) for n in names]


def test_aggregate2_counts_each_side_per_key_and_window():
    left = make_events(6_000, keys=20, disorder=20, seed=1)
    right = make_events(3_000, keys=20, disorder=20, seed=2, spacing=2)
    p = Pipeline()
    a, b = two_streams(p, left, right)
    (a.window(WindowDefinition.tumbling(100))
      .group_by(lambda e: e[1])
      .aggregate2(b.group_by(lambda e: e[1]), ops.counting(), ops.summing(lambda e: e[2]))
      .write_to(Sinks.list("out")))
    (out,) = collect(p, "out")
    ref: dict = defaultdict(lambda: [0, 0])
    for e in left:
        s = e[0] - e[0] % 100
        ref[(s, s + 100, e[1])][0] += 1
    for e in right:
        s = e[0] - e[0] % 100
        ref[(s, s + 100, e[1])][1] += e[2]
    assert all(isinstance(r, KeyedWindowResult) for r in out)
    assert sorted((r.start, r.end, r.key, r.result) for r in out) == sorted(
        (k[0], k[1], k[2], tuple(v)) for k, v in ref.items())


def test_aggregate2_accepts_jet_argument_order_and_keyless_windows():
    left = make_events(2_000, keys=3, disorder=5, seed=3)
    right = make_events(2_000, keys=3, disorder=5, seed=4)
    p = Pipeline()
    a, b = two_streams(p, left, right)
    (a.window(WindowDefinition.sliding(200, 100))
      .aggregate2(ops.counting(), b, ops.counting())
      .write_to(Sinks.list("out")))
    (out,) = collect(p, "out")
    ref: dict = defaultdict(lambda: [0, 0])
    for side, events in enumerate((left, right)):
        for e in events:
            f = e[0] - e[0] % 100
            for end in (f + 100, f + 200):
                ref[(end - 200, end)][side] += 1
    assert all(type(r) is WindowResult for r in out)
    assert sorted(tuple(r) for r in out) == sorted(k + (tuple(v),) for k, v in ref.items())


def test_co_aggregating_session_windows_is_refused_when_the_pipeline_is_built():
    # refused once, by the pipeline: neither a member's planner nor the Spark backfill meets it
    p = Pipeline()
    a, b = two_streams(p, [(0, "k", 1)], [(0, "k", 1)])
    keyed = a.window(WindowDefinition.session(50)).group_by(lambda e: e[1])
    with pytest.raises(PipelineError, match="co-aggregation of session windows is not "
                                            "supported; use sliding or tumbling windows"):
        keyed.aggregate2(b.group_by(lambda e: e[1]), ops.counting(), ops.counting())
    with pytest.raises(PipelineError, match="co-aggregation of session windows"):
        a.window(WindowDefinition.session(50)).aggregate2(b, ops.counting(), ops.counting())
    with pytest.raises(PipelineError, match="co-aggregation of session windows"):
        keyed.join(b.group_by(lambda e: e[1]), lambda x, y: (x, y))
    assert [t.kind for t in p.transforms].count("window-aggregate") == 0


def test_window_join_pairs_items_of_the_same_key_and_window():
    left = [(5, "a", "L1"), (15, "a", "L2"), (8, "b", "L3"), (120, "a", "L4")]
    right = [(7, "a", "R1"), (9, "a", "R2"), (110, "a", "R3"), (50, "c", "R4")]
    p = Pipeline()
    a, b = two_streams(p, left, right, lag=0)
    (a.window(WindowDefinition.tumbling(100))
      .group_by(lambda e: e[1])
      .join(b.group_by(lambda e: e[1]), lambda l, r: (l[2], r[2]))
      .write_to(Sinks.list("out")))
    (out,) = collect(p, "out")
    assert sorted(out) == sorted([
        KeyedWindowResult(0, 100, "a", ("L1", "R1")), KeyedWindowResult(0, 100, "a", ("L1", "R2")),
        KeyedWindowResult(0, 100, "a", ("L2", "R1")), KeyedWindowResult(0, 100, "a", ("L2", "R2")),
        KeyedWindowResult(100, 200, "a", ("L4", "R3"))])


def test_early_results_are_emitted_for_a_long_window_before_it_closes():
    # event n at time n ms: the first 60,000 events (five minutes at 200 a second) are all in
    # the window [0, 60000), whatever the wall clock says, so no result is a final one
    p = Pipeline()
    (p.read_from(TestSources.item_stream(200, lambda ts, seq: ("k", seq)))
      .with_timestamps(lambda e: e[1], allowed_lag=0)
      .window(WindowDefinition.tumbling(60_000).set_early_results_period(50))
      .group_by(lambda e: e[0])
      .aggregate(ops.counting())
      .write_to(Sinks.list("out")))
    with Member(local_parallelism=2) as m:
        job = m.new_job(p)

        def three_results() -> list | None:
            results = list(m.get_list("out"))
            return results if len(results) >= 3 else None
        out = wait_until(three_results, timeout=10, what="three early results")
        job.cancel()
    assert all(r.is_early and (r.start, r.end, r.key) == (0, 60_000, "k") for r in out), out
    counts = [r.result for r in out]
    assert counts == sorted(counts) and counts[0] > 0  # a window's partial counts only grow


def test_item_stream_is_rate_limited_and_carries_native_timestamps():
    p = Pipeline()
    (p.read_from(TestSources.item_stream(500, lambda ts, seq: (ts, seq)))
      .write_to(Sinks.list("items")))
    with Member(local_parallelism=2) as m:
        job = m.new_job(p)
        time.sleep(0.6)
        job.cancel()
        items = list(m.get_list("items"))
    assert 150 <= len(items) <= 450, len(items)
    seqs = [s for _, s in items]
    assert seqs == list(range(len(seqs)))
    tss = [t for t, _ in items]
    assert tss == sorted(tss) and abs(tss[0] - time.time() * 1000) < 5_000
    assert Counter(t2 - t1 for t1, t2 in zip(tss, tss[1:])).most_common(1)[0][0] == 2
