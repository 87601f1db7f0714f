"""What happens when a snapshot goes wrong: nothing counts as success that was not, nothing
ends silently, and nothing falls back to an older snapshot in a way that breaks exactly-once."""

from __future__ import annotations

import os

import pytest

from jetwake import (
    FallbackRefusedError, JobConfig, JobStatus, Member, Pipeline, Processor, RestartableError,
    Sinks,
)
from jetwake.engine.jobs import snapshot_driver
from support.snapshot_fixtures import counting_source
from support.waiting import wait_until


class CommitsWhenAllowed(Processor):
    """A sink whose phase 2 does not finish until ``allowed`` is True."""

    allowed = False

    def process(self, ordinal, inbox) -> None:
        inbox.clear()

    def snapshot_commit_finish(self, success: bool) -> bool:
        return CommitsWhenAllowed.allowed


def _stuck_phase2_pipeline() -> Pipeline:
    from jetwake import ProcessorMetaSupplier, Sink
    p = Pipeline()
    p.read_from(counting_source(None, per_call=10, pause=0.001)).write_to(
        Sink("stuck-phase2", ProcessorMetaSupplier.of(CommitsWhenAllowed)))
    return p


def test_a_phase2_that_times_out_is_not_a_success(monkeypatch):
    monkeypatch.setattr(snapshot_driver, "PHASE_TIMEOUT_S", 0.3)
    CommitsWhenAllowed.allowed = False
    with Member() as m:
        job = m.new_job(_stuck_phase2_pipeline(), JobConfig(
            processing_guarantee="exactly_once", snapshot_interval_ms=3_600_000))
        with pytest.raises(RestartableError, match="phase 2 did not complete"):
            job.take_snapshot()
        CommitsWhenAllowed.allowed = True
        job.cancel()


def test_a_phase2_timeout_in_the_periodic_snapshots_restarts_the_job(monkeypatch):
    monkeypatch.setattr(snapshot_driver, "PHASE_TIMEOUT_S", 0.3)
    CommitsWhenAllowed.allowed = False
    with Member() as m:
        job = m.new_job(_stuck_phase2_pipeline(), JobConfig(
            processing_guarantee="exactly_once", snapshot_interval_ms=50))
        coordinator = m.find_coordinator(job.id)
        wait_until(lambda: coordinator.restart_count >= 1)
        CommitsWhenAllowed.allowed = True
        wait_until(lambda: job.status == JobStatus.RUNNING)
        job.cancel()


def test_an_unexpected_error_in_the_snapshot_thread_fails_the_job_visibly(monkeypatch):
    with Member() as m:
        def broken_prune(job_id: str) -> None:
            raise RuntimeError("retention exploded")
        monkeypatch.setattr(m.snapshot_store, "prune", broken_prune)
        job = m.new_job(_stuck_phase2_pipeline(), JobConfig(
            processing_guarantee="at_least_once", snapshot_interval_ms=20))
        CommitsWhenAllowed.allowed = True
        wait_until(lambda: job.status == JobStatus.FAILED)
        assert "retention exploded" in job.failure


# --- falling back past a damaged snapshot ------------------------------------------------

LIMIT = 200_000


def _list_job(m: Member, guarantee: str):
    p = Pipeline()
    p.read_from(counting_source(LIMIT, per_call=20, pause=0.001)).write_to(Sinks.list("out"))
    return m.new_job(p, JobConfig(name="to-list", processing_guarantee=guarantee,
                                  snapshot_interval_ms=3_600_000))


def _damage_latest(m: Member, job) -> int:
    latest = m.snapshot_store.committed(job.id)[0]
    vertex = next(v for v in latest.files if latest.files[v])
    proc = next(iter(latest.files[vertex]))
    path = os.path.join(m.data_dir, "jobs", job.id, "snapshots", str(latest.snapshot_id),
                        vertex, f"{proc}.bin")
    with open(path, "r+b") as f:
        f.write(b"\xff\xff\xff\xff")
    return latest.snapshot_id


def test_exactly_once_job_with_a_transactional_sink_refuses_to_fall_back_silently(tmp_path):
    with Member(tmp_path) as m:
        job = _list_job(m, "exactly_once")
        job.take_snapshot()
        job.take_snapshot()
        job.suspend()
        damaged = _damage_latest(m, job)
        with pytest.raises(FallbackRefusedError) as ei:
            job.resume()
        assert f"snapshot {damaged}" in str(ei.value)
        assert "accept_at_least_once_on_fallback=True" in str(ei.value)
        assert job.status == JobStatus.SUSPENDED
        assert "FallbackRefusedError" in job.failure
        job.resume(accept_at_least_once_on_fallback=True)
        assert job.status == JobStatus.RUNNING
        job.cancel()


