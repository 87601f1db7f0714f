"""A job of a cluster: coordinated by one member, run by every member.

The job coordinator of a single member does all the job's bookkeeping (status, records,
restarts, snapshots, suspend and resume); a job of a cluster keeps all of that and changes only
how an execution is made and run: it is initialized on every member of the cluster (each builds
its share of the processors from the same definition, with the cluster's member list), started
on all of them once all are ready, and snapshotted across all of them
(:mod:`jetwake.engine.cluster.distributed_execution`). Its job record and the commit records of
its snapshots are written where every member can read them.

A *light job* (:meth:`ClusterMember.new_light_job`) runs the same way on every member but has
no snapshots and no job record: it lives and dies with the member that coordinates it.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import cloudpickle

from jetwake.engine.cluster.distributed_execution import (
    ClusterSnapshotWriter, DistributedExecution, DistributedSnapshot, MemberExecutionError,
)
from jetwake.engine.cluster.peer_network import PeerCallError
from jetwake.engine.core.errors import (
    FallbackRefusedError, RestartableError, is_restartable_cause,
)
from jetwake.engine.jobs.execution_messages import InitExecution
from jetwake.engine.jobs.restore_plan import restore_candidates
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_coordinator import JobCoordinator
from jetwake.engine.jobs.stop_reason import StopReason
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.jobs.job_records import JobRecord
from jetwake.snapshot.store.snapshot_store import CommitRecord, SnapshotDamagedError

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.cluster.cluster_member import ClusterMember

__all__ = ["ClusterJobCoordinator", "ClusterJobRecords", "QuorumLostError"]

log = logging.getLogger("jetwake.cluster")

class QuorumLostError(RestartableError):
    """Fewer members than the job's quorum are present (split-brain protection): the job
    waits until enough are back."""


# a member has this long to build, restore and initialize its share of an execution
INIT_TIMEOUT_S = 120.0


class ClusterJobCoordinator(JobCoordinator):
    """The coordinator of one job that runs on every member (see the module doc)."""

    member: "ClusterMember"

    def __init__(self, member: "ClusterMember", job_id: str, definition: Any,
                 config: JobConfig, submission_time: float | None = None, *,
                 light: bool = False) -> None:
        self.light = light
        #: split-brain protection: more than half of the most members the job ran on
        self.quorum_size = 0
        #: the execution being prepared or run (members ask whether theirs is still it)
        self.current_exec_key: str | None = None
        # set when this member stopped being the cluster's coordinator: the job is another's
        self.deposed = False
        self._rescale_timer: threading.Timer | None = None
        self._rescale_members: set[str] = set()
        self._rescaling = False  # a rescale is taking its snapshot or restarting the job
        self._rescale_lock = threading.Lock()  # the rescale's timer and flag
        super().__init__(member, job_id, definition, config, submission_time)
        self._definition_bytes = cloudpickle.dumps(definition)
        self._attempt = 0

    # --- the job record ----------------------------------------------------------------------

    def record_extra(self) -> dict:
        return {**super().record_extra(), "quorum_size": self.quorum_size}

    def restore_record_extra(self, extra: dict) -> None:
        super().restore_record_extra(extra)
        self.quorum_size = int(extra.get("quorum_size", 0))

    def _check_quorum(self, count: int) -> None:
        """Raises the quorum as members join; refuses to run below it under split-brain
        protection (a restartable cause: the job waits and tries again)."""
        quorum = count // 2 + 1
        if quorum > self.quorum_size:
            self.quorum_size = quorum
            self._save_record()
        if self.config.split_brain_protection and count < self.quorum_size:
            raise QuorumLostError(
                f"job '{self.name}' runs only with a quorum of {self.quorum_size} members "
                f"(split_brain_protection=True); {count} present. It waits until enough "
                "members are back")

    # --- the execution -----------------------------------------------------------------------

    def _prepare_execution(self, restore: str) -> tuple[Any, Any, str]:
        cluster = self.member
        members = cluster.execution_members()
        self._check_quorum(len(members))
        self.store.remove_staging(self.job_id)
        damaged: list[str] = []
        for rec, desc in restore_candidates(self.store, self.job_id, self.config, restore):
            self._attempt += 1
            # unique in the cluster: another coordinator of the same job (after a failover)
            # counts its executions from 1 again
            exec_key = (f"{self.job_id}.{cluster.member_id}.{self.execution_count + 1}."
                        f"{self._attempt}")
            self.current_exec_key = exec_key
            # _on_execution_end reads what a DistributedExecution has of an Execution (error,
            # error_tasklet); mypy infers no lambda with a default against a Callable[[], list]
            execution = DistributedExecution(
                self.name, exec_key, [m for m, _ in members], cluster.call_execution,
                self._on_execution_end,  # type: ignore[arg-type]
                lambda key=exec_key: cluster.participant.tasklets_of_execution(key))  # type: ignore[misc]
            results = execution.all_members(
                lambda index: self._init_message(exec_key, members, index, rec, desc, damaged),
                INIT_TIMEOUT_S)
            failed = {m: r for m, r in results.items() if isinstance(r, BaseException)}
            if failed:
                execution.cancel()
                damaged_on = [m for m, e in failed.items() if _raised(e, SnapshotDamagedError)]
                if rec is not None and damaged_on:
                    error = SnapshotDamagedError("; ".join(str(failed[m]) for m in damaged_on))
                    damaged.append(self._skip_damaged(rec, error, restore))
                    continue
                refused = [e for e in failed.values() if _raised(e, FallbackRefusedError)]
                if refused:
                    if isinstance(refused[0], FallbackRefusedError):
                        raise refused[0]
                    raise FallbackRefusedError(str(refused[0])) from refused[0]
                raise _start_error(self.name, failed)
            if rec is not None and rec.name is None:
                self.last_snapshot = rec
            execution.on_member_lost = self._member_lost
            snapshot = None
            if self.config.snapshots_enabled:
                snapshot = DistributedSnapshot(execution)
                execution.snapshot = snapshot
            return execution, snapshot, desc if rec is not None else ""
        raise AssertionError("unreachable: the last candidate is a start without state")

    def _init_message(self, exec_key: str, members: list[tuple[str, str]], index: int,
                      rec: CommitRecord | None, desc: str, damaged: list[str]) -> InitExecution:
        """What the member at ``index`` is asked to build, restore and initialize."""
        return InitExecution(
            exec_key=exec_key, job_id=self.job_id, job_name=self.name,
            definition=self._definition_bytes, config=dict(vars(self.config)),
            default_parallelism=self._default_parallelism(),
            members=[list(m) for m in members], member_index=index,
            coordinator=self.member.member_id, restore=rec.to_json() if rec is not None else None,
            restore_desc=desc, execution_count=self.execution_count,
            skipped_damaged=list(damaged), accept_fallback=self._accepts_fallback)

    def _discard(self, execution: Any) -> None:
        execution.cancel()

    def _launch(self, execution: Any) -> None:
        execution.start()

    def _execution_description(self, execution: Any) -> str:
        return f"on {len(execution.members)} member(s): {', '.join(execution.members)}"

    def new_snapshot_writer(self, snapshot_id: int, terminal: bool) -> ClusterSnapshotWriter:
        return ClusterSnapshotWriter(self.store, self.job_id, self.name, snapshot_id, terminal,
                                     self.member.publish_commit_record)

    def _save_record(self, definition: Any = None, *, raise_errors: bool = False) -> bool:
        if self.light or self.deposed:
            # a light job has no record; a deposed coordinator's writes would be fenced
            return True
        return super()._save_record(definition, raise_errors=raise_errors)

    # --- members come and go -----------------------------------------------------------------

    def running_execution(self) -> DistributedExecution | None:
        execution = self.current_execution
        if isinstance(execution, DistributedExecution) and not execution.finished.is_set():
            return execution
        return None

    def member_left(self, member_id: str) -> None:
        """A member left the cluster: an execution it took part in cannot go on. It restarts
        on the others, or, with ``auto_scaling=False`` and snapshots, the job is suspended."""
        execution = self.running_execution()
        if execution is None or member_id not in execution.members:
            return
        if not self.config.auto_scaling and self.config.snapshots_enabled and not self.light:
            self._claim_stop(StopReason.SUSPEND)
            self.member.emit_event(self, f"member {member_id} left: suspended "
                                         "(auto_scaling=False)")
        execution.member_left(member_id)

    def _member_lost(self, member_id: str) -> None:
        self.member.note_unreachable(member_id)
        self.member_left(member_id)

    def members_joined(self, member_ids: set[str], delay_s: float) -> None:
        """Members that the running execution does not use joined: with auto-scaling the job
        restarts from a fresh snapshot to use them, ``delay_s`` after the last of them joined
        (so a group of members starting together costs one restart)."""
        if not self.config.auto_scaling or self.light or not member_ids:
            return
        with self._rescale_lock:
            if self._rescaling:
                return  # the restart under way uses every member there when it starts
            if self._rescale_timer is not None:
                if member_ids <= self._rescale_members:
                    return  # already scheduled for these members: the delay runs on
                self._rescale_timer.cancel()
            self._rescale_members = set(member_ids)
            timer = threading.Timer(delay_s, self.rescale, args=(f"member(s) "
                                    f"{', '.join(sorted(member_ids))} joined",))
            timer.daemon = True
            self._rescale_timer = timer
        timer.start()

    def rescale(self, why: str) -> None:
        """Restarts the running job on the cluster's current members, from a terminal
        snapshot taken first (nothing is replayed that need not be). One rescale at a time;
        none when the execution changed meanwhile (a restart already uses the members)."""
        with self._rescale_lock:
            self._rescale_timer = None
            execution = self.current_execution
            if self.status != JobStatus.RUNNING or self.is_stopping \
                    or self.deposed or self._rescaling or execution is None:
                return
            self._rescaling = True
        try:
            log.info("job %s: %s; restarting on the cluster's members", self.name, why)
            self.member.emit_event(self, f"rescaling: {why}")
            if self.config.snapshots_enabled:
                try:
                    self.take_snapshot(terminal=True)
                except Exception as e:  # noqa: BLE001 - restarts from its last snapshot instead
                    log.warning("job %s: the snapshot before rescaling failed (%s); restarting "
                                "from the last one", self.name, e)
            if not self._claim_stop(StopReason.RESTART, execution):
                return  # it stopped or restarted meanwhile
            execution.cancel()
        finally:
            with self._rescale_lock:
                self._rescaling = False

    def abandon(self) -> None:
        """This member is no longer the cluster's coordinator: stops coordinating the job
        without writing anything (the new coordinator resumes it from its records)."""
        self.deposed = True
        self._stop_retrying()
        with self._rescale_lock:
            timer, self._rescale_timer = self._rescale_timer, None
        if timer is not None:
            timer.cancel()
        self._stop_execution(StopReason.SHUTDOWN)

    def is_current(self, exec_key: str) -> bool:
        """Whether ``exec_key`` is the execution this coordinator prepares or runs."""
        if self.deposed or self.status.is_terminal or exec_key != self.current_exec_key:
            return False
        execution = self.current_execution
        return not (isinstance(execution, DistributedExecution)
                    and execution.exec_key == exec_key and execution.finished.is_set())


def _raised(error: BaseException, cls: type[BaseException]) -> bool:
    """Whether a member's call raised ``cls``: this member's own in-process, another's named
    by the network's error."""
    return isinstance(error, cls) or (isinstance(error, PeerCallError)
                                      and error.remote_type == cls.__name__)


