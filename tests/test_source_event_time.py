"""Event time per partition inside a partitioned source: each partition's own watermark, the
source's lowest over its active partitions, a backlog read one partition after another without
late events, idle and new partitions, and the partitions' watermarks kept across a restore."""

from __future__ import annotations

from collections import Counter

import pytest

from jetwake import (
    AggregateOperations as ops, JobConfig, Member, Pipeline, Sinks, WindowDefinition,
)
from jetwake.connectors.generated_sources import TestSources
from jetwake.engine.core.processor import Outbox
from jetwake.engine.core.stream_items import IDLE_MESSAGE, Watermark
from jetwake.engine.operations.watermark_policy import WatermarkPolicy
from jetwake.engine.processors.source_event_time import EventTimeSpec, SourceEventTime
from jetwake.engine.processors.timestamps import TimestampError


def event_time(lag: int = 10, step: int = 1, idle: int = 0, fn=lambda x: x,
               side: bool = False, reports_end: bool = False) -> SourceEventTime:
    spec = EventTimeSpec("timestamps", fn, WatermarkPolicy.limiting_lag(lag), step, idle, side)
    return SourceEventTime(spec, {}, reports_end)


def out(et: SourceEventTime, ordinals: int = 1) -> list:
    box = Outbox(ordinals, 100_000)
    assert et.flush(box)
    return box.drain(ordinals - 1)


# --- one processor's partitions ---------------------------------------------------------------

def test_a_partition_not_read_yet_holds_the_watermark_back():
    et = event_time(lag=10)
    et.add_partition(0)
    et.add_partition(1)
    et.add_items(0, [500, 510])
    assert out(et) == [(500, 500), (510, 510)]  # nothing known of partition 1: no watermark


def test_the_watermark_is_the_lowest_of_the_partitions():
    et = event_time(lag=10)
    et.add_partition(0)
    et.add_partition(1)
    et.add_items(0, [5_000])
    et.add_items(1, [300])
    assert out(et) == [(5_000, 5_000), (300, 300), Watermark(290)]
    et.add_items(0, [6_000])  # the partition ahead moves on: the one behind still decides
    assert out(et) == [(6_000, 6_000)]


def test_a_partition_behind_is_never_judged_by_one_ahead():
    # partition 0 read to its end first (a backlog), then partition 1, seconds behind
    et = event_time(lag=100)
    et.add_partition(0)
    et.add_partition(1)
    et.add_items(0, list(range(10_000, 20_000, 10)))
    et.add_items(1, list(range(0, 1_000, 10)))
    wms = [e.timestamp for e in out(et) if isinstance(e, Watermark)]
    assert wms and max(wms) == 990 - 100


def test_the_watermark_follows_the_item_that_advanced_it_within_a_partition():
    et = event_time(lag=10, step=10)
    et.add_partition(0)
    et.add_items(0, [100, 105, 103, 125, 131])
    assert out(et) == [(100, 100), Watermark(90), (105, 105), (103, 103), (125, 125),
                       Watermark(110), (131, 131), Watermark(120)]


def test_the_lowest_other_partition_caps_the_watermark_within_a_run():
    et = event_time(lag=0)
    et.add_partition(0)
    et.add_partition(1)
    et.add_items(1, [50])
    et.add_items(0, [10, 20, 60, 70])
    assert out(et) == [(50, 50), (10, 10), Watermark(10), (20, 20), Watermark(20),
                       (60, 60), Watermark(50), (70, 70)]


def test_an_idle_partition_stops_holding_the_watermark_back_and_holds_it_again():
    et = event_time(lag=0, idle=1_000)
    et.add_partition(0)
    et.add_partition(1)
    et.add_items(0, [100], now=10.0)
    et.add_items(1, [50], now=10.0)
    et.add_items(0, [900], now=10.5)
    et.poll(now=10.6)
    assert [e for e in out(et) if isinstance(e, Watermark)] == [Watermark(50)]
    et.poll(now=11.2)  # partition 1 idle for over a second: partition 0 alone decides
    assert out(et) == [Watermark(900)]
    et.add_items(1, [950], now=11.3)  # partition 1 delivers again and holds it again
    et.add_items(0, [2_000], now=11.3)
    assert out(et) == [(950, 950), (2_000, 2_000), Watermark(950)]


def test_a_slow_first_fetch_does_not_make_the_partitions_not_read_yet_idle():
    # the consumer's first records come after the idle timeout: the partitions nothing was
    # read of yet are not idle because of it, so partition 1 does not judge partition 0
    et = event_time(lag=100, idle=500)
    et.add_partition(0)
    et.add_partition(1)
    t0 = et.partitions[0].seen
    et.add_items(1, list(range(0, 10_000, 10)), now=t0 + 0.6)
    et.add_items(0, list(range(5, 10_000, 10)), now=t0 + 0.61)
    wm = None
    for e in out(et):
        if isinstance(e, Watermark):
            wm = e.timestamp
        else:
            assert wm is None or e[0] >= wm, f"{e} behind watermark {wm}"
    assert wm == 9_990 - 100  # partition 1, the lower of the two, decides