def test_the_job_config_can_accept_the_fallback_for_every_restore(tmp_path):
    with Member(tmp_path) as m:
        p = Pipeline()
        p.read_from(counting_source(LIMIT, per_call=20, pause=0.001)).write_to(Sinks.list("o"))
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                     snapshot_interval_ms=3_600_000,
                                     accept_at_least_once_on_fallback=True))
        job.take_snapshot()
        job.take_snapshot()
        job.suspend()
        _damage_latest(m, job)
        job.resume()
        assert job.status == JobStatus.RUNNING
        job.cancel()


def test_at_least_once_job_falls_back_past_a_damaged_snapshot(tmp_path):
    with Member(tmp_path) as m:
        job = _list_job(m, "at_least_once")
        job.take_snapshot()
        job.take_snapshot()
        job.suspend()
        _damage_latest(m, job)
        job.resume()
        assert job.status == JobStatus.RUNNING
        job.cancel()


def test_a_job_config_flag_must_be_a_bool():
    with pytest.raises(ValueError, match="accept_at_least_once_on_fallback"):
        JobConfig(accept_at_least_once_on_fallback="yes")


# --- a restart while a snapshot of the failed execution is still committing ---------------

class FailsWhenTold(Processor):
    """A sink that fails its execution (restartable) while ``fail`` is set."""

    fail = False

    def process(self, ordinal, inbox) -> None:
        inbox.clear()
        if FailsWhenTold.fail:
            raise RestartableError("the execution fails now (test)")


def test_a_restart_waits_for_the_snapshot_still_committing_and_restores_from_it(
        tmp_path, monkeypatch, caplog):
    # the execution fails between a snapshot's phase 1 and its commit record: the restart must
    # not pick its restore point until that snapshot has committed, or it restores the one
    # before while the committed one's phase 2 may already have had sinks write its output
    import logging
    import threading

    from jetwake import ProcessorMetaSupplier, Sink
    from support.waiting import stays_true

    caplog.set_level(logging.INFO, logger="jetwake.job")
    FailsWhenTold.fail = False
    p = Pipeline()
    p.read_from(counting_source(None, per_call=10, pause=0.001)).write_to(
        Sink("fails-when-told", ProcessorMetaSupplier.of(FailsWhenTold)))
    with Member(tmp_path) as m:
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                     snapshot_interval_ms=3_600_000))
        wait_until(lambda: job.status == JobStatus.RUNNING, what="the job running")
        first = job.take_snapshot().snapshot_id
        store = m.snapshot_store
        committing, release = threading.Event(), threading.Event()
        read_while_committing: list[str] = []
        commit_record, committed = store.commit_record, store.committed

        def slow_commit_record(rec):
            committing.set()
            release.wait(60)
            return commit_record(rec)

        def watched_committed(job_id):
            if committing.is_set() and not release.is_set():
                read_while_committing.append(job_id)
            return committed(job_id)
        monkeypatch.setattr(store, "commit_record", slow_commit_record)
        monkeypatch.setattr(store, "committed", watched_committed)
        second: list = []

        def take() -> None:
            try:
                second.append(job.take_snapshot().snapshot_id)
            except RestartableError as e:  # committed, its phase 2 cut short by the failure
                second.append(e)
        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        wait_until(committing.is_set, what="the second snapshot's phase 1 done")
        FailsWhenTold.fail = True
        coordinator = m.find_coordinator(job.id)
        wait_until(lambda: coordinator.restart_count >= 1, what="the restart after the failure")
        FailsWhenTold.fail = False
        stays_true(lambda: not read_while_committing, seconds=1.0,
                   what="no restore point chosen while the snapshot commits")
        release.set()
        taker.join(60)
        wait_until(lambda: job.status == JobStatus.RUNNING and "restored from snapshot"
                   in caplog.text, what="the job running again, restored")
        restored = [r.getMessage() for r in caplog.records
                    if "restored from snapshot" in r.getMessage()]
        assert restored[-1].endswith(f"restored from snapshot {first + 1}"), restored
        job.cancel()
