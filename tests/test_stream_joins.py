"""Joins of two streams in event time: ``Stage.join_interval`` and ``Stage.join_asof``
(docs/enrichment.md, "Joining two streams in event time").

Jobs on an embedded member show what a pipeline emits; the join processors driven directly
(their two inputs and watermarks in a chosen order) show what depends on arrival order and
watermarks: each pair once in any order, late events, the state dropped as the watermark
passes, a snapshot restored mid-stream."""

from __future__ import annotations

import random

import pytest

from jetwake import (
    AggregateOperations as ops, Member, Pipeline, PipelineError, Sinks, Sources,
    WindowDefinition,
)
from jetwake.engine.core.processor import Inbox, Outbox, ProcessorContext
from jetwake.engine.core.stream_items import Watermark
from jetwake.engine.processors.asof_join import AsofJoinProcessor
from jetwake.engine.processors.interval_join import IntervalJoinProcessor
from jetwake.testing import verify_processor, wm


def key(e):
    return e[1]


def ts(e):
    return e[0]


def run_job(build) -> tuple[dict, dict]:
    """Runs the pipeline ``build(p)`` makes on a member; what each list received, and the
    job's metrics."""
    p = Pipeline()
    names = build(p)
    with Member() as m:
        job = m.new_job(p)
        job.join(timeout=60)
        return {n: list(m.get_list(n)) for n in names}, job.metrics()


def two_streams(p, lefts, rights, lag=0):
    left = p.read_from(Sources.items(lefts)).set_name("lefts").with_timestamps(ts, lag)
    right = p.read_from(Sources.items(rights)).set_name("rights").with_timestamps(ts, lag)
    return left, right


def interval_pairs(lefts, rights, lower, upper):
    """Every pair the interval join must emit, by brute force."""
    return sorted((a, b) for a in lefts for b in rights
                  if key(a) == key(b) and ts(a) + lower <= ts(b) <= ts(a) + upper)


# --- driving a join processor directly -------------------------------------------------------

class Driver:
    """One join processor, fed left (ordinal 0) and right (ordinal 1) items and watermarks
    in a chosen order; collects what it emits."""

    def __init__(self, processor, side_output=False):
        self.p = processor
        self.outbox = Outbox(2 if side_output else 1)
        self.p.outbox = self.outbox
        self.context = ProcessorContext("job", "job", "join", 0, 0, 1, 1, 0, 1)
        self.p.init(self.context)
        self.out: list = []
        self.side: list = []

    def send(self, ordinal, items):
        inbox = Inbox(list(items))
        while inbox:
            self.p.process(ordinal, inbox)
            self._drain()

    def watermark(self, t):
        while not self.p.try_process_watermark(Watermark(t)):
            self._drain()
        self._drain()

    def complete(self):
        while not self.p.complete():
            self._drain()
        self._drain()

    def _drain(self):
        data = 1 if self.outbox.ordinal_count == 2 else 0
        self.out += [x for x in self.outbox.drain(data) if not isinstance(x, Watermark)]
        if data:
            self.side += [x for x in self.outbox.drain(0) if not isinstance(x, Watermark)]

    @property
    def metrics(self):
        return self.context.metrics


def interval(lower, upper, fn=None, side_output=False):
    return Driver(IntervalJoinProcessor("j", key, key, lower, upper, fn, side_output),
                  side_output)


def asof(tolerance=None, how="left", fn=None, side_output=False):
    return Driver(AsofJoinProcessor("j", key, key, tolerance, fn, how, side_output),
                  side_output)


def stamped(events):
    return [(ts(e), e) for e in events]


# --- join_interval ----------------------------------------------------------------------------

def test_interval_bounds_are_inclusive_at_both_ends():
    lefts = [(1000, "k", "L")]
    rights = [(989, "k", "r-11"), (990, "k", "r-10"), (1020, "k", "r+20"),
              (1021, "k", "r+21"), (1000, "x", "other key")]

    def build(p):
        left, right = two_streams(p, lefts, rights)
        left.join_interval(right, key, key, -10, 20).write_to(Sinks.list("pairs"))
        return ["pairs"]
    out, metrics = run_job(build)
    assert sorted(out["pairs"]) == [((1000, "k", "L"), (990, "k", "r-10")),
                                    ((1000, "k", "L"), (1020, "k", "r+20"))]
    assert metrics["interval-join"]["join_pairs"] == 2


