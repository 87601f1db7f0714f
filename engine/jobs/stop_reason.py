"""Why a job's current execution is being stopped: what its end means for the job."""

from __future__ import annotations

import enum

__all__ = ["StopReason"]


class StopReason(enum.Enum):
    """Why the current execution is being stopped (NONE: it is not)."""

    NONE = "none"
    CANCEL = "cancel"  # the job ends for good (FAILED with JobCancelledError)
    SUSPEND = "suspend"  # the job is SUSPENDED until resumed
    RESTART = "restart"  # a new execution starts from the last snapshot
    SHUTDOWN = "shutdown"  # the member is shutting down: the next start resumes the job
