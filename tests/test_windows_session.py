"""Session windows end to end, against a brute-force reference."""

from __future__ import annotations

import pytest

from jetwake import (
    AggregateOperation, AggregateOperations as ops, KeyedWindowResult, Member, Pipeline,
    PipelineError, Sinks, Sources, WindowDefinition, WindowResult,
)
from support.window_reference import check_late, make_events, multiset_minus, session_reference


def sessions(events, gap, lag, keyed=True, op=None):
    p = Pipeline()
    w = (p.read_from(Sources.items(events))
          .with_timestamps(lambda e: e[0], allowed_lag=lag)
          .window(WindowDefinition.session(gap))
          .late_events_to(Sinks.list("late")))
    stage = w.group_by(lambda e: e[1]) if keyed else w
    stage.aggregate(op or ops.counting()).write_to(Sinks.list("out"))
    with Member(local_parallelism=2) as m:
        job = m.new_job(p)
        job.join(timeout=60)
        late_metric = sum(v.get("late_events", 0) for v in job.metrics().values())
        return list(m.get_list("out")), list(m.get_list("late")), late_metric


def sparse_events(n, keys, disorder, seed):
    # bursts: 5 events 0-9 ms apart, then a pause of 20-60 ms, per key at random
    events = make_events(n, keys, disorder, seed, spacing=7)
    return [(e[0] + (e[3] // 5) * 30, e[1], e[2], e[3]) for e in events]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sessions_match_brute_force_with_disorder_below_the_lag(seed):
    events = sparse_events(10_000, keys=40, disorder=30, seed=seed)
    out, late, metric = sessions(events, gap=50, lag=40)
    assert late == [] and metric == 0
    assert sorted(tuple(r) for r in out) == session_reference(events, 50)


@pytest.mark.parametrize("seed", [4, 5])
def test_sessions_with_disorder_above_the_lag_route_late_events(seed):
    events = sparse_events(10_000, keys=40, disorder=400, seed=seed)
    out, late, metric = sessions(events, gap=50, lag=40)
    assert late and metric == len(late)
    check_late(events, late, lag=40, step=50)
    assert sorted(tuple(r) for r in out) == session_reference(multiset_minus(events, late), 50)


def test_session_start_is_first_event_and_end_is_last_event_plus_gap():
    events = [(100, "a", 1, 0), (130, "a", 1, 1), (120, "a", 1, 2), (500, "a", 1, 3),
              (10, "b", 1, 4)]
    out, _, _ = sessions(events, gap=50, lag=1000)
    assert sorted(out) == [KeyedWindowResult(10, 60, "b", 1),
                           KeyedWindowResult(100, 180, "a", 3),
                           KeyedWindowResult(500, 550, "a", 1)]


def test_an_event_bridging_two_sessions_merges_them():
    # 0 and 100 are separate sessions of gap 60 until 50 arrives and overlaps both
    events = [(0, "a", 1, 0), (100, "a", 1, 1), (50, "a", 1, 2)]
    out, _, _ = sessions(events, gap=60, lag=1000, op=ops.summing(lambda e: e[2]))
    assert out == [KeyedWindowResult(0, 160, "a", 3)]


def test_keyless_sessions_emit_window_results():
    events = sparse_events(2_000, keys=1, disorder=5, seed=6)
    out, _, _ = sessions(events, gap=20, lag=10, keyed=False)
    assert all(type(r) is WindowResult for r in out)
    assert sorted(tuple(r) for r in out) == session_reference(events, 20, keyed=False)


def test_session_window_needs_an_operation_that_combines():
    p = Pipeline()
    no_combine = AggregateOperation(create=lambda: 0, accumulate=lambda a, x: a + 1)
    w = (p.read_from(Sources.items([(1, "a")]))
          .with_timestamps(lambda e: e[0], 0)
          .window(WindowDefinition.session(10))
          .group_by(lambda e: e[1]))
    with pytest.raises(PipelineError, match="combine"):
        w.aggregate(no_combine)
