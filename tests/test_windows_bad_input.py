"""Bad window definitions and bad timestamps: clear errors that name the stage or the item."""

from __future__ import annotations

import pytest

from jetwake import (
    AggregateOperations as ops, JetwakeError, Member, Pipeline, PipelineError, Sinks, Sources,
    TimestampError, WindowDefinition,
)


@pytest.mark.parametrize("make", [
    lambda: WindowDefinition.tumbling(0),
    lambda: WindowDefinition.tumbling(-10),
    lambda: WindowDefinition.sliding(100, 0),
    lambda: WindowDefinition.sliding(-100, 10),
    lambda: WindowDefinition.session(0),
    lambda: WindowDefinition.session(-1),
])
def test_zero_or_negative_sizes_are_rejected(make):
    with pytest.raises(PipelineError, match="positive"):
        make()


def test_sliding_size_must_be_a_multiple_of_the_slide():
    with pytest.raises(PipelineError, match="not a multiple of its slide 30"):
        WindowDefinition.sliding(100, 30)


def test_window_sizes_must_be_integers():
    with pytest.raises(TypeError, match="int"):
        WindowDefinition.tumbling(1.5)


def test_window_on_a_stage_without_timestamps_names_the_stage():
    p = Pipeline()
    stage = p.read_from(Sources.items([1, 2])).map(lambda x: x).set_name("parse-events")
    with pytest.raises(PipelineError, match="'parse-events'.*no timestamps"):
        stage.window(WindowDefinition.tumbling(10))
    with pytest.raises(PipelineError, match="parse-events"):
        stage.group_by(lambda x: x).window(WindowDefinition.tumbling(10))


def test_timestamps_are_lost_after_a_stage_that_does_not_keep_them():
    p = Pipeline()
    stage = (p.read_from(Sources.items([(1, 1)])).with_timestamps(lambda e: e[0], 0)
             .distinct())
    with pytest.raises(PipelineError, match="no timestamps"):
        stage.window(WindowDefinition.tumbling(10))


def test_native_timestamps_need_a_source_that_has_them():
    p = Pipeline()
    with pytest.raises(PipelineError, match="no native timestamps"):
        p.read_from(Sources.items([1])).with_native_timestamps(0)


def test_negative_lag_is_rejected():
    p = Pipeline()
    with pytest.raises(ValueError, match="lag"):
        p.read_from(Sources.items([1])).with_timestamps(lambda x: x, -5)


def windowed(events, ts_fn, bad_sink=None):
    p = Pipeline()
    (p.read_from(Sources.items(events))
      .with_timestamps(ts_fn, allowed_lag=0, bad_events_to=bad_sink)
      .set_name("event-time")
      .window(WindowDefinition.tumbling(10))
      .aggregate(ops.counting())
      .write_to(Sinks.list("out")))
    return p


def test_a_timestamp_function_returning_a_non_integer_fails_the_job_naming_the_stage():
    with Member(local_parallelism=2) as m:
        job = m.new_job(windowed([{"t": 1}, {"t": 2.5}], lambda e: e["t"]))
        with pytest.raises(TimestampError) as info:
            job.join(timeout=30)
    msg = str(info.value)
    assert "'event-time'" in msg and "float" in msg and "{'t': 2.5}" in msg
    assert isinstance(info.value, (TypeError, JetwakeError))


def test_an_unreadable_timestamp_fails_the_job_showing_the_item_truncated():
    big = {"id": 7, "payload": "x" * 10_000}
    with Member(local_parallelism=2) as m:
        job = m.new_job(windowed([{"ts": 1}, big], lambda e: e["ts"]))
        with pytest.raises(TimestampError) as info:
            job.join(timeout=30)
    msg = str(info.value)
    assert "'event-time'" in msg and "KeyError" in msg and "'id': 7" in msg
    assert len(msg) < 600


def test_unreadable_timestamps_can_be_routed_to_a_sink():
    events = [{"ts": 1}, {"nots": 0}, {"ts": 12}, {"ts": "late"}, {"ts": 15}]
    with Member(local_parallelism=2) as m:
        job = m.new_job(windowed(events, lambda e: e["ts"], Sinks.list("bad")))
        job.join(timeout=30)
        assert sorted(tuple(r) for r in m.get_list("out")) == [(0, 10, 1), (10, 20, 2)]
        assert sorted(map(str, m.get_list("bad"))) == ["{'nots': 0}", "{'ts': 'late'}"]
        assert sum(v.get("bad_timestamps", 0) for v in job.metrics().values()) == 2