def test_a_partition_not_read_to_its_end_is_never_idle_however_slow_its_fetch():
    # a source that reports partition ends (Kafka): partition 1's first records come a whole
    # second after partition 0's (its fetch was sent later), twice the idle timeout; it has
    # not been read to its end, so it holds the watermark back and none of its records is late
    et = event_time(lag=0, idle=500, reports_end=True)
    et.add_partition(0)
    et.add_partition(1)
    et.add_items(0, [1_000, 2_000], now=10.0)
    et.reached_end(0)
    et.poll(now=11.0)
    assert [e for e in out(et) if isinstance(e, Watermark)] == []
    et.add_items(1, [1_500], now=11.0)
    assert out(et) == [(1_500, 1_500), Watermark(1_500)]


def test_a_partition_read_to_its_end_falls_idle_after_the_timeout_and_not_before():
    et = event_time(lag=0, idle=500, reports_end=True)
    et.add_partition(0)
    et.add_partition(1)
    et.add_items(0, [100], now=10.0)
    et.add_items(1, [50], now=10.0)
    out(et)
    et.reached_end(1)
    et.add_items(0, [900], now=10.4)
    et.poll(now=10.45)  # partition 1 at its end, but not for 500 ms yet
    assert out(et) == [(900, 900)]
    et.poll(now=10.6)
    assert out(et) == [Watermark(900)]
    # it delivers again: no longer at its end, so no timeout makes it idle until it is
    et.add_items(1, [950], now=10.7)
    et.add_items(0, [2_000], now=10.7)
    et.poll(now=20.0)
    assert out(et) == [(950, 950), (2_000, 2_000), Watermark(950)]


def test_every_partition_of_one_fetch_is_active_before_the_fetch_moves_the_watermark():
    et = event_time(lag=0, idle=1_000)
    et.add_partition(0)
    et.add_partition(1)
    et.add_batch([(0, [100]), (1, [100])], now=10.0)
    et.poll(now=12.0)  # both idle now
    out(et)
    # one fetch: partition 0 far ahead, then partition 1 where it was
    et.add_batch([(0, [5_000]), (1, [200])], now=12.5)
    assert out(et) == [(5_000, 5_000), Watermark(100), (200, 200), Watermark(200)]


def test_every_partition_idle_says_idle_then_active_again():
    et = event_time(lag=0, idle=1_000)
    et.add_partition(0)
    et.add_items(0, [100], now=1.0)
    assert out(et)[-1] == Watermark(100)
    et.poll(now=2.5)
    assert out(et) == [IDLE_MESSAGE]
    et.add_items(0, [100], now=3.0)  # no advance: still say the input is active again
    assert out(et) == [(100, 100), Watermark(100)]


def test_when_every_partition_falls_idle_the_watermark_first_reaches_the_highest_one():
    # partition 1 never delivers; partition 0's backlog ends, and both fall idle together
    et = event_time(lag=100, idle=500)
    et.add_partition(0)
    et.add_partition(1)
    et.add_items(0, [1_000, 2_000], now=5.0)
    assert [e for e in out(et) if isinstance(e, Watermark)] == []  # partition 1 holds it
    et.poll(now=5.6)
    assert out(et) == [Watermark(1_900), IDLE_MESSAGE]


def test_a_processor_without_partitions_is_idle():
    et = event_time()
    et.poll()
    assert out(et) == [IDLE_MESSAGE]


def test_a_restored_top_lets_the_partition_take_part_at_once():
    et = event_time(lag=10)
    et.add_partition(0, top=1_000)
    et.add_partition(1, top=400)
    et.add_items(0, [1_005])
    assert out(et) == [(1_005, 1_005), Watermark(390)]
    assert et.tops() == {0: 1_005, 1: 400}


def test_native_pairs_are_checked_and_kept():
    et = event_time(fn=None, lag=0)
    et.add_partition("p")
    et.add_items("p", [(5, "a"), (7, "b")])
    assert out(et) == [(5, "a"), Watermark(5), (7, "b"), Watermark(7)]


def test_an_unreadable_timestamp_fails_naming_the_stage_and_the_item():
    et = event_time(fn=lambda x: x["ts"])
    et.add_partition(0)
    with pytest.raises(TimestampError, match="stage 'timestamps'.*'no-ts'"):
        et.add_items(0, [{"ts": 1}, {"no-ts": 2}])


