"""Snapshots and the job lifecycle on one member: suspend, resume, restart, export, restore
into a changed job or another parallelism, damaged snapshots and bad requests."""

from __future__ import annotations

import logging
import os

import pytest

from jetwake import (
    JobConfig, JobStateError, JobStatus, Member, Pipeline, SnapshotNotFoundError, Sinks,
)
from jetwake.engine.core.errors import SnapshotError
from support.snapshot_fixtures import counting_source, expected_sums, running_sum_pipeline
from support.waiting import wait_until

LIMIT = 20_000


def eo(name: str = "sums", **kw) -> JobConfig:
    return JobConfig(name=name, processing_guarantee="exactly_once", snapshot_interval_ms=50,
                     **kw)


def wait_for_snapshot(job, after: int = -1) -> None:
    wait_until(lambda: job.last_snapshot is not None and job.last_snapshot.snapshot_id > after)


def test_job_takes_snapshots_every_interval():
    with Member() as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        wait_for_snapshot(job)
        first = job.last_snapshot.snapshot_id
        wait_for_snapshot(job, first + 2)
        assert job.status == JobStatus.RUNNING
        job.cancel()


def test_suspend_then_resume_continues_with_exact_state():
    with Member() as m:
        job = m.new_job(running_sum_pipeline(LIMIT), eo())
        wait_for_snapshot(job)
        job.suspend()
        assert job.status == JobStatus.SUSPENDED
        job.resume()
        assert job.status == JobStatus.RUNNING
        job.join(60)
        assert dict(m.get_map("sums").items()) == expected_sums(LIMIT)


def test_restart_restores_the_last_snapshot_and_loses_nothing():
    with Member() as m:
        job = m.new_job(running_sum_pipeline(LIMIT), eo())
        wait_for_snapshot(job)
        job.restart()
        job.join(60)
        assert job.status == JobStatus.COMPLETED
        assert dict(m.get_map("sums").items()) == expected_sums(LIMIT)


def test_restore_into_a_different_parallelism_routes_state_by_key_partition(tmp_path):
    with Member(tmp_path, local_parallelism=1) as m:
        job = m.new_job(running_sum_pipeline(LIMIT), eo())
        wait_for_snapshot(job)
        job.cancel_and_export_snapshot("p1")
    with Member(tmp_path, local_parallelism=3) as m:
        job = m.new_job(running_sum_pipeline(LIMIT), eo(
            "sums-3", initial_snapshot_name="p1"))
        job.join(60)
        assert dict(m.get_map("sums").items()) == expected_sums(LIMIT)


def test_changed_job_starts_from_an_exported_snapshot_when_stateful_stage_names_match():
    with Member() as m:
        job = m.new_job(running_sum_pipeline(LIMIT), eo())
        wait_for_snapshot(job)
        job.cancel_and_export_snapshot("v1")
        assert job.status == JobStatus.FAILED
        # v2 adds a stateless stage; the stateful one keeps its name
        v2 = running_sum_pipeline(LIMIT, extra_map=lambda e: (e[0], e[1]))
        m.new_job(v2, eo("sums-v2", initial_snapshot_name="v1")).join(60)
        assert dict(m.get_map("sums").items()) == expected_sums(LIMIT)


def test_restore_into_a_job_whose_stateful_stage_was_renamed_fails_with_its_name():
    with Member() as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        wait_for_snapshot(job)
        job.export_snapshot("old")
        job.cancel()
        renamed = running_sum_pipeline(None, stage_name="renamed-sum")
        with pytest.raises(SnapshotError, match="running-sum"):
            m.new_job(renamed, eo("sums-renamed", initial_snapshot_name="old"))
        assert [s.name for s in m.snapshots()] == ["old"]  # a failed start deletes nothing


def test_unknown_initial_snapshot_name_is_a_clear_error():
    with Member() as m:
        with pytest.raises(SnapshotNotFoundError, match="no exported snapshot named 'nope'"):
            m.new_job(running_sum_pipeline(10), eo(initial_snapshot_name="nope"))


