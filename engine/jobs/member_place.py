"""Where a member stands: alone, or in a cluster (Jet's cluster service, as one seam).

A member is composed of its services (the execution service, its maps, its jobs, its
execution participant) and of its *place*, which says what differs between a member alone and
one of a cluster: where job records and snapshots are kept, which maps are the named maps, who
coordinates the jobs, which members an execution runs on and how requests reach them. A member
alone is a cluster of one (:class:`Alone`); a cluster's place is in the cluster layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.jobs.execution_messages import (
    ExecutionEnded, ExecutionMessage, decode, decode_request,
)
from jetwake.engine.jobs.execution_participant import ExecutionParticipant

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.jobs.job_records import JobRecords, JobRecordStore
    from jetwake.engine.jobs.member_context import MemberContext, PlacedMember
    from jetwake.snapshot.store.snapshot_store import CommitRecord, SnapshotStore

__all__ = ["MemberPlace", "Alone", "LIGHT_PREFIX", "light_job_owner"]

# a light job's id: light-<member id>-<job id>, so any member knows where to ask about it
LIGHT_PREFIX = "light-"


def light_job_owner(job_ref: str) -> str | None:
    """The member coordinating the light job ``job_ref`` (its id names it); None for a job
    that is not light (or a name)."""
    if not job_ref.startswith(LIGHT_PREFIX):
        return None
    return job_ref[len(LIGHT_PREFIX):].rsplit("-", 4)[0]


class MemberPlace(Protocol):
    """What differs between a member alone and one of a cluster (see the module doc)."""

    member_id: str
    #: the cluster's name; None for a member alone
    cluster_name: str | None
    #: where a member's client service can be reached (set by the service)
    client_address: str | None

    def new_job_records(self, data_dir: str | None) -> "JobRecords":
        """Where the member's job records are kept."""

    def new_snapshot_store(self, data_dir: str | None) -> "SnapshotStore":
        """Where the member's snapshots are kept."""

    @property
    def recovers_jobs_at_start(self) -> bool:
        """Whether the member resumes its jobs' records when it starts (a cluster's
        coordinator does when it is elected)."""

    def join(self, member: "PlacedMember") -> ExecutionParticipant:
        """Starts the place's services once the member's are up; the member's participant."""

    def leave(self) -> None:
        """After the member's jobs stopped (or its start failed): stops the place's
        services."""

    def shared_map(self, name: str) -> Any | None:
        """The named map every member shares; None: the member's own."""

    def shared_list(self, name: str) -> Any | None:
        """The named list every member shares; None: the member's own."""

    def sync_shared_maps(self) -> None:
        """Makes the shared maps' changes durable."""

    @property
    def is_coordinator(self) -> bool:
        """Whether this member coordinates the jobs (a member alone always does)."""

    def require_coordinator(self, action: str) -> None:
        """Raises NotCoordinatorError unless this member may coordinate a new job now."""

    def await_coordination(self, timeout: float) -> None:
        """Waits until a member just elected coordinator has taken over."""

    def execution_members(self) -> list[tuple[str, str]]:
        """The members an execution starting now runs on: (id, peer address)."""

    def call_execution(self, member_id: str, message: ExecutionMessage,
                       timeout: float) -> ExecutionMessage | None:
        """Delivers an execution's request to a member's participant; its reply."""

    def publish_commit_record(self, rec: "CommitRecord") -> None:
        """Makes a snapshot's commit record readable by every member."""

    def note_unreachable(self, member_id: str) -> None:
        """A member of an execution did not answer."""

    def forward_request(self, frame: bytes, client: str, timeout: float,
                        target: str | None = None) -> bytes:
        """Hands a client's request to another member (the coordinator when None)."""

    def ask_other_members(self, frame: bytes, client: str,
                          timeout: float = 10.0) -> list[dict]:
        """Sends a client request to every other member; their decoded replies."""

    def cluster_info(self) -> dict:
        """The cluster: its name, coordinator, quorum and members."""

    def describe(self, data_dir: str | None, jobs: int) -> str:
        """The member, for its repr."""