def test_unreadable_timestamps_go_to_the_side_output_and_are_counted():
    et = event_time(fn=lambda x: x["ts"], side=True, lag=0)
    et.add_partition(0)
    et.add_items(0, [{"ts": 1}, {"bad": 1}, {"ts": "x"}])
    box = Outbox(2, 1_000)
    assert et.flush(box)
    assert box.drain(0) == [{"bad": 1}, {"ts": "x"}, Watermark(1)]
    assert box.drain(1) == [(1, {"ts": 1}), Watermark(1)]
    assert et.metrics["bad_timestamps"] == 2


# --- pipelines on TestSources.partitioned ---------------------------------------------------

def skewed_partitions(n_parts: int = 6, per_part: int = 3_000, skew_ms: int = 5_000,
                      keys: int = 5) -> list[list[dict]]:
    """Each partition in order (within 40 ms), the partitions ``skew_ms`` apart in event
    time: a backlog after downtime."""
    parts = []
    for p in range(n_parts):
        base = p * skew_ms
        parts.append([{"ts": base + 10 * i - (i * 7919) % 40, "k": f"k{(i + p) % keys}"}
                      for i in range(per_part)])
    return parts


def tumbling_counts(parts: list[list[dict]], size: int) -> Counter:
    return Counter((e["ts"] - e["ts"] % size, e["k"]) for part in parts for e in part)


def run_windows(parts, order: str, parallelism: int, size: int = 1_000):
    p = Pipeline()
    (p.read_from(TestSources.partitioned(parts, order=order, batch=200))
      .with_timestamps(lambda e: e["ts"], allowed_lag=100)
      .window(WindowDefinition.tumbling(size))
      .group_by(lambda e: e["k"])
      .aggregate(ops.counting())
      .write_to(Sinks.list("windows")))
    with Member(local_parallelism=parallelism) as m:
        job = m.new_job(p)
        job.join()
        late = sum(v.get("late_events", 0) for v in job.metrics().values())
        got = Counter({(r.start, r.key): r.result for r in m.get_list("windows")})
    return late, got


@pytest.mark.parametrize("order", ["sequential", "round_robin", "random"])
@pytest.mark.parametrize("parallelism", [1, 2])
def test_a_skewed_backlog_has_no_late_event_whatever_the_read_order(order, parallelism):
    parts = skewed_partitions()
    late, got = run_windows(parts, order, parallelism)
    assert late == 0
    assert got == tumbling_counts(parts, 1_000)


def test_level_partitions_filled_round_robin_read_one_after_another_are_not_late():
    parts: list[list[dict]] = [[] for _ in range(4)]
    for i in range(20_000):
        parts[i % 4].append({"ts": 3 * i, "k": f"k{i % 7}"})
    late, got = run_windows(parts, "sequential", 1)
    assert late == 0
    assert got == tumbling_counts(parts, 1_000)


def test_events_beyond_the_lag_of_their_own_partition_are_late():
    # one partition: its own watermark decides; 50 ms back with a lag of 10 is late
    part = [{"ts": t, "k": "a"} for t in (1_000, 1_500, 2_100, 1_200, 2_200)]
    p = Pipeline()
    (p.read_from(TestSources.partitioned([part]))
      .with_timestamps(lambda e: e["ts"], allowed_lag=10)
      .window(WindowDefinition.tumbling(500))
      .aggregate(ops.counting())
      .write_to(Sinks.list("windows")))
    with Member(local_parallelism=1) as m:
        job = m.new_job(p)
        job.join()
        late = sum(v.get("late_events", 0) for v in job.metrics().values())
        got = {(r.start, r.result) for r in m.get_list("windows")}
    assert late == 1
    assert got == {(1_000, 1), (1_500, 1), (2_000, 2)}


def test_bad_timestamps_in_a_partition_go_to_bad_events_to():
    parts = [[{"ts": 10}, {"ts": None}, {"ts": 20}], [{"nope": 1}, {"ts": 15}]]
    p = Pipeline()
    (p.read_from(TestSources.partitioned(parts))
      .with_timestamps(lambda e: e["ts"], allowed_lag=0, bad_events_to=Sinks.list("bad"))
      .map(lambda e: e["ts"])
      .write_to(Sinks.list("good")))
    with Member(local_parallelism=2) as m:
        job = m.new_job(p)
        job.join()
        bad = sorted(map(repr, m.get_list("bad")))
        good = sorted(m.get_list("good"))
        counted = sum(v.get("bad_timestamps", 0) for v in job.metrics().values())
    assert bad == sorted(map(repr, [{"ts": None}, {"nope": 1}]))
    assert good == [10, 15, 20]
    assert counted == 2