def test_interval_pairs_carry_the_later_time_so_a_window_can_follow():
    # left 990, right 1005: the pair's time is 1005, in window [1000, 1100), not [900, 1000)
    lefts = [(990, "k", "L"), (1200, "k", "L2")]
    rights = [(1005, "k", "R"), (1210, "k", "R2")]

    def build(p):
        left, right = two_streams(p, lefts, rights)
        joined = left.join_interval(right, key, key, 0, 50, fn=lambda a, b: (a[2], b[2]))
        joined.window(WindowDefinition.tumbling(100)).aggregate(ops.to_list()) \
            .write_to(Sinks.list("windows"))
        return ["windows"]
    out, _ = run_job(build)
    assert sorted((w.start, w.result) for w in out["windows"]) == [
        (1000, [("L", "R")]), (1200, [("L2", "R2")])]


def test_interval_fn_result_is_emitted_and_none_drops_the_pair():
    lefts = [(100, "k", 1), (100, "k", 2)]
    rights = [(110, "k", 10)]

    def build(p):
        left, right = two_streams(p, lefts, rights)
        left.join_interval(right, key, key, 0, 10,
                           fn=lambda a, b: None if a[2] == 2 else a[2] + b[2]) \
            .write_to(Sinks.list("sums"))
        return ["sums"]
    out, _ = run_job(build)
    assert out["sums"] == [11]


def test_each_pair_is_emitted_once_whichever_side_arrives_first():
    rng = random.Random(7)
    lefts = [(rng.randint(0, 500), f"k{rng.randint(0, 3)}", ("L", i)) for i in range(60)]
    rights = [(rng.randint(0, 500), f"k{rng.randint(0, 3)}", ("R", i)) for i in range(60)]
    want = interval_pairs(lefts, rights, -20, 30)
    assert len(want) > 50
    for seed in range(6):
        order = [(0, e) for e in lefts] + [(1, e) for e in rights]
        random.Random(seed).shuffle(order)
        d = interval(-20, 30)
        for side, e in order:  # no watermark: any order is on time
            d.send(side, stamped([e]))
        assert sorted(p for _, p in d.out) == want
        assert all(t == max(ts(a), ts(b)) for t, (a, b) in d.out)