def test_cancel_deletes_automatic_snapshots_but_keeps_named_exports(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        wait_for_snapshot(job)
        job.export_snapshot("keep-me")
        job.cancel()
        with pytest.raises(Exception):
            job.join(10)
        assert m.snapshot_store.committed(job.id) == []
        assert [s.name for s in m.snapshots()] == ["keep-me"]
        m.delete_snapshot("keep-me")
        assert m.snapshots() == []
        with pytest.raises(SnapshotNotFoundError):
            m.delete_snapshot("keep-me")


def test_snapshot_ids_are_never_reused_across_member_restarts(tmp_path):
    with Member(tmp_path) as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        wait_for_snapshot(job, 2)
        before = job.last_snapshot.snapshot_id
    # shutdown suspended the job with a terminal snapshot; the next member resumes it
    with Member(tmp_path) as m:
        job = m.get_job("sums")
        assert job.status == JobStatus.RUNNING
        wait_for_snapshot(job, before)
        assert job.last_snapshot.snapshot_id > before
        job.cancel()


def test_damaged_latest_snapshot_falls_back_to_the_previous_one_with_a_warning(tmp_path, caplog):
    with Member(tmp_path) as m:
        job = m.new_job(running_sum_pipeline(LIMIT, pause=0.002), eo())
        wait_for_snapshot(job, 1)
        job.suspend()
        latest, previous = m.snapshot_store.committed(job.id)[:2]
        vertex = next(v for v in latest.files if v == "running-sum")
        proc = next(iter(latest.files[vertex]))
        path = os.path.join(tmp_path, "jobs", job.id, "snapshots", str(latest.snapshot_id),
                            vertex, f"{proc}.bin")
        with open(path, "r+b") as f:
            f.write(b"\xff\xff\xff")
        with caplog.at_level(logging.WARNING, logger="jetwake.job"):
            job.resume()
        assert f"snapshot {latest.snapshot_id} is damaged" in caplog.text
        assert "falling back to the previous good snapshot" in caplog.text
        assert job.last_snapshot.snapshot_id >= previous.snapshot_id
        job.join(60)
        assert dict(m.get_map("sums").items()) == expected_sums(LIMIT)


def test_operations_in_the_wrong_state_are_refused_with_the_state_named():
    with Member() as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        with pytest.raises(JobStateError, match="RUNNING, not SUSPENDED"):
            job.resume()
        job.cancel()
        with pytest.raises(Exception):
            job.join(10)
        with pytest.raises(JobStateError, match="FAILED"):
            job.suspend()


def test_export_of_a_job_without_guarantee_explains_how_to_get_one():
    with Member() as m:
        job = m.new_job(running_sum_pipeline(None), JobConfig(name="plain"))
        with pytest.raises(JobStateError, match="at_least_once"):
            job.export_snapshot("x")
        job.cancel()


def test_get_job_and_jobs_list_every_job_by_name_and_id():
    with Member() as m:
        a = m.new_job(running_sum_pipeline(100), eo("a"))
        b = m.new_job(running_sum_pipeline(100), eo("b"))
        a.join(30)
        b.join(30)
        assert m.get_job("a").id == a.id and m.get_job(b.id).name == "b"
        assert [j.name for j in m.jobs()] == ["a", "b"]
        assert m.get_job("missing") is None


def test_suspend_on_failure_keeps_the_job_resumable():
    calls = {"n": 0}

    def flaky(e):
        calls["n"] += 1
        if calls["n"] == 3000:
            raise RuntimeError("transient")
        return e

    with Member() as m:
        job = m.new_job(running_sum_pipeline(LIMIT, extra_map=flaky), eo(
            suspend_on_failure=True))
        wait_until(lambda: job.status == JobStatus.SUSPENDED)
        assert "transient" in job.failure
        job.resume()
        job.join(60)
        assert dict(m.get_map("sums").items()) == expected_sums(LIMIT)


def test_a_completed_source_is_not_replayed_after_a_restore():
    p = Pipeline()
    p.read_from(counting_source(500, name="short", per_call=500)).write_to(Sinks.list("short"))
    p.read_from(counting_source(None, name="endless")).write_to(Sinks.list("endless"))
    with Member() as m:
        job = m.new_job(p, eo())
        wait_until(lambda: len(m.get_list("short")) == 500)
        wait_for_snapshot(job, job.last_snapshot.snapshot_id if job.last_snapshot else -1)
        job.restart()
        wait_for_snapshot(job, job.last_snapshot.snapshot_id)
        assert sorted(m.get_list("short")) == list(range(500))
        job.cancel()


def test_cancel_returns_once_the_job_has_stopped():
    with Member() as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        job.cancel()
        assert job.status == JobStatus.FAILED
        with pytest.raises(Exception, match="cancelled"):
            job.join(1)


def test_restart_returns_once_the_new_execution_runs():
    with Member() as m:
        job = m.new_job(running_sum_pipeline(None), eo())
        wait_for_snapshot(job)
        job.restart()
        assert job.status == JobStatus.RUNNING
        job.cancel()
