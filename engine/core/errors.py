"""Exceptions of the public API."""

from __future__ import annotations

import errno
import sys

__all__ = ["PipelineError", "JetwakeError", "JobNotFoundError", "JobCancelledError",
           "JobStateError", "SnapshotNotFoundError", "RestartableError", "RemoteCallError",
           "SnapshotError", "FallbackRefusedError", "SnapshotWriteError",
           "DataDirectoryLockedError", "is_restartable_cause", "StateDropRefusedError",
           "StateMigrationError"]


class JetwakeError(Exception):
    """Base of jetwake's own errors."""

    restartable: bool  # set True on one whose cause may pass (see is_restartable_cause)


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


class RemoteCallError(JetwakeError):
    """A call to another member failed there: ``remote_type`` names the type of the error it
    raised (the error itself stays on that member)."""

    def __init__(self, remote_type: str, message: str, restartable: bool = False) -> None:
        super().__init__(message)
        self.remote_type = remote_type
        self.message = message
        self.restartable = restartable

    def raised(self, cls: type[BaseException]) -> bool:
        """Whether the remote error was a ``cls`` (by its name: the class is not sent)."""
        return self.remote_type == cls.__name__


class SnapshotError(JetwakeError):
    """A snapshot could not be read, matched to the job, or written; the message says why."""


class FallbackRefusedError(SnapshotError):
    """The newest snapshot is damaged, and restoring an older one could make a transactional
    sink write records twice; the job is suspended until the user accepts that."""


class SnapshotWriteError(SnapshotError):
    """A snapshot could not be written (a full disk, say); that snapshot was rolled back, the
    previous one stays valid and the job runs on."""


class DataDirectoryLockedError(JetwakeError):
    """Another member holds the data directory; the message names it (pid, host, start time)
    and the fix. Two members on one directory would run the same jobs twice."""


class StateDropRefusedError(SnapshotError):
    """A job started from a snapshot would drop saved state (a stateful stage of the snapshot
    has no counterpart of the same name and kind in the new pipeline); the message lists the
    stages and the fixes (keep the stage's name with set_name, or allow the drop)."""


class StateMigrationError(SnapshotError):
    """A stage's ``migrate`` function failed on a saved state while the job restored it; the
    message names the stage, the key and the cause."""


# OSErrors about a path the user or operator chose: trying again does not help until someone
# changes the configuration or the file system, so they fail the job instead of retrying
_PATH_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
                PermissionError)
_PERMANENT_ERRNOS = {errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP, errno.EINVAL}

# Kafka error codes that describe a broker or coordinator that is away or busy for now
_KAFKA_TRANSIENT = {
    "_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_MSG_TIMED_OUT", "_TIMED_OUT_QUEUE",
    "_RESOLVE", "_WAIT_COORD", "NETWORK_EXCEPTION", "REQUEST_TIMED_OUT", "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS", "NOT_LEADER_FOR_PARTITION",
    "LEADER_NOT_AVAILABLE", "BROKER_NOT_AVAILABLE", "CONCURRENT_TRANSACTIONS",
    "NOT_ENOUGH_REPLICAS", "KAFKA_STORAGE_ERROR",
}


def _kafka_verdict(error: BaseException) -> bool | None:
    """True/False for a confluent-kafka error, None for anything else. The module is only
    looked up when already imported: an error cannot come from a library nobody loaded."""
    kafka = sys.modules.get("confluent_kafka")
    if kafka is None:
        return None
    err = None
    if isinstance(error, kafka.KafkaException) and error.args \
            and isinstance(error.args[0], kafka.KafkaError):
        err = error.args[0]
    elif isinstance(error, kafka.KafkaError):  # pragma: no cover - not an exception today
        err = error
    if err is None:
        return None
    if err.fatal():
        return False
    if err.retriable():
        return True
    codes = {getattr(kafka.KafkaError, name, None) for name in _KAFKA_TRANSIENT}
    return err.code() in codes


def _own_verdict(error: BaseException) -> bool | None:
    """Whether ``error`` by its own type says restartable (True), permanent (False), or
    nothing (None: its cause decides)."""
    if isinstance(error, RestartableError):
        return True
    if isinstance(error, (FallbackRefusedError, JobStateError, JobCancelledError,
                          SnapshotNotFoundError, JobNotFoundError, DataDirectoryLockedError)):
        return False
    flag = getattr(error, "restartable", None)
    if isinstance(flag, bool):  # an error may say so itself
        return flag
    kafka = _kafka_verdict(error)
    if kafka is not None:
        return kafka
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    if isinstance(error, _PATH_ERRORS):
        return False
    if isinstance(error, OSError):
        return error.errno not in _PERMANENT_ERRNOS
    return None


def is_restartable_cause(error: BaseException) -> bool:
    """Whether a job that failed to start (or restart) with ``error`` may succeed when tried
    again later, so the engine retries it with back-off instead of failing the job.

    Restartable: :class:`RestartableError`; connection and timeout errors; other OSErrors (a
    full disk, an I/O error) except those about a configured path (missing, not permitted,
    read-only); Kafka errors that are retriable and not fatal (a broker that is away, a
    coordinator that moved); an error with ``restartable = True``. An error that says nothing
    by its type is judged by its cause (``raise X from cause``), so a wrapper keeps the verdict
    of what it wraps. Everything else (user code, configuration, a damaged snapshot) is
    permanent.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        verdict = _own_verdict(current)
        if verdict is not None:
            return verdict
        # only an explicit cause: an error raised while another was being handled (its
        # __context__) is often unrelated to it
        current = current.__cause__
    return False


class PipelineError(ValueError):
    """The pipeline is wired wrongly; the message names the stage."""
