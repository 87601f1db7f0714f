"""A full disk, for real: the member's data directory is a small tmpfs filled with a ballast
file. A snapshot that cannot be written fails that snapshot only; the job runs on, says why
(its snapshot error, an event, the jetwake_snapshot_failures_total metric), leaves nothing
half-written behind, and takes its next snapshot by itself once there is space again. The job
operations end in states the user can act on while the disk is full.

Mounting needs root; without it these tests are skipped (they say so).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from jetwake import JobCancelledError, JobConfig, JobStatus, Member, Pipeline, Sinks
from jetwake.engine.core.errors import SnapshotWriteError
from jetwake.engine.server.metrics import JetwakeCollector
from support.snapshot_fixtures import RunningSum, counting_source
from support.waiting import wait_until

pytestmark = pytest.mark.integration

DISK_SIZE = "8m"
PAGE = os.sysconf("SC_PAGE_SIZE")  # tmpfs allocates whole pages


class Disk:
    """A tmpfs of DISK_SIZE mounted at ``path``; ``fill()`` takes every free byte."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.ballast = os.path.join(path, "ballast")

    def fill(self, leave_pages: int = 0) -> None:
        """Fills the disk, then gives back ``leave_pages`` pages."""
        with open(self.ballast, "ab", buffering=0) as f:
            for chunk in (1 << 20, PAGE):
                block = b"\0" * chunk
                while True:
                    try:
                        f.write(block)
                    except OSError as e:
                        assert e.errno == errno.ENOSPC, e
                        break
            if leave_pages:
                f.truncate(f.tell() - leave_pages * PAGE)

    def free(self) -> None:
        os.unlink(self.ballast)


@pytest.fixture
def disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("a real full disk is a tmpfs mounted for the test, which needs root")
    path = str(tmp_path / "disk")
    os.mkdir(path)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", path],
                   check=True, capture_output=True)
    try:
        yield Disk(path)
    finally:
        if subprocess.run(["umount", path], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", path], check=True)


def source_only() -> Pipeline:
    """An endless source into a sink that needs no disk: its snapshots have one data file."""
    p = Pipeline()
    p.read_from(counting_source(None)).write_to(Sinks.noop())
    return p


def pipeline() -> Pipeline:
    """An endless keyed running sum into a sink that needs no disk."""
    p = Pipeline()
    (p.read_from(counting_source(None))
      .map(lambda x: (x % 7, x))
      .rebalance(lambda e: e[0])
      .custom_transform("running-sum", RunningSum)
      .write_to(Sinks.noop()))
    return p


def eo(name: str = "disk") -> JobConfig:
    return JobConfig(name=name, processing_guarantee="exactly_once", snapshot_interval_ms=50)


def fill_until_snapshots_fail(disk: Disk, c, leave_pages: int = 0) -> None:
    """Fills the disk, between two snapshots, until snapshots fail for good (two in a row)."""
    for _ in range(20):
        with c.snapshots.paused():  # not while a snapshot has half its files written
            disk.fill(leave_pages)
        failures, count = c.snapshot_failures, c.snapshot_count
        wait_until(lambda: c.snapshot_failures >= failures + 2 or c.snapshot_count > count,
                   what="snapshots to fail or commit")
        if c.snapshot_count == count:
            return
    raise AssertionError("snapshots kept committing on a full disk")


def recorded(data_dir: str, job_id: str) -> dict:
    with open(os.path.join(data_dir, "jobs", job_id, "RECORD")) as f:
        return json.load(f)


def leftovers(data_dir: str, job_id: str, c) -> tuple[list[str], list[str]]:
    """Snapshot directories without a commit record, and temporary files, while no snapshot
    is being written."""
    base = os.path.join(data_dir, "jobs", job_id, "snapshots")
    with c.snapshots.paused():  # no snapshot in progress while we look
        uncommitted = [d for d in os.listdir(base)
                       if not os.path.exists(os.path.join(base, d, "COMMIT"))]
        tmp = [os.path.join(root, f) for root, _, files in os.walk(data_dir)
               for f in files if f.endswith(".tmp")]
    return uncommitted, tmp


def snapshot_failures_metric(m: Member, job) -> float:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JetwakeCollector(m))
    text = generate_latest(registry).decode()
    prefix = f'jetwake_snapshot_failures_total{{job="{job.name}",job_id="{job.id}"}} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert lines, "jetwake_snapshot_failures_total is exported per job"
    return float(lines[0][len(prefix):])


def test_a_full_disk_fails_snapshots_while_the_job_runs_on_and_it_recovers_by_itself(disk):
    data_dir = os.path.join(disk.path, "data")
    with Member(data_dir) as m:
        events: list[str] = []
        m.add_listener(lambda _id, _name, event: events.append(event))
        job = m.new_job(pipeline(), eo())
        c = m.find_coordinator(job.id)
        wait_until(lambda: job.last_snapshot, what="a snapshot")
        good = job.last_snapshot.snapshot_id

        fill_until_snapshots_fail(disk, c)
        assert job.status == JobStatus.RUNNING
        assert "No space left on device" in c.last_snapshot_error
        assert any(e.startswith("snapshot failed: ") and "No space left" in e for e in events)
        assert snapshot_failures_metric(m, job) == c.snapshot_failures >= 2
        uncommitted, tmp = leftovers(data_dir, job.id, c)
        assert uncommitted == [], "a failed snapshot is removed"
        assert tmp == [], "no temporary file stays"
        assert m.snapshot_store.latest(job.id).snapshot_id >= good, "the last good one stays"
        items = job.metrics()["running-sum"]["items_out"]
        wait_until(lambda: job.metrics()["running-sum"]["items_out"] > items + 1000,
                   what="the job to process items on a full disk")

        disk.free()
        count = c.snapshot_count
        wait_until(lambda: c.snapshot_count > count, what="a snapshot once there is space")
        assert c.last_snapshot_error is None
        assert job.status == JobStatus.RUNNING
        job.cancel()


