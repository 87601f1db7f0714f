"""A job's snapshots go through one request queue: regular, terminal and exported snapshots
asked for together are taken one after the other, each caller gets its own snapshot's
outcome, and a request made when no execution runs is refused at once."""

from __future__ import annotations

import threading

import pytest

from jetwake import JobConfig, JobStateError, Member, Pipeline, Sinks
from support.snapshot_fixtures import counting_source


def _endless_job(m: Member):
    p = Pipeline()
    p.read_from(counting_source(None, per_call=20, pause=0.001)).write_to(Sinks.list("out"))
    return m.new_job(p, JobConfig(name="queued", processing_guarantee="exactly_once",
                                  snapshot_interval_ms=3_600_000))


def test_snapshots_asked_for_together_are_taken_one_after_the_other(tmp_path):
    with Member(tmp_path) as m:
        job = _endless_job(m)
        job.take_snapshot()  # the job runs and has snapshotted once
        outcomes: dict[str, object] = {}

        def ask(who: str) -> None:
            try:
                outcomes[who] = job.take_snapshot()
            except BaseException as e:  # noqa: BLE001 - the assertion shows it
                outcomes[who] = e
        callers = [threading.Thread(target=ask, args=(f"caller-{i}",)) for i in range(4)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(60)
        exported = job.export_snapshot("queued-export")

        ids = sorted(rec.snapshot_id for rec in outcomes.values())  # type: ignore[attr-defined]
        assert len(set(ids)) == 4, outcomes
        coordinator = m.find_coordinator(job.id)
        entries = coordinator.snapshot_history.entries()
        assert [e["outcome"] for e in entries] == ["committed"] * 6
        assert [e["id"] for e in entries] == sorted(e["id"] for e in entries)
        assert all(e["phase"] == "done" for e in entries)
        assert exported.name == "queued-export" and coordinator.snapshot_count == 6
        job.cancel()


def test_a_snapshot_asked_for_when_no_execution_runs_is_refused_at_once(tmp_path):
    with Member(tmp_path) as m:
        job = _endless_job(m)
        job.take_snapshot()
        job.suspend()
        with pytest.raises(JobStateError, match="suspended|no running execution"):
            job.take_snapshot()
        job.cancel()
