"""What a job's coordinator drives: an execution and its snapshots' two phases (Jet's
MasterJobContext and MasterSnapshotContext seams).

Every execution, on a member alone or on a cluster, is a
:class:`~jetwake.engine.jobs.distributed_execution.DistributedExecution` and its snapshots a
``DistributedSnapshot``; the job's lifecycle and its snapshot driver know them only by these
Protocols.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol

from jetwake.engine.execution.execution_metrics import Counts
from jetwake.snapshot.store.snapshot_store import CommitRecord

__all__ = ["ExecutionDriver", "SnapshotPhases", "SnapshotCommit"]


class ExecutionDriver(Protocol):
    """One execution of a job, on one member or on every member of a cluster."""

    cancelled: bool
    error: BaseException | None
    error_tasklet: str | None
    finished: threading.Event  # set once every processor everywhere has ended

    @property
    def tasklets(self) -> list:
        """This member's processors of the execution."""

    def cancel(self) -> None:
        """Stops every processor; the end is reported as usual."""

    def fail(self, tasklet: Any, error: BaseException) -> None:
        """Fails the execution with ``error`` (raised in or on behalf of ``tasklet``)."""

    def metrics(self) -> Counts:
        """What the execution's processors counted, on every member it runs on."""


class SnapshotCommit(Protocol):
    """The coordinator's writer of one snapshot: the commit point, or its roll-back."""

    def commit(self) -> CommitRecord:
        """Writes the commit record: from here on the snapshot is restorable."""

    def abort(self) -> None:
        """Drops what was written of a snapshot that will not commit."""


class SnapshotPhases(Protocol):
    """The two phases of a snapshot of a running execution, on every member it runs on."""

    def request(self, snapshot_id: int, writer: Any, terminal: bool) -> None:
        """Starts phase 1: sources save their position and emit the barrier."""

    def wait_phase1(self, snapshot_id: int, timeout: float,
                    cancelled: Callable[[], bool]) -> bool:
        """True when every processor saved its state in time."""

    def start_phase2(self, snapshot_id: int, success: bool) -> None:
        """Tells every processor to commit (or roll back) the snapshot."""

    def wait_phase2(self, snapshot_id: int, timeout: float,
                    cancelled: Callable[[], bool]) -> bool:
        """True when every processor finished phase 2 in time."""