def test_a_snapshot_whose_commit_record_cannot_be_written_leaves_nothing_behind(disk):
    data_dir = os.path.join(disk.path, "data")
    with Member(data_dir) as m:
        job = m.new_job(source_only(), eo())
        c = m.find_coordinator(job.id)
        wait_until(lambda: job.last_snapshot, what="a snapshot")
        # one free page: a snapshot gets its id and its data file, not its commit record
        fill_until_snapshots_fail(disk, c, leave_pages=1)
        assert job.status == JobStatus.RUNNING
        # it failed after taking its id: the data was written, the commit record was not
        assert c.last_snapshot_error.startswith("writing snapshot ")
        assert "No space left on device" in c.last_snapshot_error
        uncommitted, tmp = leftovers(data_dir, job.id, c)
        assert uncommitted == [] and tmp == []
        disk.free()
        count = c.snapshot_count
        wait_until(lambda: c.snapshot_count > count, what="a snapshot once there is space")
        job.cancel()


def test_a_snapshot_whose_data_cannot_be_flushed_is_removed_by_abort(disk):
    from jetwake.snapshot.store.snapshot_store import SnapshotStore

    store = SnapshotStore(os.path.join(disk.path, "data"))
    writer = store.writer("0000-0000-0000-0001", "two-streams", store.next_snapshot_id(
        "0000-0000-0000-0001"))
    writer.add("sum", 0, [(1, "x" * 100)])  # buffered, not yet on the disk
    writer.add("sum", 1, [(2, "y" * 100)])
    disk.fill()
    with pytest.raises(OSError, match="No space left on device"):
        writer.commit()
    writer.abort()
    assert not os.path.exists(writer.directory)


def test_operations_during_a_full_disk_end_in_states_the_user_can_act_on(disk):
    data_dir = os.path.join(disk.path, "data")
    with Member(data_dir) as m:
        events: list[str] = []
        m.add_listener(lambda _id, _name, event: events.append(event))
        job = m.new_job(pipeline(), eo())
        c = m.find_coordinator(job.id)
        wait_until(lambda: job.last_snapshot, what="a snapshot")
        fill_until_snapshots_fail(disk, c)

        # restart: the job record cannot be written, the job runs again all the same
        executions = c.execution_count
        job.restart()
        assert job.status == JobStatus.RUNNING and c.execution_count == executions + 1
        assert "No space left on device" in c.record_error
        assert any(e.startswith("job record write failed") for e in events)

        # suspend needs its terminal snapshot: refused with the reason, the job runs on
        with pytest.raises(SnapshotWriteError, match="No space left on device"):
            job.suspend()
        assert job.status == JobStatus.RUNNING

        # with space again: suspend; then resume on a full disk
        disk.free()
        job.suspend()
        assert job.status == JobStatus.SUSPENDED
        wait_until(lambda: recorded(data_dir, job.id)["status"] == "SUSPENDED",
                   what="the record to catch up")
        disk.fill()
        job.resume()
        assert job.status == JobStatus.RUNNING
        assert "No space left on device" in c.record_error
        assert recorded(data_dir, job.id)["status"] == "SUSPENDED", "written when possible"
        disk.free()
        # the record is on disk a moment before the coordinator clears its error: wait for both
        wait_until(lambda: recorded(data_dir, job.id)["status"] == "RUNNING"
                   and c.record_error is None,
                   what="the record to be written again once there is space")
        assert c.record_error is None

        # cancel on a full disk: the job ends (deleting its snapshots makes room for the record)
        fill_until_snapshots_fail(disk, c)
        job.cancel()
        assert job.status == JobStatus.FAILED
        with pytest.raises(JobCancelledError):
            job.join(1)
        wait_until(lambda: recorded(data_dir, job.id)["status"] == "FAILED", what="the record")
    with Member(data_dir) as m:  # the cancelled job is not resurrected
        assert m.job(job.id).status == JobStatus.FAILED


def test_a_job_cannot_be_submitted_to_a_full_disk_and_leaves_nothing(disk):
    data_dir = os.path.join(disk.path, "data")
    with Member(data_dir) as m:
        disk.fill()
        with pytest.raises(OSError, match="No space left on device") as err:
            m.new_job(pipeline(), eo())
        assert any("was not submitted" in note for note in err.value.__notes__)
        assert m.jobs() == []
        assert os.listdir(os.path.join(data_dir, "jobs")) == []
        disk.free()
        job = m.new_job(pipeline(), eo())
        assert job.status == JobStatus.RUNNING
        job.cancel()


def test_a_graceful_shutdown_on_a_full_disk_resumes_from_the_last_good_snapshot(disk):
    data_dir = os.path.join(disk.path, "data")
    m = Member(data_dir)
    job = m.new_job(pipeline(), eo())
    c = m.find_coordinator(job.id)
    wait_until(lambda: job.last_snapshot, what="a snapshot")
    fill_until_snapshots_fail(disk, c)
    last_good = m.snapshot_store.latest(job.id)
    m.shutdown()  # its terminal snapshot cannot be written
    assert job.status == JobStatus.NOT_RUNNING
    assert recorded(data_dir, job.id)["status"] == "RUNNING"
    disk.free()
    with Member(data_dir) as m:
        again = m.find_coordinator(job.id)
        assert again.status == JobStatus.RUNNING
        assert again.last_snapshot.snapshot_id == last_good.snapshot_id
        assert not again.last_snapshot.terminal
        again.cancel()
