"""What a job's coordinator, its executions and its processors use of their member (Jet's
``NodeEngine``): named by a Protocol, so the job layer never depends on the member's class or
on whether the member is alone or in a cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.data.named_list import NamedList
    from jetwake.engine.execution.execution_service import ExecutionService
    from jetwake.engine.jobs.execution_messages import ExecutionMessage
    from jetwake.engine.jobs.execution_participant import ExecutionParticipant
    from jetwake.engine.jobs.job_coordinator import JobCoordinator
    from jetwake.engine.jobs.job_records import JobRecords, JobRecordStore
    from jetwake.engine.jobs.job_service import JobService
    from jetwake.snapshot.store.snapshot_store import CommitRecord, SnapshotStore

__all__ = ["MemberContext", "PlacedMember"]


class MemberContext(Protocol):
    """A member, as its jobs see it."""

    member_id: str
    data_dir: str | None
    default_local_parallelism: int
    snapshot_store: "SnapshotStore"
    job_records: "JobRecords"
    execution_service: "ExecutionService | None"
    participant: "ExecutionParticipant"

    def emit_event(self, job: "JobCoordinator", event: str) -> None:
        """Records a job lifecycle event (logged, and told to the listeners)."""

    def retry_record_later(self, coordinator: "JobCoordinator") -> None:
        """Writes a job record again later (its write failed)."""

    def find_coordinator(self, name_or_id: str) -> "JobCoordinator | None":
        """The coordinator of a job of this member."""

    def get_map(self, name: str) -> Any:
        """The named map (the cluster's, in a cluster)."""

    def get_list(self, name: str) -> "NamedList | Any":
        """The named list (the cluster's, in a cluster)."""

    def sync_maps(self) -> None:
        """Makes every map change so far durable (before a snapshot's commit)."""

    def execution_members(self) -> list[tuple[str, str]]:
        """The members an execution starting now runs on: (id, peer address)."""

    def call_execution(self, member_id: str, message: "ExecutionMessage",
                       timeout: float) -> "ExecutionMessage | None":
        """Delivers an execution's request to a member's participant; its reply."""

    def publish_commit_record(self, rec: "CommitRecord") -> None:
        """Makes a snapshot's commit record readable by every member (the commit point)."""

    def note_unreachable(self, member_id: str) -> None:
        """A member of an execution did not answer."""


class PlacedMember(MemberContext, Protocol):
    """A member, as its place sees it (a cluster's place resumes the jobs when it becomes the
    coordinator, hands forwarded requests to the member's client service, ...)."""

    job_service: "JobService"
    forwarded_request_handler: Any

    @property
    def shutting_down(self) -> bool:
        """Whether the member is shutting down (or has)."""

    def coordinators(self) -> "list[JobCoordinator]":
        """Every job's coordinator, oldest first."""

    def recover_jobs(self) -> None:
        """Resumes the jobs whose records say they were running."""