def test_the_timestamp_stage_runs_in_the_source_and_nowhere_else():
    p = Pipeline()
    (p.read_from(TestSources.partitioned([[1], [2]]))
      .with_timestamps(lambda x: x, allowed_lag=0)
      .window(WindowDefinition.tumbling(10)).aggregate(ops.counting())
      .write_to(Sinks.list("w")))
    names = [v.name for v in p.to_dag().vertices]
    assert "timestamps" not in names and names[0] == "test-partitions"


def test_a_source_feeding_two_stages_keeps_a_timestamp_stage_of_its_own():
    p = Pipeline()
    src = p.read_from(TestSources.partitioned([[1], [2]]))
    src.write_to(Sinks.list("raw"))
    src.with_timestamps(lambda x: x, allowed_lag=0).window(WindowDefinition.tumbling(10)) \
        .aggregate(ops.counting()).write_to(Sinks.list("w"))
    with Member() as m:
        m.new_job(p).join()
        assert sorted(m.get_list("raw")) == [1, 2]
        assert [r.result for r in m.get_list("w")] == [2]


def test_each_partition_keeps_its_watermark_across_a_restore_with_another_parallelism():
    """Saved by 2 processors in the middle of a skewed backlog, restored on 3: each partition
    resumes at its position with its highest timestamp, on whichever processor owns it now,
    so the watermark is known at once and nothing read after the restore is late."""
    from jetwake.connectors.partitioned_items import PartitionedItemsSourceProcessor
    from jetwake.engine.core.processor import BroadcastKey, Inbox, ProcessorContext

    parts = skewed_partitions(n_parts=4, per_part=2_000)
    spec = EventTimeSpec("t", lambda e: e["ts"], WatermarkPolicy.limiting_lag(100), 1_000, 0,
                         False)
    saved = []
    for index in range(2):
        proc = PartitionedItemsSourceProcessor(parts, 64, "sequential", 0)
        proc.event_time_spec = spec
        proc.outbox = Outbox(1, 1_000_000)
        proc.init(ProcessorContext("j", "j", "src", index, index, 2, 2, 0, 1))
        for p in proc.pos:  # half of each partition read
            proc.et.add_items(p, parts[p][:1_000])
            proc.pos[p] = 1_000
        proc.save_to_snapshot()
        saved += proc.outbox.drain_snapshot()
    assert sorted(k.key[1] for k, _ in saved) == [0, 1, 2, 3]
    late, owned = 0, []
    for index in range(3):
        proc = PartitionedItemsSourceProcessor(parts, 64, "sequential", 0)
        proc.event_time_spec = spec
        proc.outbox = Outbox(1, 1_000_000)
        proc.init(ProcessorContext("j", "j", "src", index, index, 3, 3, 0, 1))
        proc.restore_from_snapshot(Inbox(list(saved)))  # as the engine does: after init
        owned += list(proc.pos)
        assert proc.et.tops() == {p: max(e["ts"] for e in parts[p][:1_000]) for p in proc.pos}
        while not proc.complete():
            pass
        wm = None
        for e in proc.outbox.drain(0):
            if isinstance(e, Watermark):
                wm = e.timestamp
            elif wm is not None and e[0] < wm:
                late += 1
        assert all(pos == 2_000 for pos in proc.pos.values())
    assert sorted(owned) == [0, 1, 2, 3]
    assert late == 0


def test_a_snapshot_waits_until_the_items_read_before_it_have_left_the_source():
    """Items read but still pending (a full outbox) go out before the barrier: a snapshot
    that saved the position past them while they waited would lose them on a restore."""
    from jetwake.connectors.partitioned_items import PartitionedItemsSourceProcessor
    from jetwake.engine.core.processor import ProcessorContext

    parts = [[{"ts": 10 * i} for i in range(100)]]  # half read when the snapshot comes
    spec = EventTimeSpec("t", lambda e: e["ts"], WatermarkPolicy.limiting_lag(0), 10, 0, False)
    proc = PartitionedItemsSourceProcessor(parts, 50, "sequential", 0)
    proc.event_time_spec = spec
    proc.outbox = Outbox(1, 1)  # room for one chunk: the watermarks after it wait
    proc.init(ProcessorContext("j", "j", "src", 0, 0, 1, 1, 0, 1, "exactly_once"))
    proc.complete()
    assert proc.et.pending, "items must be pending for this test to mean anything"
    assert proc.save_to_snapshot() is False
    emitted = proc.outbox.drain(0)
    while not proc.save_to_snapshot():
        emitted += proc.outbox.drain(0)
    emitted += proc.outbox.drain(0)
    (_, (pos, top)), = proc.outbox.drain_snapshot()
    assert not proc.et.pending
    assert len([e for e in emitted if not isinstance(e, Watermark)]) == pos == 50
    assert top == 490