class Alone:
    """The place of a member alone: its own data directory (or memory), the only member of
    its executions, called in-process through the encoding members of a cluster use."""

    member_id = "local"
    cluster_name: str | None = None

    def __init__(self) -> None:
        self.client_address: str | None = None
        self._member: "MemberContext | None" = None

    def new_job_records(self, data_dir: str | None) -> "JobRecordStore":
        from jetwake.engine.jobs.job_records import JobRecords, JobRecordStore
        return JobRecordStore(data_dir)

    def new_snapshot_store(self, data_dir: str | None) -> "SnapshotStore":
        from jetwake.snapshot.store.snapshot_store import SnapshotStore
        return SnapshotStore(data_dir)

    @property
    def recovers_jobs_at_start(self) -> bool:
        return True

    def join(self, member: "PlacedMember") -> ExecutionParticipant:
        self._member = member
        return ExecutionParticipant(member, self.member_id, None, self._report_end)

    def _report_end(self, coordinator: str, ended: ExecutionEnded,
                    cause: BaseException | None) -> None:
        member = self._member
        assert member is not None  # joined
        deliver_execution_end(member, decode(ExecutionEnded, ended.to_wire()), cause)

    def leave(self) -> None:
        """Nothing to stop: a member alone has no services of its place."""

    def shared_map(self, name: str) -> Any | None:
        return None

    def shared_list(self, name: str) -> Any | None:
        return None

    def sync_shared_maps(self) -> None:
        """No map is shared."""

    @property
    def is_coordinator(self) -> bool:
        return True

    def require_coordinator(self, action: str) -> None:
        """A member alone coordinates its jobs."""

    def await_coordination(self, timeout: float) -> None:
        """A member alone coordinates its jobs from its start."""

    def execution_members(self) -> list[tuple[str, str]]:
        return [(self.member_id, "")]

    def call_execution(self, member_id: str, message: ExecutionMessage,
                       timeout: float) -> ExecutionMessage | None:
        """Delivers an execution's request to this member's participant, in-process through
        the encoding a cluster's members use, and decodes its reply. An error raised by the
        participant reaches the caller as it is."""
        if member_id != self.member_id:
            raise ValueError(f"member {self.member_id} is alone: it has no member {member_id}")
        member = self._member
        assert member is not None  # joined
        reply = member.participant.handle(decode_request(message.OP, [message.to_wire()]))
        reply_type = message.REPLY
        return None if reply is None or reply_type is None \
            else decode(reply_type, reply.to_wire())

    def publish_commit_record(self, rec: "CommitRecord") -> None:
        """A member alone is the only reader of its snapshots: its store holds the record."""

    def note_unreachable(self, member_id: str) -> None:
        """A member alone has no other member."""

    def forward_request(self, frame: bytes, client: str, timeout: float,
                        target: str | None = None) -> bytes:
        raise JetwakeError("this member is not part of a cluster: there is no other member "
                           "to forward a request to")

    def ask_other_members(self, frame: bytes, client: str,
                          timeout: float = 10.0) -> list[dict]:
        return []

    def cluster_info(self) -> dict:
        raise JetwakeError("this member is not part of a cluster")

    def describe(self, data_dir: str | None, jobs: int) -> str:
        return f"Member({data_dir or 'in memory'}, {jobs} jobs)"


def deliver_execution_end(member: "MemberContext", ended: ExecutionEnded,
                          cause: BaseException | None = None) -> None:
    """A member's share of an execution ended: tells the execution, if it is still its job's
    current one (``cause``: the error itself, when it ended in this process)."""
    c = member.find_coordinator(ended.exec_key.split(".")[0])
    execution = c.running_execution() if c is not None else None
    if execution is not None and execution.exec_key == ended.exec_key:
        execution.member_ended(ended, cause)
