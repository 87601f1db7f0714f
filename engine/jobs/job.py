"""Job: the user's handle on a submitted job."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.jobs.state_view import StateView, query_state

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.jobs.job_coordinator import JobCoordinator

__all__ = ["Job"]


class Job:
    """A submitted job: its identity, status and the operations on it."""

    def __init__(self, coordinator: "JobCoordinator") -> None:
        self._c = coordinator

    @property
    def id(self) -> str:
        return self._c.job_id

    @property
    def name(self) -> str:
        return self._c.name

    @property
    def config(self) -> JobConfig:
        return self._c.config

    @property
    def status(self) -> JobStatus:
        return self._c.status

    def get_status(self) -> JobStatus:
        return self._c.status

    @property
    def submission_time(self) -> float:
        return self._c.submission_time

    def join(self, timeout: float | None = None) -> None:
        """Waits until the job ends: returns if COMPLETED, raises the job's error if FAILED
        (the user function's own exception, with its traceback), TimeoutError on timeout."""
        self._c.join(timeout)

    def cancel(self) -> None:
        """Stops the job and returns once it has stopped: it ends FAILED, and ``join()``
        raises JobCancelledError. Its automatic snapshots are deleted; named exports stay."""
        self._c.cancel()
        self._c.wait_ended(30)

    def suspend(self) -> None:
        """Takes a terminal snapshot (if the job has a guarantee) and stops; see resume()."""
        self._c.suspend()
        self._c.wait_for_status({JobStatus.SUSPENDED, JobStatus.FAILED,
                                 JobStatus.COMPLETED}, 60)

    def resume(self, accept_at_least_once_on_fallback: bool = False) -> None:
        """Starts a suspended job again from its last snapshot. ``accept_at_least_once_on_fallback``:
        when the job was suspended because its newest snapshot is damaged and an older one
        could make a transactional sink write records twice, accept that for this restore."""
        self._c.resume(accept_at_least_once_on_fallback)

    def restart(self) -> None:
        """Stops the running execution and starts a new one from the last snapshot; returns
        once the new one runs."""
        generation = self._c.execution_count
        self._c.restart()
        self._c.wait_for_execution(generation + 1, 60)

    def export_snapshot(self, name: str):
        """Takes a snapshot and keeps it under ``name`` until deleted; a new job can start
        from it with ``JobConfig(initial_snapshot_name=name)``."""
        return self._c.export_snapshot(name)

    def cancel_and_export_snapshot(self, name: str):
        """Takes a terminal snapshot, exports it as ``name`` and cancels the job."""
        rec = self._c.export_snapshot(name, cancel=True)
        self._c.wait_ended(60)
        return rec

    def take_snapshot(self):
        """Takes a snapshot now (it also happens every ``snapshot_interval_ms``)."""
        return self._c.take_snapshot()

    @property
    def failure(self) -> str | None:
        """Why the job failed or was suspended on failure, if it did."""
        return self._c.failure_text

    @property
    def last_snapshot(self):
        return self._c.last_snapshot

    def metrics(self) -> dict[str, dict[str, float]]:
        return self._c.metrics()

    def state(self, stage: str, consistency: str = "snapshot") -> StateView:
        """A view of the state of the stateful stage ``stage`` (its name): ``get(key)``,
        ``get_all(keys)``, ``items(limit=None, prefix=None)`` and ``count()``. With
        ``consistency="snapshot"`` (the default) it reads the last committed snapshot, a
        consistent cut across every key and member; with ``"latest"`` the live state of the
        processors that own the keys. See docs/state.md, "Reading a running job's state"."""
        c = self._c
        return StateView(lambda **args: query_state(c, **args), stage, consistency)

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, name={self.name!r}, status={self.status.value})"
