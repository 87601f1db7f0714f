"""A member alone is a cluster of one: its jobs run through its own execution participant, as
every member of a cluster does, and still behave as an embedded engine should (the user's own
exception from join(), the objects the user submitted, the snapshot layout of one member)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from jetwake import (
    AggregateOperations, JobConfig, JobStatus, Member, Pipeline, Processor, Sinks, Sources,
)
from jetwake.engine.core.errors import JobCancelledError
from support.snapshot_fixtures import counting_source, expected_sums, running_sum_pipeline
from support.waiting import wait_until

LIMIT = 20_000


def eo(**kw) -> JobConfig:
    return JobConfig(name="sums", processing_guarantee="exactly_once", snapshot_interval_ms=50,
                     **kw)


def test_a_member_alone_runs_each_execution_through_its_participant():
    with Member() as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        wait_until(lambda: m.participant.running(), what="the execution on the participant")
        [share] = m.participant.running()
        assert share.job_id == job.id
        assert share.exec_key.startswith(f"{job.id}.{m.member_id}.")
        assert share.execution is not None and share.execution.tasklets
        job.cancel()
        wait_until(lambda: not m.participant.running(), what="the share to end")


def test_a_failing_processor_fails_the_job_with_the_users_own_exception():
    def parse(x: int) -> int:
        if x == 4_321:
            raise ValueError(f"bad record {x}")
        return x

    p = Pipeline()
    p.read_from(Sources.items(range(10_000))).map(parse).write_to(Sinks.list("out"))
    with Member() as m:
        job = m.new_job(p)
        with pytest.raises(ValueError, match="bad record 4321"):
            job.join(30)
        assert job.status == JobStatus.FAILED
        assert "ValueError: bad record 4321" in job.failure


def test_the_processors_of_a_member_alone_use_the_objects_the_user_submitted():
    seen: list[int] = []

    def remember(x: int) -> int:
        seen.append(x)
        return x

    p = Pipeline()
    p.read_from(Sources.items(range(1_000))).map(remember).write_to(Sinks.list("out"))
    with Member() as m:
        m.new_job(p).join(30)
        assert sorted(seen) == list(range(1_000))  # not a copy's list


def test_a_snapshot_of_a_member_alone_is_one_part_read_where_it_was_written(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        wait_until(lambda: job.last_snapshot is not None, what="a committed snapshot")
        rec = job.last_snapshot
        directory = tmp_path / "jobs" / job.id / "snapshots" / str(rec.snapshot_id)
        with open(directory / "COMMIT") as f:
            committed = json.load(f)
        assert committed["data_refs"] == {}  # no copy elsewhere: the member's files are it
        for vertex_files in committed["files"].values():
            assert vertex_files  # every saved processor has its data file
        assert any(name != "COMMIT" for name in os.listdir(directory))
        job.cancel()


def test_a_member_alone_restores_a_snapshot_kept_in_memory():
    with Member() as m:  # no data directory: the snapshot's parts wait in memory to commit
        job = m.new_job(running_sum_pipeline(LIMIT), eo())
        wait_until(lambda: job.last_snapshot is not None, what="a committed snapshot")
        job.restart()
        job.join(60)
        assert job.status == JobStatus.COMPLETED
        assert dict(m.get_map("sums").items()) == expected_sums(LIMIT)


class _Gate(Processor):
    """Passes items on; its init waits until the test lets it finish (a slow start)."""

    entered = threading.Event()
    release = threading.Event()

    def init(self, context) -> None:
        super().init(context)
        _Gate.entered.set()
        _Gate.release.wait(30)

    def process(self, ordinal, inbox) -> None:
        if self.outbox.has_room():
            self.outbox.offer_chunk(-1, inbox.drain())


def test_a_start_cancelled_while_its_processors_initialize_closes_them_before_their_state_goes(
        tmp_path, caplog):
    p = Pipeline()
    (p.read_from(counting_source(None)).group_by(lambda x: x % 10)
      .rolling_aggregate(AggregateOperations.counting())
      .custom_transform("gate", _Gate).write_to(Sinks.list("out")))
    with Member(tmp_path) as m:
        c = m.add_job(p, eo(state_backend="rocksdb"))
        starting = threading.Thread(target=lambda: pytest.raises(JobCancelledError, c.start))
        starting.start()
        assert _Gate.entered.wait(30), "the processors never initialized"
        c.cancel()  # while the start builds the processors: it ends cancelled
        _Gate.release.set()
        starting.join(30)
        assert c.status == JobStatus.FAILED and not starting.is_alive()
    closing_errors = [r for r in caplog.records if "after a failed start" in r.getMessage()]
    assert closing_errors == [], "a processor's RocksDB state was removed while it closed"
    state = tmp_path / "state" / c.job_id
    assert not state.exists() or not os.listdir(state), "the start left working state behind"
