"""Job states, as in Jet."""

from __future__ import annotations

from enum import Enum

__all__ = ["JobStatus"]


class JobStatus(str, Enum):
    NOT_RUNNING = "NOT_RUNNING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    SUSPENDED_EXPORTING_SNAPSHOT = "SUSPENDED_EXPORTING_SNAPSHOT"
    COMPLETING = "COMPLETING"
    FAILED = "FAILED"
    COMPLETED = "COMPLETED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.FAILED, JobStatus.COMPLETED)

    def __str__(self) -> str:
        return self.value
