"""Job: the user's handle on a submitted job."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .job_config import JobConfig
from .job_status import JobStatus

if TYPE_CHECKING:  # pragma: no cover
    from .job_coordinator import JobCoordinator

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
        """Stops the job; it ends FAILED with JobCancelledError."""
        self._c.cancel()

    def metrics(self) -> dict[str, dict[str, int]]:
        return self._c.metrics()

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, name={self.name!r}, status={self.status.value})"