def _start_error(job: str, failed: dict[str, BaseException]) -> BaseException:
    """The error a start that failed on some members raises: restartable when every failure
    is, by the one verdict every path uses (is_restartable_cause; a member judges its own
    error and the network carries the verdict), so the job retries with back-off."""
    text = "; ".join(f"member {m}: {e}" for m, e in failed.items())
    restartable = all(is_restartable_cause(e) for e in failed.values())
    message = f"job '{job}' could not start on every member: {text}"
    return RestartableError(message) if restartable else MemberExecutionError(message)


class ClusterJobRecords:
    """Job records and definitions of a cluster's jobs, kept where every member can read them
    (the cluster's records topic), with the interface of a member's own JobRecordStore.

    Only the coordinator writes them (through its fenced producer)."""

    def __init__(self, records: Any) -> None:
        self.records = records

    @property
    def persistent(self) -> bool:
        return True

    def save(self, record: JobRecord, definition: Any | None = None) -> None:
        items = [(f"job/{record.job_id}",
                  json.dumps(asdict(record), sort_keys=True).encode())]
        if definition is not None:
            items.insert(0, (f"definition/{record.job_id}", cloudpickle.dumps(definition)))
        self.records.put_many(items)

    def load_all(self) -> list[JobRecord]:
        out = []
        for key, value in sorted(self.records.read_all().items()):
            if key.startswith("job/"):
                out.append(JobRecord(**json.loads(value)))
        return out

    def load_definition(self, job_id: str) -> Any:
        data = self.records.read_all().get(f"definition/{job_id}")
        if data is None:
            raise KeyError(f"the definition of job {job_id} is missing from the cluster's "
                           "records")
        return cloudpickle.loads(data)  # written by a coordinator of this cluster

    def delete(self, job_id: str) -> None:
        self.records.put_many([(f"job/{job_id}", None), (f"definition/{job_id}", None)])
