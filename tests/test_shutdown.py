"""A graceful member shutdown leaves every job that was running resumable: the record says so
whatever the job's status in memory becomes, unless the job ends (fails, completes) meanwhile;
a suspended job stays suspended. (A terminal snapshot that cannot be written is covered in
tests/test_disk_full.py, on a real full disk.)"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from jetwake import JobConfig, JobStatus, Member, Pipeline, ProcessorMetaSupplier, Sinks, Source
from support.snapshot_fixtures import CountingSource, RunningSum, running_sum_pipeline
from support.waiting import wait_until

# how long the slow source takes to close: longer than every step of a shutdown takes when
# its processors close at once (the record must not depend on how long they take)
SLOW_CLOSE_S = 3


class SlowClosingSource(CountingSource):
    """Takes ``SLOW_CLOSE_S`` seconds to close while ``marker`` exists (a source whose client
    is slow to disconnect)."""

    def __init__(self, marker: str) -> None:
        super().__init__(None, cooperative=False)  # closes on its own thread
        self.marker = marker

    def close(self) -> None:
        if os.path.exists(self.marker):
            time.sleep(SLOW_CLOSE_S)


class BlockingInitSource(CountingSource):
    """Blocks in init() while the module's gate is closed (a slow connect)."""

    gate = threading.Event()

    def __init__(self) -> None:
        super().__init__(None)

    def init(self, context) -> None:
        super().init(context)
        assert BlockingInitSource.gate.wait(60), "the test never opened the gate"


class FailingSaveSource(CountingSource):
    """Fails in save_to_snapshot once ``marker`` exists (a bug that shows at shutdown)."""

    def __init__(self, marker: str) -> None:
        super().__init__(None)
        self.marker = marker

    def save_to_snapshot(self) -> bool:
        if os.path.exists(self.marker):
            raise ValueError("cannot save: the state is inconsistent")
        return super().save_to_snapshot()


def pipeline_from(name: str, make) -> Pipeline:
    p = Pipeline()
    (p.read_from(Source(name, ProcessorMetaSupplier.of(make, 1), is_stream=True))
      .map(lambda x: (x % 7, x))
      .rebalance(lambda e: e[0])
      .custom_transform("running-sum", RunningSum)
      .write_to(Sinks.map("sums")))
    return p


def eo(name: str = "sums") -> JobConfig:
    return JobConfig(name=name, processing_guarantee="exactly_once", snapshot_interval_ms=50)


def recorded_status(data_dir, job_id: str) -> str:
    with open(os.path.join(data_dir, "jobs", job_id, "RECORD")) as f:
        return json.load(f)["status"]


def test_a_running_job_resumes_from_its_terminal_snapshot(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        wait_until(lambda: job.last_snapshot, what="a snapshot")
    assert job.status == JobStatus.SUSPENDED
    assert recorded_status(tmp_path, job.id) == "RUNNING"
    with Member(tmp_path) as m:
        terminal = m.snapshot_store.latest(job.id)
        assert terminal.terminal
        resumed = m.job(job.id)
        assert resumed.status == JobStatus.RUNNING
        assert m.find_coordinator(job.id).execution_count == 1
        # restored from the terminal snapshot: the next one continues from there
        wait_until(lambda: resumed.last_snapshot.snapshot_id > terminal.snapshot_id,
                   what="a snapshot after the terminal one")


def test_a_job_slow_to_stop_at_shutdown_is_not_left_suspended_for_good(tmp_path):
    marker = str(tmp_path / "slow")
    data_dir = tmp_path / "data"
    m = Member(data_dir)
    job = m.new_job(pipeline_from("slow-source", lambda: SlowClosingSource(marker)), eo())
    wait_until(lambda: job.last_snapshot, what="a snapshot")
    open(marker, "w").close()
    m.shutdown()
    # once the job has really stopped, its record must still say it resumes
    wait_until(lambda: job.status == JobStatus.SUSPENDED, what="the job to stop",
               timeout=SLOW_CLOSE_S + 30)
    assert recorded_status(data_dir, job.id) == "RUNNING"
    os.unlink(marker)
    with Member(data_dir) as m:
        assert m.job(job.id).status == JobStatus.RUNNING


def test_a_job_starting_at_shutdown_resumes_on_the_next_start(tmp_path):
    BlockingInitSource.gate.set()
    m = Member(tmp_path)
    job = m.new_job(pipeline_from("blocking-source", BlockingInitSource), eo())
    wait_until(lambda: job.last_snapshot, what="a snapshot")
    BlockingInitSource.gate.clear()
    restarting = threading.Thread(target=job.restart, daemon=True)
    restarting.start()
    wait_until(lambda: job.status == JobStatus.STARTING, what="the restart to block in init()")

    def open_gate_once_shutting_down() -> None:
        wait_until(lambda: m._shut_down, what="shutdown to begin")
        BlockingInitSource.gate.set()
    opener = threading.Thread(target=open_gate_once_shutting_down, daemon=True)
    opener.start()
    m.shutdown()
    opener.join(10)
    assert job.status == JobStatus.NOT_RUNNING, "the start in progress was abandoned"
    assert recorded_status(tmp_path, job.id) == "RUNNING"
    with Member(tmp_path) as m:
        assert m.job(job.id).status == JobStatus.RUNNING


def test_a_job_that_fails_while_the_member_shuts_down_stays_failed(tmp_path):
    marker = str(tmp_path / "broken")
    data_dir = tmp_path / "data"
    m = Member(data_dir)
    job = m.new_job(pipeline_from("fragile", lambda: FailingSaveSource(marker)), eo())
    wait_until(lambda: job.last_snapshot, what="a snapshot")
    open(marker, "w").close()
    m.shutdown()
    assert job.status == JobStatus.FAILED
    assert "cannot save" in job.failure
    assert recorded_status(data_dir, job.id) == "FAILED"
    with Member(data_dir) as m:
        assert m.job(job.id).status == JobStatus.FAILED


def test_a_suspended_job_stays_suspended_across_a_shutdown(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        wait_until(lambda: job.last_snapshot, what="a snapshot")
        job.suspend()
    assert recorded_status(tmp_path, job.id) == "SUSPENDED"
    with Member(tmp_path) as m:
        again = m.job(job.id)
        assert again.status == JobStatus.SUSPENDED
        again.resume()
        assert again.status == JobStatus.RUNNING


@pytest.mark.parametrize("guarantee", ["none"])
def test_a_job_without_snapshots_is_cancelled_at_shutdown(tmp_path, guarantee):
    with Member(tmp_path) as m:
        job = m.new_job(running_sum_pipeline(None), JobConfig(name="plain",
                                                             processing_guarantee=guarantee))
        wait_until(lambda: job.status == JobStatus.RUNNING, what="the job to run")
    assert job.status == JobStatus.FAILED
    with Member(tmp_path) as m:
        assert m.job(job.id).status == JobStatus.FAILED
