"""The reference model on hand-made inputs: its rules, and what it leaves undetermined."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings, strategies as st

from reference.generate import inputs_for, repair, specs
from reference.model import (
    NO_WATERMARK, aggregate, final_watermarks, is_determinate, record_times, run_model,
    window_starts,
)
from reference.spec import watermark_step


def one_source(lag: int, *stages: dict) -> dict:
    return {"sources": [{"name": "a", "lag": lag}], "stages": list(stages)}


def window(sid: str, w: list, inputs: tuple = ("a",), keyed: bool = True,
           ops: tuple = ("count",), late_sink: bool = True) -> dict:
    return {"id": sid, "kind": "window", "inputs": list(inputs), "window": w, "keyed": keyed,
            "ops": list(ops), "late_sink": late_sink}


def records(*stamps: int, key: str = "k") -> list[tuple]:
    """Records at ``stamps``, in that order, with values 1, 2, ... and seqs 0, 1, ..."""
    return [(t, key, i + 1, i) for i, t in enumerate(stamps)]


def partitions(*parts: list) -> dict:
    return {"partitions": {"a": list(parts)}, "build": []}


def late_stamps(model, stage: str) -> list[int]:
    return [r[0] for r in model.late[stage]]


# --- event time per partition --------------------------------------------------------------------

def test_a_partitions_watermark_is_its_highest_time_so_far_less_the_lag_rounded_to_the_step():
    spec = one_source(10, window("w", ["tumbling", 100]))
    times = record_times(spec, partitions(records(0, 250, 120)))
    assert [times[("a", 0, i)].wm_before for i in range(3)] == [NO_WATERMARK, -100, 200]


def test_the_step_is_the_gcd_of_the_slides_and_gaps_of_the_windows_downstream():
    spec = one_source(0, window("w1", ["sliding", 300, 150]), window("w2", ["session", 100]),
                      window("w3", ["tumbling", 1000]))
    assert watermark_step(spec, "a") == 50


def test_without_a_window_downstream_there_is_no_step():
    spec = one_source(0, {"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": 100,
                          "on_evict": False})
    assert watermark_step(spec, "a") == 0


def test_sliding_windows_holding_an_event_start_every_slide_up_to_the_event():
    assert window_starts(250, 300, 100) == [0, 100, 200]
    assert window_starts(300, 300, 100) == [100, 200, 300]
    assert window_starts(99, 100, 100) == [0]


# --- lateness rules ------------------------------------------------------------------------------

def test_a_tumbling_window_judges_an_event_late_below_the_watermark_rounded_to_its_slide():
    # after 250 the watermark is 240, rounded to 200: 120 is late; 205, though 35 beyond the
    # lag, is in a frame still open
    spec = one_source(10, window("w", ["tumbling", 100]))
    m = run_model(spec, partitions(records(0, 250, 120, 205)))
    assert late_stamps(m, "w") == [120]
    assert m.beyond_lag == [("a", 0, 2), ("a", 0, 3)]
    assert sorted(m.outputs["w"]) == [("KeyedWindowResult", 0, 100, "k", 1),
                                      ("KeyedWindowResult", 200, 300, "k", 2)]


def test_a_session_window_judges_an_event_late_below_the_watermark_itself():
    # the step is gcd(100, 300) = 100: after 450 the watermark is 400; the session window
    # drops 350, the tumbling window of 300 rounds 400 down to 300 and keeps it
    spec = one_source(0, window("s", ["session", 100]), window("t", ["tumbling", 300]))
    m = run_model(spec, partitions(records(0, 450, 350)))
    assert late_stamps(m, "s") == [350]
    assert late_stamps(m, "t") == []


def test_a_ttl_stage_judges_an_event_late_more_than_the_ttl_below_the_watermark():
    spec = one_source(0, {"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": 100,
                          "on_evict": False}, window("w", ["tumbling", 10]))
    m = run_model(spec, partitions(records(0, 500, 401, 399)))
    assert late_stamps(m, "ms") == [399]


def test_an_event_within_its_partitions_lag_is_on_time_however_far_behind_another_partition():
    spec = one_source(50, window("w", ["tumbling", 100]))
    m = run_model(spec, partitions(records(50_000, 50_010, 50_005), records(0, 10, 5)))
    assert m.late["w"] == [] and m.beyond_lag == []
    assert is_determinate(spec, partitions(records(50_000, 50_010, 50_005), records(0, 10, 5)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_no_stage_ever_judges_an_event_within_its_partitions_lag_late(data):
    spec = data.draw(specs())
    m = run_model(spec, data.draw(inputs_for(spec)))  # it also asserts this as it goes
    for positions in m.late_positions.values():
        assert not set(positions) - set(m.beyond_lag)


def test_a_skewed_six_partition_backlog_is_on_time_where_one_merged_watermark_drops_most():
    # six partitions after downtime, each 10 s behind the previous one, read a batch of ten
    # records from each in turn: one watermark from the highest time read so far would have
    # judged every record read after the first batch of partition 0 late
    lag, batch = 100, 10
    parts = [[(50_000 - p * 10_000 + 20 * i, f"k{p}", i, 100 * p + i) for i in range(40)]
             for p in range(6)]
    spec = one_source(lag, window("w", ["tumbling", 1_000]))
    merged_late = _late_under_one_merged_watermark(parts, lag, 1_000, batch)
    assert merged_late >= 0.75 * 240
    m = run_model(spec, {"partitions": {"a": parts}, "build": []})
    assert m.late["w"] == [] and not m.indeterminate
    assert sum(r[-1] for r in m.outputs["w"]) == 240


def _late_under_one_merged_watermark(parts: list, lag: int, slide: int, batch: int) -> int:
    """How many records one watermark over all partitions (highest time read - lag, rounded to
    the slide) judges late, reading ``batch`` records of each partition in turn."""
    top, late = NO_WATERMARK, 0
    for start in range(0, max(map(len, parts)), batch):
        for records_ in parts:
            for r in records_[start:start + batch]:
                wm = top - lag if top != NO_WATERMARK else NO_WATERMARK
                late += wm != NO_WATERMARK and r[0] < wm - wm % slide
                top = max(top, r[0])
    return late


# --- what the input leaves open ------------------------------------------------------------------

def test_beyond_its_lag_an_event_of_one_of_several_partitions_is_late_or_not_by_timing():
    # 120 is late against its own partition's watermark (200), on time while the other
    # partition (at 0) holds the source's watermark back
    spec = one_source(10, window("w", ["tumbling", 100]))
    inputs = partitions(records(0, 250, 120), records(0, 5))
    m = run_model(spec, inputs)
    assert [(d.position, d.what) for d in m.indeterminate] == [(("a", 0, 2), "late")]
    assert not is_determinate(spec, inputs)


def test_a_partition_that_ended_early_does_not_keep_an_event_of_another_on_time():
    # partition 1 ends at 5; were its final watermark (-5) a bound, 100 in partition 0 would be
    # on time; but once the processor reading partition 1 has finished, its input no longer
    # counts downstream, and 100 meets partition 0's own watermark (4900)
    spec = one_source(10, window("w", ["tumbling", 100]))
    inputs = partitions(records(*range(0, 5_000, 10), 100), records(0, 5))
    assert [d.what for d in run_model(spec, inputs).indeterminate] == ["late"]


def test_beyond_its_lag_an_event_on_time_at_its_own_partitions_watermark_is_on_time():
    spec = one_source(10, window("w", ["tumbling", 100]))
    inputs = partitions(records(0, 250, 205), records(0, 5))
    assert is_determinate(spec, inputs)
    assert run_model(spec, inputs).late["w"] == []


def test_one_partition_read_directly_fixes_which_events_are_late():
    spec = one_source(10, window("w", ["tumbling", 100]))
    assert is_determinate(spec, partitions(records(0, 250, 120)))


def test_after_a_keyed_stage_even_one_partition_leaves_lateness_open():
    # the window's watermark is the lowest of the map_stateful processors', any of which may
    # lag behind the one that forwards the event
    spec = one_source(10, {"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": None,
                           "on_evict": False}, window("w", ["tumbling", 100], inputs=("ms",)))
    inputs = partitions(records(1, 250, 121))  # 121 % 4 != 0: map_stateful emits it
    assert [d.what for d in run_model(spec, inputs).indeterminate] == ["late"]


def test_a_ttl_in_one_partition_with_watermarks_in_steps_evicts_a_quiet_keys_state():
    # lag 20, step 50: after 1290 the watermark is 1250 >= 1000 + 100, so k0's state is gone
    # when its second record comes
    spec = one_source(20, {"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": 100,
                           "on_evict": True}, window("w", ["tumbling", 50]))
    parts = [[(1000, "k0", 3, 0), (1100, "k1", 5, 1), (1290, "k1", 7, 2), (1300, "k0", 9, 3)]]
    m = run_model(spec, {"partitions": {"a": parts}, "build": []})
    assert m.evicted_before == {"ms": [("a", 0, 3)]}
    assert sorted(m.outputs["ms"], key=repr) == sorted([
        (1000, "k0", 3, 0), (1100, "k1", 5, 1), (1290, "k1", 12, 2), (1300, "k0", 9, 3),
        ("evicted", "k0", 1, 3), ("evicted", "k0", 1, 9), ("evicted", "k1", 2, 12)], key=repr)


def test_an_event_exactly_the_ttl_behind_the_watermark_is_on_time_and_its_state_is_kept():
    spec = one_source(0, {"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": 100,
                          "on_evict": False}, window("w", ["tumbling", 10]))
    m = run_model(spec, partitions([(1000, "k0", 1, 0), (1100, "k1", 1, 1), (1000, "k0", 1, 2),
                                    (1100, "k0", 1, 3)]))
    assert m.late["ms"] == []
    assert m.evicted_before == {}  # k0's state (last at 1000) outlives watermark 1100 = 1000 + ttl


def test_a_ttl_without_a_window_leaves_expiry_during_the_stream_open():
    # without a window the source sends a watermark per chunk, whose bounds no test controls
    spec = one_source(20, {"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": 100,
                           "on_evict": True})
    parts = [[(1000, "k0", 3, 0), (1100, "k1", 5, 1), (1290, "k1", 7, 2), (1300, "k0", 9, 3)]]
    m = run_model(spec, {"partitions": {"a": parts}, "build": []})
    assert [(d.position, d.what) for d in m.indeterminate] == [(("a", 0, 3), "evicted")]


def test_a_running_aggregate_needs_each_keys_items_in_one_partition():
    spec = one_source(0, {"id": "r", "kind": "rolling", "inputs": ["a"], "op": "sum",
                          "keyed": True})
    inputs = partitions(records(0, 1, key="x"), records(0, 1, key="x"))
    assert [d.what for d in run_model(spec, inputs).indeterminate] == ["order"]


def test_a_running_count_is_the_same_in_any_order():
    spec = one_source(0, {"id": "r", "kind": "rolling", "inputs": ["a"], "op": "count",
                          "keyed": True})
    m = run_model(spec, partitions(records(0, 1, key="x"), records(0, 1, key="x")))
    assert not m.indeterminate
    assert sorted(m.outputs["r"]) == [("x", 1), ("x", 2), ("x", 3), ("x", 4)]


def test_repair_moves_an_undetermined_event_to_the_edge_of_its_partitions_lag():
    spec = one_source(10, window("w", ["tumbling", 100]))
    fixed = repair(spec, partitions(records(0, 250, 120), records(0, 5)))
    assert fixed["partitions"]["a"][0][2][0] == 240
    assert is_determinate(spec, fixed)


# --- what stages emit ----------------------------------------------------------------------------

def test_a_finite_stream_emits_every_window_and_session_still_open():
    spec = one_source(1_000, window("t", ["tumbling", 100]), window("s", ["session", 30]))
    m = run_model(spec, partitions(records(0, 10, 50, 220)))
    assert sorted(m.outputs["t"]) == [("KeyedWindowResult", 0, 100, "k", 3),
                                      ("KeyedWindowResult", 200, 300, "k", 1)]
    assert sorted(m.outputs["s"]) == [("KeyedWindowResult", 0, 40, "k", 2),
                                      ("KeyedWindowResult", 50, 80, "k", 1),
                                      ("KeyedWindowResult", 220, 250, "k", 1)]


def test_co_aggregated_windows_give_an_empty_sides_result_for_no_items():
    spec = {"sources": [{"name": "a", "lag": 0}, {"name": "b", "lag": 0}],
            "stages": [window("w", ["tumbling", 100], inputs=("a", "b"), keyed=False,
                              ops=("count", "max"))]}
    inputs = {"partitions": {"a": [records(10, 20)], "b": [records(150)]}, "build": []}
    assert sorted(run_model(spec, inputs).outputs["w"]) == [
        ("WindowResult", 0, 100, (2, None)), ("WindowResult", 100, 200, (0, (150, "k", 1, 0)))]


def test_an_outer_hash_join_pairs_an_unmatched_item_with_none():
    spec = one_source(0, {"id": "j", "kind": "hash_join", "inputs": ["a"], "outer": True})
    inputs = {"partitions": {"a": [[(0, "x", 1, 0), (1, "y", 2, 1)]]},
              "build": [("x", "x1"), ("x", "x2")]}
    assert sorted(run_model(spec, inputs).outputs["j"], key=repr) == [
        ((0, "x", 1, 0), "x1"), ((0, "x", 1, 0), "x2"), ((1, "y", 2, 1), None)]


def two_sources(stage: dict, a: list, b: list, lag: int = 0) -> tuple[dict, dict]:
    spec = {"sources": [{"name": "a", "lag": lag}, {"name": "b", "lag": lag}],
            "stages": [stage]}
    return spec, {"partitions": {"a": [a], "b": [b]}, "build": []}


def test_an_interval_join_pairs_every_right_record_within_both_inclusive_bounds():
    left = [(100, "k", 1, 0)]
    right = [(89, "k", 1, 10), (90, "k", 2, 11), (120, "k", 3, 12), (121, "k", 4, 13),
             (100, "x", 5, 14)]
    spec, inputs = two_sources({"id": "j", "kind": "interval_join", "inputs": ["a", "b"],
                                "lower": -10, "upper": 20}, left, right, lag=100)
    assert sorted(run_model(spec, inputs).outputs["j"]) == [
        ((100, "k", 1, 0), (90, "k", 2, 11)), ((100, "k", 1, 0), (120, "k", 3, 12))]


def test_an_asof_join_takes_the_latest_right_record_at_or_before_the_last_in_its_order():
    left = [(100, "k", 1, 0), (50, "x", 2, 1)]
    right = [(90, "k", 1, 10), (100, "k", 2, 11), (100, "k", 3, 12), (101, "k", 4, 13)]
    stage = {"id": "j", "kind": "asof_join", "inputs": ["a", "b"], "tolerance": None,
             "how": "left"}
    spec, inputs = two_sources(stage, left, right, lag=100)
    assert sorted(run_model(spec, inputs).outputs["j"]) == [
        ((50, "x", 2, 1), None), ((100, "k", 1, 0), (100, "k", 3, 12))]
    stage.update(how="inner", tolerance=0)
    assert run_model(spec, inputs).outputs["j"] == [((100, "k", 1, 0), (100, "k", 3, 12))]


def test_a_streaming_asof_join_has_emitted_the_left_records_below_its_final_watermark():
    # final watermarks: a 300, b 250 (lag 0): the join's is 250; the left at 250 still waits
    left = [(100, "k", 1, 0), (250, "k", 2, 1), (300, "k", 3, 2)]
    right = [(90, "k", 1, 10), (250, "k", 2, 11)]
    spec, inputs = two_sources({"id": "j", "kind": "asof_join", "inputs": ["a", "b"],
                                "tolerance": None, "how": "left"}, left, right)
    m = run_model(spec, inputs, bounded=False)
    assert m.final_watermark["j"] == 250
    assert m.outputs["j"] == [((100, "k", 1, 0), (90, "k", 1, 10))]


def test_a_join_never_judges_a_record_determinately_late_but_may_leave_it_open():
    # b's second record is 50 behind its partition (lag 0): its fate depends on a's progress
    spec, inputs = two_sources({"id": "j", "kind": "interval_join", "inputs": ["a", "b"],
                                "lower": 0, "upper": 0}, [(100, "k", 1, 0)],
                               [(100, "k", 1, 10), (50, "k", 2, 11)])
    m = run_model(spec, inputs)
    assert [d.what for d in m.indeterminate] == ["late"]
    assert repair(spec, inputs)["partitions"]["b"][0][1][0] == 100  # moved to the lag's edge


def test_a_keyed_distinct_keeps_each_keys_first_record():
    spec = one_source(0, {"id": "d", "kind": "distinct", "inputs": ["a"], "keyed": True})
    m = run_model(spec, partitions([(5, "x", 1, 0), (1, "y", 2, 1), (0, "x", 3, 2)]))
    assert sorted(m.outputs["d"]) == [(1, "y", 2, 1), (5, "x", 1, 0)]


def test_operations_aggregate_from_scratch():
    items = [(0, "k", 4, 1), (0, "k", 2, 0)]
    assert [aggregate(op, items) for op in ("count", "sum", "count_sum", "avg")] == \
        [2, 6, (2, 6), 3.0]
    assert aggregate("max", items) == (0, "k", 4, 1)
    assert aggregate("sorted", items) == [(0, "k", 2, 0), (0, "k", 4, 1)]
    assert aggregate("avg", []) is None and aggregate("max", []) is None


# --- the generator -------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_inputs_drawn_within_the_lag_keep_every_event_within_its_partitions_lag(data):
    spec = data.draw(specs())
    inputs = data.draw(inputs_for(spec, beyond_lag=False))
    assert run_model(spec, inputs).beyond_lag == []


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_partition_has_records_and_each_key_lives_in_one_partition(data):
    spec = data.draw(specs())
    inputs = data.draw(inputs_for(spec))
    for parts in inputs["partitions"].values():
        assert all(parts)
        homes: dict = {}
        for p, records_ in enumerate(parts):
            for r in records_:
                assert homes.setdefault(r[1], p) == p


def test_a_window_join_emits_a_result_per_pair_of_a_window_and_key():
    spec = {"sources": [{"name": "a", "lag": 0}, {"name": "b", "lag": 0}],
            "stages": [{"id": "j", "kind": "window", "inputs": ["a", "b"], "join": True,
                        "window": ["tumbling", 100], "keyed": True, "ops": [],
                        "late_sink": False}]}
    a, b = [(10, "x", 1, 0), (20, "x", 2, 1)], [(30, "x", 3, 9), (150, "x", 4, 10)]
    inputs = {"partitions": {"a": [a], "b": [b]}, "build": []}
    assert sorted(run_model(spec, inputs).outputs["j"]) == [
        ("KeyedWindowResult", 0, 100, "x", (a[0], b[0])),
        ("KeyedWindowResult", 0, 100, "x", (a[1], b[0]))]


# --- streaming: what a job over an unbounded input has emitted once it has read everything -------

def test_a_streaming_run_closes_only_the_windows_ending_at_or_below_the_final_watermark():
    # lag 10, step gcd(100, 30) = 10: the final watermark is 220 - 10 = 210; the tumbling
    # window [200, 300) and the session [220, 250) are still open
    spec = one_source(10, window("t", ["tumbling", 100]), window("s", ["session", 30]))
    m = run_model(spec, partitions(records(0, 10, 50, 220)), bounded=False)
    assert m.final_watermark == {"a": 210, "t": 210, "s": 210}
    assert sorted(m.outputs["t"]) == [("KeyedWindowResult", 0, 100, "k", 3)]
    assert sorted(m.outputs["s"]) == [("KeyedWindowResult", 0, 40, "k", 2),
                                      ("KeyedWindowResult", 50, 80, "k", 1)]


def test_a_window_or_session_ending_exactly_at_the_final_watermark_is_closed():
    spec = one_source(0, window("t", ["tumbling", 100]), window("s", ["session", 50]))
    m = run_model(spec, partitions(records(50, 100, 150, 200)), bounded=False)
    assert m.final_watermark["a"] == 200
    assert sorted(m.outputs["t"]) == [("KeyedWindowResult", 0, 100, "k", 1),
                                      ("KeyedWindowResult", 100, 200, "k", 2)]
    # events a gap apart are sessions of their own: [150, 200) ends at the watermark
    assert sorted(m.outputs["s"]) == [("KeyedWindowResult", s, s + 50, "k", 1)
                                      for s in (50, 100, 150)]


def test_the_final_watermark_is_the_slowest_partitions_rounded_to_the_step():
    spec = one_source(20, window("w", ["sliding", 200, 100]))
    inputs = partitions(records(0, 5_000), records(0, 1_275))
    m = run_model(spec, inputs, bounded=False)
    assert final_watermarks(spec, inputs) == {"a": 1_200}
    # 1275's windows end at 1300 and 1400, 5000's later: open
    assert sorted(m.outputs["w"]) == [
        ("KeyedWindowResult", s, s + 200, "k", 2) for s in (-100, 0)]


def test_a_stage_of_two_sources_has_the_lower_final_watermark():
    spec = {"sources": [{"name": "a", "lag": 0}, {"name": "b", "lag": 0}],
            "stages": [window("w", ["tumbling", 100], inputs=("a", "b"), keyed=False,
                              ops=("count", "count"))]}
    inputs = {"partitions": {"a": [records(10, 990)], "b": [records(150, 320)]}, "build": []}
    m = run_model(spec, inputs, bounded=False)
    assert m.final_watermark == {"a": 900, "b": 300, "w": 300}
    assert sorted(m.outputs["w"]) == [("WindowResult", 0, 100, (1, 0)),
                                      ("WindowResult", 100, 200, (0, 1))]


def test_a_streaming_ttl_evicts_only_the_states_the_final_watermark_passed():
    # final watermark 1300 (lag 0, step 50): k0 (last 1000) is evicted, k1 (last 1290) kept
    spec = one_source(0, {"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": 100,
                          "on_evict": True}, window("w", ["tumbling", 50]))
    parts = [[(1000, "k0", 3, 0), (1290, "k1", 5, 1), (1300, "k2", 7, 2)]]
    inputs = {"partitions": {"a": parts}, "build": []}
    streamed = run_model(spec, inputs, bounded=False)
    assert [x for x in streamed.outputs["ms"] if x[0] == "evicted"] == [("evicted", "k0", 1, 3)]
    batch = run_model(spec, inputs)
    assert sorted(x for x in batch.outputs["ms"] if x[0] == "evicted") == [
        ("evicted", "k0", 1, 3), ("evicted", "k1", 1, 5), ("evicted", "k2", 1, 7)]


def test_a_state_exactly_the_ttl_behind_the_final_watermark_is_kept():
    spec = one_source(0, {"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": 100,
                          "on_evict": True}, window("w", ["tumbling", 10]))
    m = run_model(spec, partitions([(1000, "k0", 1, 0), (1100, "k1", 1, 1)]), bounded=False)
    assert not [x for x in m.outputs["ms"] if x[0] == "evicted"]


def test_a_batch_aggregation_emits_nothing_in_a_stream():
    spec = one_source(0, {"id": "g", "kind": "aggregate", "inputs": ["a"], "op": "count",
                          "keyed": False})
    assert run_model(spec, partitions(records(1, 2)), bounded=False).outputs["g"] == []
    assert run_model(spec, partitions(records(1, 2))).outputs["g"] == [2]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_streaming_run_is_a_bounded_one_without_what_the_end_of_the_stream_flushes(data):
    """Streaming and bounded runs judge the same events late and leave the same things open;
    streaming emits a part of each window stage's results, of the evictions and of an as-of
    join's results, and the rest as is."""
    spec = data.draw(specs())
    inputs = data.draw(inputs_for(spec))
    batch, streamed = run_model(spec, inputs), run_model(spec, inputs, bounded=False)
    assert streamed.late == batch.late
    assert streamed.indeterminate == batch.indeterminate
    for s in spec["stages"]:
        got, full = Counter(streamed.outputs[s["id"]]), Counter(batch.outputs[s["id"]])
        if s["kind"] == "aggregate":
            assert not got
        elif s["kind"] == "window" or (s["kind"] == "map_stateful" and s["on_evict"]):
            assert not got - full
            wm = streamed.final_watermark[s["id"]]
            if s["kind"] == "window":
                assert all(r[2] <= wm for r in got) and all(r[2] > wm for r in full - got)
            else:
                assert all(r[0] == "evicted" for r in full - got)
        elif s["kind"] == "asof_join":  # the left records the final watermark passed
            assert not got - full
            wm = streamed.final_watermark[s["id"]]
            assert all(r[0][0] < wm for r in got) and all(r[0][0] >= wm for r in full - got)
        else:
            assert got == full


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_streaming_specs_have_no_batch_aggregation(data):
    spec = data.draw(specs(streaming=True))
    assert all(s["kind"] != "aggregate" for s in spec["stages"])
