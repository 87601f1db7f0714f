"""Exceptions of the public API."""

from __future__ import annotations

__all__ = ["JetwakeError", "JobNotFoundError", "JobCancelledError", "JobStateError",
           "SnapshotNotFoundError", "RestartableError", "SnapshotError", "FallbackRefusedError",
           "SnapshotWriteError"]


class JetwakeError(Exception):
    """Base of jetwake's own errors."""


class JobNotFoundError(JetwakeError, KeyError):
    """No job with that name or id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "job not found"


class JobCancelledError(JetwakeError):
    """The job was cancelled; ``join()`` raises it."""


class JobStateError(JetwakeError):
    """The operation is not possible in the job's current state."""


class SnapshotNotFoundError(JetwakeError, KeyError):
    """No exported snapshot with that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "snapshot not found"


class RestartableError(JetwakeError):
    """A failure after which the job restarts from its last snapshot instead of failing
    (a fenced producer, a snapshot that could not complete)."""


class SnapshotError(JetwakeError):
    """A snapshot could not be read, matched to the job, or written; the message says why."""


class FallbackRefusedError(SnapshotError):
    """The newest snapshot is damaged, and restoring an older one could make a transactional
    sink write records twice; the job is suspended until the user accepts that."""


class SnapshotWriteError(SnapshotError):
    """A snapshot could not be written (a full disk, say); that snapshot was rolled back, the
    previous one stays valid and the job runs on."""
