"""What a member does with its data directory: maps and jobs outlive the process, damage is
reported clearly, and a failed start deletes nothing."""

from __future__ import annotations

import json
import os

import pytest

from jetwake import JobConfig, JobNotFoundError, JobStatus, Member
from jetwake.engine.core.errors import SnapshotError
from jetwake.engine.jobs.job_records import JobRecordError
from support.snapshot_fixtures import running_sum_pipeline
from support.waiting import wait_until


def eo(name: str = "sums") -> JobConfig:
    return JobConfig(name=name, processing_guarantee="exactly_once", snapshot_interval_ms=50)


def wait_for_snapshot(job) -> None:
    wait_until(lambda: job.last_snapshot, timeout=20, what="a snapshot")


def test_maps_keep_their_contents_across_members_on_the_same_directory(tmp_path):
    with Member(tmp_path) as m:
        m.get_map("m").put_all({"a": 1, "b": (2, 3)})
    with Member(tmp_path) as m:
        assert dict(m.get_map("m").items()) == {"a": 1, "b": (2, 3)}


def test_a_member_without_data_directory_keeps_nothing(tmp_path):
    with Member() as m:
        m.get_map("m").put("a", 1)
    with Member() as m:
        assert len(m.get_map("m")) == 0


def test_finished_jobs_are_listed_again_after_a_restart(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(running_sum_pipeline(100), eo())
        job.join(30)
    with Member(tmp_path) as m:
        again = m.get_job("sums")
        assert again.id == job.id and again.status == JobStatus.COMPLETED


def test_unknown_job_is_a_clear_error(tmp_path):
    with Member(tmp_path) as m:
        with pytest.raises(JobNotFoundError, match="no job with name or id 'ghost'"):
            m.job("ghost")


def test_a_damaged_job_record_names_the_file_and_the_fix(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(running_sum_pipeline(100), eo())
        job.join(30)
    record = os.path.join(tmp_path, "jobs", job.id, "RECORD")
    with open(record, "w") as f:
        f.write("{not json")
    with pytest.raises(JobRecordError) as err:
        Member(tmp_path)
    assert record in str(err.value) and "move the directory" in str(err.value)
    assert os.path.exists(record), "a damaged record must not be deleted"


def test_a_snapshot_written_by_another_job_is_refused_and_kept(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        wait_for_snapshot(job)
        job.suspend()
        rec = m.snapshot_store.latest(job.id)
        commit = os.path.join(tmp_path, "jobs", job.id, "snapshots", str(rec.snapshot_id),
                              "COMMIT")
        with open(commit) as f:
            data = json.load(f)
        data["job_id"] = "0000-0000-0000-0000"
        with open(commit, "w") as f:
            json.dump(data, f)
        with pytest.raises(SnapshotError, match="written by job 0000-0000-0000-0000"):
            job.resume()
        assert os.path.exists(commit)
        assert m.snapshot_store.committed(job.id), "no snapshot is deleted by a failed start"


def test_a_job_running_when_its_member_stopped_resumes_with_its_snapshot(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        wait_for_snapshot(job)
        job_id = job.id
    # a graceful shutdown suspended it with a terminal snapshot
    with Member(tmp_path) as m:
        job = m.get_job(job_id)
        assert job.status == JobStatus.RUNNING
        job.cancel()


def rocksdb_rolling(limit: int | None):
    from jetwake import AggregateOperations, Pipeline, Sinks
    from support.snapshot_fixtures import counting_source

    p = Pipeline()
    (p.read_from(counting_source(limit))
      .group_by(lambda x: x % 10)
      .rolling_aggregate(AggregateOperations.counting())
      .write_to(Sinks.map("counts")))
    return p


def rocksdb_config(name: str) -> JobConfig:
    return JobConfig(name=name, processing_guarantee="exactly_once", snapshot_interval_ms=50,
                     state_backend="rocksdb")


def test_a_completed_jobs_rocksdb_state_is_removed(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(rocksdb_rolling(2000), rocksdb_config("done"))
        job.join(60)
        assert dict(m.get_map("counts").items()) == {k: 200 for k in range(10)}
        assert not os.path.exists(tmp_path / "state" / job.id)


def test_a_cancelled_jobs_rocksdb_state_is_removed(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(rocksdb_rolling(None), rocksdb_config("endless"))
        wait_for_snapshot(job)
        assert os.listdir(tmp_path / "state" / job.id), "the running job keeps state there"
        job.cancel()
        assert not os.path.exists(tmp_path / "state" / job.id)


def test_a_restarted_jobs_previous_rocksdb_state_is_removed(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(rocksdb_rolling(None), rocksdb_config("endless"))
        wait_for_snapshot(job)
        before = set(os.listdir(tmp_path / "state" / job.id))
        job.restart()
        after = set(os.listdir(tmp_path / "state" / job.id))
        assert len(after) == 1 and not after & before
        job.cancel()
