"""Terminal snapshots (suspend, graceful shutdown, cancel-and-export): nothing is processed or
written after one, so the job that carries on from it writes no item twice, even through
sinks that are only at-least-once (files, logger, map with merging)."""

from __future__ import annotations

import collections
import logging
import os

import pytest

from jetwake import JobConfig, JobStatus, Member, Pipeline, Sinks
from support.snapshot_fixtures import counting_source
from support.waiting import wait_until

LIMIT = 20_000


def _add(old: int, new: int) -> int:
    return old + new


def _pipeline(sink: str, directory: str) -> Pipeline:
    p = Pipeline()
    stage = p.read_from(counting_source(LIMIT, per_call=20, pause=0.001))
    if sink == "files":
        stage.write_to(Sinks.files(directory))
    elif sink == "logger":
        stage.write_to(Sinks.logger(lambda x: f"item {x}"))
    else:
        stage.map(lambda x: (x, 1)).write_to(Sinks.map_with_merging("counts", _add))
    return p


def _config(**kw) -> JobConfig:
    return JobConfig(name="terminal", processing_guarantee="at_least_once",
                     snapshot_interval_ms=3_600_000, **kw)


def _output(sink: str, directory: str, member: Member, caplog) -> collections.Counter:
    if sink == "files":
        lines: list[str] = []
        for name in os.listdir(directory):
            with open(os.path.join(directory, name)) as f:
                lines += f.read().splitlines()
        return collections.Counter(int(x) for x in lines)
    if sink == "logger":
        return collections.Counter(int(r.getMessage().split()[1]) for r in caplog.records
                                   if r.name == "jetwake.sink.logger")
    return collections.Counter({k: v for k, v in member.get_map("counts").items()})


def _wait_for_output(sink, directory, member, caplog, at_least: int) -> None:
    wait_until(lambda: sum(_output(sink, directory, member, caplog).values()) >= at_least,
               timeout=20, what=f"the job to write {at_least} items")


def _assert_every_item_once(counts: collections.Counter) -> None:
    twice = sorted(x for x, n in counts.items() if n > 1)
    missing = sorted(set(range(LIMIT)) - set(counts))
    assert not twice, f"{len(twice)} items written twice, e.g. {twice[:5]}"
    assert not missing, f"{len(missing)} items missing, e.g. {missing[:5]}"


SINKS = ["files", "logger", "map_with_merging"]


@pytest.fixture(autouse=True)
def _capture_logger_sink(caplog):
    caplog.set_level(logging.INFO, logger="jetwake.sink.logger")


@pytest.mark.parametrize("sink", SINKS)
def test_suspend_then_resume_writes_every_item_once(tmp_path, caplog, sink):
    directory = str(tmp_path / "out")
    with Member(tmp_path / "member") as m:
        job = m.new_job(_pipeline(sink, directory), _config())
        _wait_for_output(sink, directory, m, caplog, 1000)
        job.suspend()
        assert job.status == JobStatus.SUSPENDED
        written = sum(_output(sink, directory, m, caplog).values())
        assert written < LIMIT, "the job finished before it was suspended"
        job.resume()
        job.join(60)
        _assert_every_item_once(_output(sink, directory, m, caplog))


@pytest.mark.parametrize("sink", SINKS)
def test_graceful_shutdown_then_restart_writes_every_item_once(tmp_path, caplog, sink):
    directory = str(tmp_path / "out")
    m = Member(tmp_path / "member")
    try:
        m.new_job(_pipeline(sink, directory), _config())
        _wait_for_output(sink, directory, m, caplog, 1000)
    finally:
        m.shutdown()
    with Member(tmp_path / "member") as m2:
        job = m2.get_job("terminal")
        job.join(60)
        _assert_every_item_once(_output(sink, directory, m2, caplog))


@pytest.mark.parametrize("sink", SINKS)
def test_cancel_and_export_then_a_new_job_writes_every_item_once(tmp_path, caplog, sink):
    directory = str(tmp_path / "out")
    with Member(tmp_path / "member") as m:
        job = m.new_job(_pipeline(sink, directory), _config())
        _wait_for_output(sink, directory, m, caplog, 1000)
        job.cancel_and_export_snapshot("handover")
        follower = m.new_job(_pipeline(sink, directory),
                             _config(initial_snapshot_name="handover"))
        follower.join(60)
        _assert_every_item_once(_output(sink, directory, m, caplog))