def test_interval_state_is_dropped_as_the_watermark_passes_and_stays_bounded():
    # 20 000 events a side, 1 ms apart per side, 4 keys; bounds [-10, 30], lag 0: whatever the
    # stream's length, the state holds about 30 ms of left events and 10 ms of right ones
    d = interval(-10, 30)
    sizes = []
    n = 20_000
    pairs = 0
    for start in range(0, n, 500):
        lefts = [(t, f"k{t % 4}", t) for t in range(start, start + 500)]
        d.send(0, stamped(lefts))
        d.send(1, stamped(lefts))
        d.watermark(start + 499)
        sizes.append(d.metrics["join_state_entries"])
        pairs = len(d.out)
    assert max(sizes) < 100, sizes
    assert max(sizes[len(sizes) // 2:]) <= max(sizes[:len(sizes) // 2])  # it does not grow
    assert d.metrics["join_evicted_entries"] > 2 * n - 100
    # each left t meets the rights of its key in [t - 10, t + 30]: t + 4j for j in -2..7
    assert pairs == d.metrics["join_pairs"] == sum(
        1 for t in range(n) for j in range(-2, 8) if 0 <= t + 4 * j < n)


def test_a_member_job_ends_with_a_small_state_after_a_long_stream():
    n = 5_000
    events = [(t, f"k{t % 5}", t) for t in range(n)]

    def build(p):
        left, right = two_streams(p, events, events, lag=5)
        left.join_interval(right, key, key, 0, 0).write_to(Sinks.list("pairs"))
        return ["pairs"]
    out, metrics = run_job(build)
    assert len(out["pairs"]) == n  # each event meets itself
    m = metrics["interval-join"]
    assert m["join_state_entries"] < 200 and m["join_evicted_entries"] > 2 * n - 200


def test_an_event_below_the_watermark_is_late_counted_and_routed_to_the_side_output():
    d = interval(0, 100, side_output=True)
    d.send(0, stamped([(500, "k", "L")]))
    d.watermark(600)  # the left at 500 stays: a right up to 600 may still come
    d.send(1, stamped([(599, "k", "late"), (600, "k", "R")]))
    assert [p for _, p in d.out] == [((500, "k", "L"), (600, "k", "R"))]
    assert d.side == [(599, "k", "late")]
    assert d.metrics["late_events"] == 1
    d.watermark(601)  # no right can reach 500 + 100 now, nor a left (>= 601) the right at 600
    assert d.metrics["join_state_entries"] == 0


def test_a_snapshot_restored_after_every_chunk_gives_the_same_pairs():
    lefts = [(t, f"k{t % 3}", ("L", t)) for t in range(0, 300, 7)]
    rights = [(t, f"k{t % 3}", ("R", t)) for t in range(0, 300, 5)]
    want = [(max(ts(a), ts(b)), (a, b)) for a, b in interval_pairs(lefts, rights, -15, 40)]
    verify_restores_give(lambda: IntervalJoinProcessor("j", key, key, -15, 40, None),
                         with_watermarks(lefts, every=5, behind=60), rights, want)


def with_watermarks(lefts, *, every, behind):
    """The left items stamped, with a watermark after every ``every``-th one, ``behind`` ms
    below it: below everything after it on both inputs of these tests."""
    left_in: list = []
    for i, e in enumerate(stamped(lefts)):
        left_in.append(e)
        if i % every == every - 1:
            left_in.append(wm(max(0, e[0] - behind)))
    return left_in


def verify_restores_give(supplier, left_in, rights, want):
    """The processor's output, with a snapshot saved and restored after every chunk (and the
    other orders TestSupport tries), equals ``want`` in any order, watermarks aside."""
    verify_processor(supplier) \
        .inputs([left_in, stamped(rights)]) \
        .output_checker(lambda e, a: sorted(e, key=repr) == sorted(
            (x for x in a if not isinstance(x, Watermark)), key=repr)) \
        .expect_output(want)


# --- join_asof --------------------------------------------------------------------------------

def test_asof_picks_the_latest_right_item_at_or_before_the_left_time():
    lefts = [(100, "k", "at-100"), (150, "k", "at-150"), (99, "x", "x-99")]
    rights = [(50, "k", "r50"), (100, "k", "r100"), (101, "k", "r101"), (200, "k", "r200"),
              (10, "x", "x10")]

    def build(p):
        left, right = two_streams(p, lefts, rights, lag=100)
        left.join_asof(right, key, key, fn=lambda a, b: (a[2], b and b[2])) \
            .write_to(Sinks.list("out"))
        return ["out"]
    out, _ = run_job(build)
    assert sorted(out["out"]) == [("at-100", "r100"), ("at-150", "r101"), ("x-99", "x10")]


def test_asof_tolerance_limits_how_old_the_right_item_may_be():
    lefts = [(100, "k", "L100"), (130, "k", "L130")]
    rights = [(80, "k", "R80")]

    def build(p):
        left, right = two_streams(p, lefts, rights)
        left.join_asof(right, key, key, tolerance_ms=20).write_to(Sinks.list("out"))
        return ["out"]
    out, _ = run_job(build)
    # 80 is exactly 20 before 100: within; 50 before 130: not
    assert sorted(out["out"], key=repr) == [((100, "k", "L100"), (80, "k", "R80")),
                                            ((130, "k", "L130"), None)]


@pytest.mark.parametrize("how, want", [("left", [((100, "k", "L"), None)]), ("inner", [])])
def test_asof_without_a_right_item_gives_none_or_nothing(how, want):
    def build(p):
        left, right = two_streams(p, [(100, "k", "L")], [(101, "k", "after"), (5, "x", "x")])
        left.join_asof(right, key, key, how=how).write_to(Sinks.list("out"))
        return ["out"]
    out, _ = run_job(build)
    assert out["out"] == want


def test_asof_waits_for_the_watermark_to_pass_the_left_time():
    d = asof()
    d.send(0, stamped([(100, "k", "L")]))
    d.send(1, stamped([(90, "k", "R90")]))
    d.watermark(100)
    assert d.out == []  # a right at 100 may still come
    d.send(1, stamped([(100, "k", "R100")]))
    d.watermark(101)
    assert d.out == [(100, ((100, "k", "L"), (100, "k", "R100")))]


def test_asof_keeps_per_key_only_the_right_items_a_later_left_can_need():
    d = asof()
    for t in range(0, 10_000, 10):
        d.send(1, stamped([(t, "k", t)]))
        d.watermark(t)
        assert d.metrics["join_state_entries"] <= 2
    d.send(0, stamped([(9_995, "k", "L")]))
    d.complete()
    assert d.out == [(9_995, ((9_995, "k", "L"), (9_990, "k", 9_990)))]
    assert d.metrics["join_evicted_entries"] == 999  # all but the latest


def test_asof_with_a_tolerance_drops_a_right_item_the_tolerance_has_passed():
    d = asof(tolerance=50)
    d.send(1, stamped([(100, "k", "R")]))
    d.watermark(150)
    assert d.metrics["join_state_entries"] == 1
    d.watermark(151)
    assert d.metrics["join_state_entries"] == 0


def test_asof_snapshot_restored_after_every_chunk_gives_the_same_results():
    lefts = [(t, f"k{t % 3}", ("L", t)) for t in range(3, 300, 7)]
    rights = [(t, f"k{t % 3}", ("R", t)) for t in range(0, 300, 11)]

    def latest(a):
        before = [b for b in rights if key(b) == key(a) and ts(b) <= ts(a)]
        return max(before, key=ts) if before else None
    want = [(ts(a), (a, latest(a))) for a in lefts]
    verify_restores_give(lambda: AsofJoinProcessor("j", key, key, None, None, "left"),
                         with_watermarks(lefts, every=4, behind=40), rights, want)


# --- bad input, refused when the pipeline is built -----------------------------------------

def streams():
    p = Pipeline()
    left = p.read_from(Sources.items([(1, "k")])).with_timestamps(ts, 0)
    right = p.read_from(Sources.items([(1, "k")])).with_timestamps(ts, 0)
    return p, left, right


def test_a_stream_without_timestamps_is_refused_naming_the_stage_and_the_fix():
    p, left, _ = streams()
    plain = p.read_from(Sources.items([1])).set_name("plain")
    with pytest.raises(PipelineError, match=r"join_interval\(\).*right stage 'plain' has no "
                                            r"timestamps.*with_timestamps"):
        left.join_interval(plain, key, key, 0, 10)
    with pytest.raises(PipelineError, match=r"join_asof\(\).*left stage 'plain'.*"
                                            r"with_timestamps"):
        plain.join_asof(left, key, key)


def test_bounds_the_wrong_way_round_are_refused():
    _, left, right = streams()
    with pytest.raises(PipelineError, match=r"lower_ms \(20\) is above upper_ms \(10\).*swap"):
        left.join_interval(right, key, key, 20, 10)


@pytest.mark.parametrize("lower, upper", [(0.5, 10), (0, "10"), (True, 10)])
def test_bounds_that_are_not_ints_are_refused(lower, upper):
    _, left, right = streams()
    with pytest.raises(TypeError, match=r"join_interval\(\) after stage .*must be an int"):
        left.join_interval(right, key, key, lower, upper)


def test_functions_that_are_not_callable_are_refused():
    _, left, right = streams()
    with pytest.raises(TypeError, match=r"join_interval\(\).*key_fn expects a callable"):
        left.join_interval(right, "k", key, 0, 1)
    with pytest.raises(TypeError, match=r"join_asof\(\).*other_key_fn expects a callable"):
        left.join_asof(right, key, 3)
    with pytest.raises(TypeError, match=r"join_asof\(\).*fn expects a callable"):
        left.join_asof(right, key, key, fn="pair")


def test_a_negative_tolerance_and_an_unknown_how_are_refused():
    _, left, right = streams()
    with pytest.raises(PipelineError, match=r"join_asof\(\).*tolerance_ms must be 0 or more"):
        left.join_asof(right, key, key, tolerance_ms=-1)
    with pytest.raises(PipelineError, match=r"how must be 'left'.*or 'inner'"):
        left.join_asof(right, key, key, how="outer")


def test_both_inputs_are_partitioned_by_key_and_late_events_go_to_output_ordinal_0():
    p, left, right = streams()
    left.set_name("left").join_asof(right.set_name("right"), key, key,
                                    late_events_to=Sinks.list("late")) \
        .set_name("j").write_to(Sinks.list("out"))
    edges = {(e.source.name, e.destination.name): e for e in p.to_dag().edges}
    assert edges[("left", "j")].dest_ordinal == 0 and edges[("right", "j")].dest_ordinal == 1
    assert all(edges[(s, "j")].is_distributed and edges[(s, "j")].routing.name == "PARTITIONED"
               for s in ("left", "right"))
    assert edges[("j", "list-sink-late")].source_ordinal == 0
    assert edges[("j", "list-sink-out")].source_ordinal == 1
