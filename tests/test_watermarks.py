"""Inserting watermarks: policies, throttling, exact placement, idle inputs."""

from __future__ import annotations


import pytest

from jetwake import (
    AggregateOperations as ops, Member, Pipeline, Processor, ProcessorMetaSupplier, Sinks, Source,
    WindowDefinition,
)
from jetwake.engine.core.stream_items import IDLE_MESSAGE, Watermark
from jetwake.engine.core.processor import Inbox, Outbox, ProcessorContext
from jetwake.engine.operations import watermark_policy
from jetwake.engine.processors import insert_watermarks
from jetwake.engine.processors.insert_watermarks import InsertWatermarksProcessor
from jetwake.engine.operations.watermark_policy import WatermarkPolicy, throttle
from support.clock import ControlledClock
from support.waiting import wait_until


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ControlledClock:
    """The clock of the watermark policies and the inserter's idle timeout, moved by hand."""
    clock = ControlledClock()
    monkeypatch.setattr(watermark_policy, "time", clock)
    monkeypatch.setattr(insert_watermarks, "time", clock)
    return clock


def ctx(index: int = 0) -> ProcessorContext:
    return ProcessorContext("job", "job", "v", index, index, 1, 1, 0, 1)


def inserter(lag=10, step=1, policy=None, idle=0, ts_fn=lambda x: x):
    p = InsertWatermarksProcessor("stage", ts_fn, policy or WatermarkPolicy.limiting_lag(lag),
                                  step, idle)
    p.outbox = Outbox(1, 100_000)
    p.init(ctx())
    return p


def entries(p) -> list:
    """The outbox contents flattened: items and watermarks, in order."""
    return p.outbox.drain(0)


def test_limiting_lag_is_the_highest_timestamp_minus_the_lag():
    pol = WatermarkPolicy.limiting_lag(10)()
    for t in (5, 30, 12):
        pol.report_event(t)
    assert pol.current() == 20


def test_limiting_real_time_lag_follows_the_wall_clock(clock):
    pol = WatermarkPolicy.limiting_real_time_lag(1_000)()
    pol.report_event(clock.ms + 50_000)  # events do not move it
    assert pol.current() == clock.ms - 1_000
    clock.advance(ms=250)
    assert pol.current() == clock.ms - 1_000


def test_throttle_rounds_down_to_the_step():
    assert throttle(1234, 100) == 1200
    assert throttle(-1, 100) == -100
    assert throttle(7, 1) == 7


def test_a_watermark_is_inserted_right_after_the_item_that_advanced_it():
    p = inserter(lag=10, step=1)
    p.process(0, Inbox([100, 105, 103, 120]))
    assert entries(p) == [(100, 100), Watermark(90), (105, 105), Watermark(95), (103, 103),
                          (120, 120), Watermark(110)]


def test_throttling_emits_one_watermark_per_step_at_step_boundaries():
    p = inserter(lag=0, step=100)
    p.process(0, Inbox(list(range(0, 350, 10))))
    wms = [e for e in entries(p) if isinstance(e, Watermark)]
    assert wms == [Watermark(0), Watermark(100), Watermark(200), Watermark(300)]


def test_placement_does_not_depend_on_chunking():
    items = [5, 1, 30, 12, 44, 41, 90, 60, 150, 149, 151]
    whole = inserter(lag=5, step=10)
    whole.process(0, Inbox(list(items)))
    pieces = inserter(lag=5, step=10)
    for i in range(0, len(items), 3):
        pieces.process(0, Inbox(items[i:i + 3]))
    assert entries(whole) == entries(pieces)


def test_watermarks_never_go_backwards():
    p = inserter(lag=0, step=1)
    p.process(0, Inbox([50, 10, 40, 60, 5]))
    wms = [e.timestamp for e in entries(p) if isinstance(e, Watermark)]
    assert wms == sorted(set(wms)) == [50, 60]


def test_upstream_watermarks_are_dropped():
    p = inserter()
    assert p.try_process_watermark(Watermark(1_000))
    assert entries(p) == []


def test_a_quiet_input_is_marked_idle_and_wakes_up_with_a_watermark(clock):
    p = inserter(lag=0, step=1, idle=30)
    p.process(0, Inbox([10]))
    entries(p)
    clock.advance(ms=29)
    assert p.try_process()
    assert entries(p) == []  # quiet for less than the idle timeout
    clock.advance(ms=1)
    p.try_process()
    assert entries(p) == [IDLE_MESSAGE]
    p.try_process()
    assert entries(p) == []  # idle once
    p.process(0, Inbox([5]))  # not advancing, but the input is active again
    assert entries(p) == [(5, 5), Watermark(10)]


def test_real_time_policy_emits_watermarks_without_events(clock):
    p = inserter(policy=WatermarkPolicy.limiting_real_time_lag(0), step=1)
    p.try_process()
    assert entries(p) == [Watermark(clock.ms)]
    p.try_process()
    assert entries(p) == []  # the clock did not move
    clock.advance(ms=40)
    p.try_process()
    assert entries(p) == [Watermark(clock.ms)]


def test_snapshot_of_the_inserter_restores_its_watermark():
    p = inserter(lag=0, step=1)
    p.process(0, Inbox([100]))
    assert p.save_to_snapshot()
    saved = p.outbox.drain_snapshot()
    q = inserter(lag=0, step=1)
    q.restore_from_snapshot(Inbox(saved))
    q.process(0, Inbox([50]))  # behind the restored watermark: no new watermark
    assert entries(q) == [(50, 50)]


# --- idle inputs end to end -------------------------------------------------------------------

class _OneQuietPartition(Processor):
    """Processor 0 emits its events then stays open; processor 1 never emits anything."""

    def __init__(self, events):
        self.events = events
        self.sent = False

    def complete(self) -> bool:
        if self.context.global_processor_index == 0 and not self.sent:
            self.outbox.offer_chunk(-1, list(self.events))
            self.sent = True
        return False  # an unbounded source


def idle_job(idle_timeout):
    events = [(t, "k") for t in range(0, 1_000, 10)]
    source = Source("quiet", ProcessorMetaSupplier.of(lambda: _OneQuietPartition(events), 2),
                    is_stream=True)
    p = Pipeline()
    (p.read_from(source)
      .with_timestamps(lambda e: e[0], allowed_lag=0, idle_timeout=idle_timeout)
      .window(WindowDefinition.tumbling(100))
      .group_by(lambda e: e[1])
      .aggregate(ops.counting())
      .write_to(Sinks.list("out")))
    return p


def windows_received(job) -> int:
    """The events the window stage's first step has received."""
    return job.metrics().get("window-aggregate-accumulate", {}).get("items_in", 0)


@pytest.mark.parametrize("idle_timeout,expect_results", [(100, True), (0, False)])
def test_one_quiet_source_partition_stalls_the_job_only_without_idle_timeout(
        idle_timeout, expect_results):
    with Member(local_parallelism=2) as m:
        job = m.new_job(idle_job(idle_timeout))
        if expect_results:
            wait_until(lambda: len(m.get_list("out")) >= 9, timeout=15,
                       what="the windows of the partition that has events")
        else:
            # the premise: every event reached the windows, which still close none
            wait_until(lambda: windows_received(job) >= 100, timeout=15,
                       what="the events at the window stage")
        out = sorted(m.get_list("out"))
        state = (job.status, job.failure, job.metrics())
        job.cancel()
    if expect_results:
        assert [(r.start, r.result) for r in out] == [(s, 10) for s in range(0, 900, 100)], state
    else:
        assert out == [], state
