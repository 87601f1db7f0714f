"""Coordinates one job: plans it, runs its executions, snapshots it, and restarts it.

This is the coordinator side of a job (Jet's MasterContext). It owns the job's status and is
the only place that changes it. An *execution* is one run of the job's processors; a job may
have several (restart, suspend/resume, recovery after a crash), each restoring the last good
snapshot.

Every execution runs the same way, on a member alone and on a cluster: the coordinator asks
every member of the execution (a member alone is a cluster of one, called in-process) to build,
restore and initialize its share (:class:`~jetwake.engine.jobs.execution_participant.
ExecutionParticipant`), starts them all once all are ready, and snapshots them all
(:mod:`jetwake.engine.jobs.distributed_execution`). How the job follows its members coming
and going is :mod:`jetwake.engine.jobs.member_changes`; its snapshots are taken by
:mod:`jetwake.engine.jobs.snapshot_driver`.

A *light job* (``new_light_job`` of a cluster member) runs the same way on every member but has
no snapshots and no job record: it lives and dies with the member that coordinates it.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
import time
from typing import TYPE_CHECKING, Any

import cloudpickle

from jetwake.engine.jobs.distributed_execution import (
    DistributedExecution, DistributedSnapshot, MemberExecutionError, SnapshotCommitWriter,
)
from jetwake.engine.jobs.execution_messages import InitExecution
from jetwake.engine.jobs.job_records import JobRecord
from jetwake.engine.jobs.member_changes import MemberChanges
from jetwake.engine.jobs.restart_backoff import RESTART_BACKOFF_FIRST_S, RestartBackoff
from jetwake.engine.jobs.restore_plan import damaged_export_error, restore_candidates
from jetwake.engine.jobs.upgrade_plan import vertex_kinds
from jetwake.snapshot.store.snapshot_store import (
    CommitRecord, SnapshotDamagedError,
)
from jetwake.engine.core.dag import DAG
from jetwake.engine.core.errors import (
    FallbackRefusedError, JobCancelledError, JobStateError, RemoteCallError, RestartableError,
    is_restartable_cause,
)
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.jobs.execution_driver import ExecutionDriver, SnapshotCommit, SnapshotPhases
from jetwake.engine.jobs.snapshot_driver import SnapshotDriver
from jetwake.engine.jobs.snapshot_history import SnapshotHistory
from jetwake.engine.jobs.stop_reason import StopReason
from jetwake.engine.execution.execution_metrics import (
    StageMetrics, stage_counts, vertex_counts, with_percentiles,
)
from jetwake.engine.pipeline.fusion import fused_stage_of
from jetwake.snapshot.state.keyed_state import in_memory_state_factory
from jetwake.snapshot.state.rocksdb_backend import RocksDBStateBackend

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.jobs.member_context import MemberContext

__all__ = ["JobCoordinator", "compile_definition", "state_factory", "start_failure"]

log = logging.getLogger("jetwake.job")

# statuses in which a job was running when its member stopped: it resumes on the next start
_WAS_RUNNING = {JobStatus.STARTING.value, JobStatus.RUNNING.value, JobStatus.COMPLETING.value,
                JobStatus.NOT_RUNNING.value}
# a member has this long to build, restore and initialize its share of an execution
INIT_TIMEOUT_S = 120.0


def compile_definition(definition: Any, default_parallelism: int) -> DAG:
    """The validated DAG of a job's definition (a Pipeline or a DAG); the same on every member
    of a cluster, given the same default parallelism."""
    from jetwake.engine.pipeline.pipeline import Pipeline
    if isinstance(definition, Pipeline):
        dag = definition.to_dag(default_parallelism)
    elif isinstance(definition, DAG):
        dag = definition
    else:
        raise TypeError(f"new_job() expects a Pipeline or a DAG, got "
                        f"{type(definition).__qualname__}")
    dag.validate()
    return dag


def state_factory(data_dir: str | None, job_id: str, config: JobConfig, execution_tag: str):
    """Creates each processor's keyed state store for one execution, per
    JobConfig.state_backend (RocksDB under ``<data_dir>/state/<job_id>/<execution_tag>``)."""
    if config.state_backend != "rocksdb":
        return in_memory_state_factory
    root = os.path.join(data_dir, "state", job_id, execution_tag)  # type: ignore[arg-type]
    cache = config.state_cache_bytes

    def factory(vertex: str, index: int, name: str) -> RocksDBStateBackend:
        return RocksDBStateBackend(os.path.join(root, vertex, str(index), name), cache)
    return factory


class JobCoordinator:
    """The coordinator of one job (see the module doc)."""

    def __init__(self, member: "MemberContext", job_id: str, definition: Any, config: JobConfig,
                 submission_time: float | None = None, *, light: bool = False) -> None:
        self.member = member
        self.light = light
        #: the execution being prepared or run (members ask whether theirs is still it)
        self.current_exec_key: str | None = None
        # set when this member stopped being the cluster's coordinator: the job is another's
        self.deposed = False
        #: how the job follows its members coming and going
        self.member_changes = MemberChanges(self)
        self.job_id = job_id
        self.definition = definition  # a Pipeline or a DAG
        self.config = config
        self.name = config.name or job_id
        self.submission_time = submission_time or time.time()
        self.completion_time: float | None = None
        self.status = JobStatus.NOT_RUNNING
        self.error: BaseException | None = None
        self.failure_text: str | None = None
        self.restart_count = 0
        self._execution: ExecutionDriver | None = None
        self.execution_count = 0  # executions started so far
        self._snapshot: SnapshotPhases | None = None
        self._stop_reason = StopReason.NONE
        self._lock = threading.RLock()
        self._record_lock = threading.Lock()
        self._state_changed = threading.Condition(self._lock)
        self._ended = threading.Event()
        self._accept_fallback_once = False
        #: takes the job's snapshots (regular, terminal, exported), one at a time
        self.snapshots = SnapshotDriver(self)
        # why the job record on disk is out of date (None: it is current)
        self.record_error: str | None = None
        #: the restarts with back-off
        self.restarts = RestartBackoff(
            self.name, self._restart_attempt, lambda text: member.emit_event(self, text),
            lambda: self.failure_text, self._restarts_settled)
        self._retry_failure = False  # failure_text says why a restart attempt failed
        # set by a graceful member shutdown: the record says "running" unless the job ends
        self._resume_on_start = False
        self._terminal_committed = False  # the shutdown's terminal snapshot committed
        self.dag: DAG = self._compile()
        self._definition_bytes: bytes | None = None  # pickled for the first other member
        self._attempt = 0  # executions prepared, counting the attempts that failed
        self._incarnation = secrets.token_hex(3)  # this coordinator, in its execution keys

    def _compile(self) -> DAG:
        return compile_definition(self.definition, self.default_parallelism())

    def default_parallelism(self) -> int:
        """Processors per vertex where neither the stage nor the job sets a number."""
        lp = self.config.local_parallelism
        return lp if lp > 0 else self.member.default_local_parallelism

    @property
    def store(self):
        return self.member.snapshot_store

    # --- status ----------------------------------------------------------------------------

    def _set_status(self, status: JobStatus) -> None:
        """Changes the status in memory, then writes the job record and emits the event. The
        in-memory status is always right: a record that cannot be written (a full disk) is
        reported and written again later, it never leaves the job in its old status."""
        with self._lock:
            if self.status == status:
                return
            self.status = status
            self._state_changed.notify_all()
        self._publish_status(status)

    def _publish_status(self, status: JobStatus) -> None:
        self._save_record()
        self.member.emit_event(self, status.value.lower())

    def _record_status(self) -> JobStatus:
        """The status the record says: after a graceful member shutdown stopped the job it
        says RUNNING (resume on the next start) unless the job ended meanwhile."""
        status = self.status
        if self._resume_on_start and not status.is_terminal:
            return JobStatus.RUNNING
        return status

    def save_record(self) -> bool:
        """Writes the job record now; True when written (see :meth:`_save_record`)."""
        return self._save_record()

    def _save_record(self, definition: Any = None, *, raise_errors: bool = False) -> bool:
        """Writes the job record (and the definition, when given); True when written.

        An OSError (a full disk) is raised with ``raise_errors``; otherwise it is reported
        (``record_error``, a log line, an event) and the member writes the record again with
        back-off until it succeeds, so the status on disk catches up once there is space.
        A light job has no record, and a deposed coordinator writes none (its writes would
        be fenced)."""
        records = self.member.job_records
        if not records.persistent or self.light or self.deposed:
            return True
        error: OSError | None = None
        with self._record_lock:  # the status written is the one current at write time
            rec = JobRecord(self.job_id, self.name, self._record_status().value,
                            dict(vars(self.config)), self.submission_time,
                            self.completion_time, self.failure_text,
                            self.record_extra())
            try:
                records.save(rec, definition)
            except OSError as e:
                if raise_errors:
                    raise
                error = e
            was_stale, self.record_error = self.record_error, None
            if error is not None:
                self.record_error = (
                    f"writing the job record of '{self.name}' failed ({error}); on disk the "
                    f"job's status is out of date (it is {self.status.value}) until the "
                    "record can be written, which is retried with back-off")
        if error is not None:
            if was_stale is None:  # one line per episode, not per retry
                log.error("job %s: %s", self.name, self.record_error)
            self.member.emit_event(self, f"job record write failed: {error}")
            self.member.retry_record_later(self)
            return False
        if was_stale is not None:
            log.info("job %s: the job record is written again (status %s)", self.name,
                     rec.status)
        return True

    def record_extra(self) -> dict:
        """What the job record keeps besides status and config (read back by
        :meth:`restore_record_extra` when a member resumes the job)."""
        return {"restart_count": self.restart_count,
                "quorum_size": self.member_changes.quorum_size}

    def load_record(self, rec: JobRecord) -> bool:
        """Takes over what a job record says of a job found at member start (or by a new
        coordinator); whether the job was running then (it resumes: :meth:`recover`)."""
        self.completion_time = rec.completion_time
        self.failure_text = rec.failure
        self.restart_count = rec.extra.get("restart_count", 0)
        self.member_changes.quorum_size = int(rec.extra.get("quorum_size", 0))
        if rec.status in _WAS_RUNNING:
            # an error recorded before is history once the job runs again
            self._retry_failure = self.failure_text is not None
            return True
        self.status = JobStatus(rec.status)
        if self.status.is_terminal:
            self._ended.set()
        return False

    def save_definition(self) -> None:
        """Writes the job's definition and record; raises when they cannot be written (the job
        cannot be submitted then)."""
        self._save_record(self.definition, raise_errors=True)

    def wait_for_execution(self, count: int, timeout: float) -> bool:
        """Waits until ``count`` executions have started and the job runs (or has ended)."""
        with self._lock:
            return self._state_changed.wait_for(
                lambda: (self.execution_count >= count and self.status == JobStatus.RUNNING)
                or self.status.is_terminal, timeout)

    def wait_for_status(self, statuses: set[JobStatus], timeout: float) -> bool:
        with self._lock:
            return self._state_changed.wait_for(lambda: self.status in statuses, timeout)

    # --- starting an execution ---------------------------------------------------------------

    def start(self, *, restore: str = "latest", persist_definition: bool = True,
              on_restartable: JobStatus | None = None) -> None:
        """Starts an execution; ``restore`` is "latest" (the last good snapshot, if any),
        "initial" (the config's initial_snapshot_name) or "none".

        When it cannot start, the error is raised and the job is left: SUSPENDED for a
        :class:`FallbackRefusedError` (the user decides); in ``on_restartable`` for an error
        :func:`is_restartable_cause` accepts (a broker away, a full disk), when given; FAILED
        with the cause as its failure text otherwise. A cancel requested while it starts ends
        the job cancelled (:class:`JobCancelledError`); a member shutdown while it starts leaves
        it NOT_RUNNING, to resume on the next start.
        """
        if persist_definition:
            self.save_definition()
        self._begin_start()
        try:
            execution, snapshot, desc = self._prepare_execution(restore)
        except FallbackRefusedError as e:
            # the user can act on it: resume, accepting duplicates
            self.error = e
            self.failure_text = f"{type(e).__name__}: {e}"
            self._retry_failure = False
            self._set_status(JobStatus.SUSPENDED)
            raise
        except BaseException as e:
            self._start_failed(e, on_restartable)
            raise
        finally:
            self._accept_fallback_once = False
        with self._lock:
            # a cancel, suspend or member shutdown may have come while the processors were
            # built; a restart asked for meanwhile is this start
            if self._stop_reason == StopReason.RESTART:
                self._stop_reason = StopReason.NONE
            reason = self._stop_reason
            if reason == StopReason.NONE:
                self._execution = execution
                self._snapshot = snapshot
                self.execution_count += 1
                if self._retry_failure:  # it runs again: the last attempt's error is history
                    self.failure_text = None
                    self.error = None
                    self._retry_failure = False
                self.restarts.attempts = 0
                self.status = JobStatus.RUNNING
                self._state_changed.notify_all()
        if reason != StopReason.NONE:
            execution.discard()  # never started: each member drops its share
            self._remove_state_dirs()
            if reason == StopReason.CANCEL:
                self._finish_cancelled()
                raise JobCancelledError(f"job '{self.name}' was cancelled while starting")
            if reason == StopReason.SUSPEND:
                self._set_status(JobStatus.SUSPENDED)
                return
            self._set_status(JobStatus.NOT_RUNNING)
            raise JobStateError(f"job '{self.name}' did not start: the member is shutting down")
        self._publish_status(JobStatus.RUNNING)
        log.info("job %s (%s) started: %s%s", self.name, self.job_id,
                 self._execution_description(execution),
                 f", restored from {desc}" if desc else "")
        execution.start()
        if snapshot is not None:
            self.snapshots.start_regular(execution, self.config.snapshot_interval_ms / 1000)

    def _begin_start(self) -> None:
        """Moves the job to STARTING, in one step with the checks that it may start."""
        with self._lock:
            if self.status.is_terminal:
                raise JobStateError(f"job '{self.name}' is {self.status.value}: it cannot start "
                                    "again")
            reason = self._stop_reason
            if reason not in (StopReason.CANCEL, StopReason.SHUTDOWN):
                # a suspend or restart request belonged to the execution that ended
                self._stop_reason = StopReason.NONE
                self._ended.clear()
                self.status = JobStatus.STARTING
                self._state_changed.notify_all()
        if reason == StopReason.CANCEL:  # cancelled while its restart was on the way
            self._finish_cancelled()
            raise JobCancelledError(f"job '{self.name}' was cancelled")
        if reason == StopReason.SHUTDOWN:
            raise JobStateError(f"job '{self.name}' does not start: the member is shutting down")
        self._publish_status(JobStatus.STARTING)

    def _start_failed(self, error: BaseException, on_restartable: JobStatus | None) -> None:
        """Leaves the job in a status the user can act on after a failed start."""
        self._remove_state_dirs()
        with self._lock:
            reason = self._stop_reason
        if reason == StopReason.CANCEL:
            self._finish_cancelled()
            return
        text = f"{type(error).__name__}: {error}"
        if reason == StopReason.SHUTDOWN:
            self._set_status(JobStatus.NOT_RUNNING)
            return
        if on_restartable is not None and is_restartable_cause(error):
            self.error = error
            if on_restartable == JobStatus.NOT_RUNNING:
                self.failure_text = (f"{text} (start attempt {max(1, self.restarts.attempts)} "
                                     "failed; retrying with back-off)")
                self._retry_failure = True
            else:
                self.failure_text = text
                self._retry_failure = False
            self._set_status(on_restartable)
            return
        self.failure_text = text
        self._retry_failure = False
        self._finish(JobStatus.FAILED, error)

    # --- how an execution is made and run ---------------------------------------------------

    def _prepare_execution(self, restore: str) -> tuple[DistributedExecution,
                                                        DistributedSnapshot | None, str]:
        """Initializes an execution on every member it runs on, restoring the newest good
        snapshot (a snapshot found damaged on any member is skipped, see restore_plan);
        returns it, its snapshots' coordinator side (None without snapshots) and what it was
        restored from."""
        member = self.member
        members = member.execution_members()
        self.member_changes.check_quorum(len(members))
        self.store.remove_staging(self.job_id)
        damaged: list[str] = []
        # a snapshot of the execution before may still be committing (that execution ended
        # after the snapshot's phase 1): whether it commits decides the restore point. Read
        # before it has, the newest committed snapshot would be the one before it while its
        # phase 2 may already have made sinks write its output, written again after a restore
        # from the older one
        with self.snapshots.paused():
            candidates = restore_candidates(self.store, self.job_id, self.config, restore)
        for rec, desc in candidates:
            self._attempt += 1
            # unique in the cluster and over time: another coordinator of the same job (after
            # a failover, or in the member's next process) counts its executions from 1 again
            exec_key = (f"{self.job_id}.{member.member_id}.{self._incarnation}."
                        f"{self.execution_count + 1}.{self._attempt}")
            self.current_exec_key = exec_key
            participant = member.participant
            execution = DistributedExecution(
                self.name, exec_key, [m for m, _ in members], member.call_execution,
                self._on_execution_end,
                lambda key=exec_key: participant.tasklets_of_execution(key),  # type: ignore[misc]
                member.member_id)
            results = execution.all_members(
                lambda index: self._init_message(exec_key, members, index, rec, desc, damaged),
                INIT_TIMEOUT_S)
            failed = {m: r for m, r in results.items() if isinstance(r, BaseException)}
            if failed:
                execution.discard()
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
                if len(failed) == 1 and len(members) == 1:
                    raise next(iter(failed.values()))  # a member alone: the error itself
                raise start_failure(self.name, failed)
            if rec is not None and rec.name is None:
                self.last_snapshot = rec
            execution.on_member_lost = self.member_changes.member_lost
            snapshot = None
            if self.config.snapshots_enabled:
                snapshot = DistributedSnapshot(execution)
                execution.snapshot = snapshot
            return execution, snapshot, desc if rec is not None else ""
        raise AssertionError("unreachable: the last candidate is a start without state")

    def _init_message(self, exec_key: str, members: list[tuple[str, str]], index: int,
                      rec: CommitRecord | None, desc: str, damaged: list[str]) -> InitExecution:
        """What the member at ``index`` is asked to build, restore and initialize. This
        member's own share is built from the job's DAG itself (an empty definition says so):
        a member alone runs the objects the user submitted, as an embedded engine should;
        every other member gets a copy."""
        if members[index][0] == self.member.member_id:
            definition = b""
        else:
            if self._definition_bytes is None:
                self._definition_bytes = cloudpickle.dumps(self.definition)
            definition = self._definition_bytes
        return InitExecution(
            exec_key=exec_key, job_id=self.job_id, job_name=self.name,
            definition=definition, config=dict(vars(self.config)),
            default_parallelism=self.default_parallelism(),
            members=[list(m) for m in members], member_index=index,
            coordinator=self.member.member_id, restore=rec.to_json() if rec is not None else None,
            restore_desc=desc, execution_count=self.execution_count,
            skipped_damaged=list(damaged), accept_fallback=self._accept_fallback_once)

    def _skip_damaged(self, rec: CommitRecord, error: Exception, restore: str) -> str:
        """Reports a damaged snapshot the restore skips; how the next attempt names it."""
        refused = damaged_export_error(rec, error)
        if refused is not None:  # an export the user asked for: no silent fallback
            raise refused from error
        log.warning("job %s: snapshot %d is damaged (%s); falling back to the previous good "
                    "snapshot", self.name, rec.snapshot_id, error)
        self.member.emit_event(self, f"snapshot {rec.snapshot_id} is damaged: {error}")
        return f"snapshot {rec.snapshot_id} ({error})"

    def _execution_description(self, execution: DistributedExecution) -> str:
        if len(execution.members) == 1:
            return f"{len(execution.tasklets)} processors"
        return f"on {len(execution.members)} member(s): {', '.join(execution.members)}"

    def new_snapshot_writer(self, snapshot_id: int, terminal: bool) -> SnapshotCommit:
        """The writer that commits snapshot ``snapshot_id`` (SnapshotOwner)."""
        writer = SnapshotCommitWriter(self.store, self.job_id, self.name, snapshot_id,
                                      terminal, self.member.publish_commit_record)
        # whose state each vertex saves, and its shape
        writer.record.kinds, writer.record.shapes = vertex_kinds(self.dag)
        return writer

    def _remove_state_dirs(self) -> None:
        """Removes the job's RocksDB working state (``<data_dir>/state/<job_id>``). Called when
        no execution of the job runs: after one ended, after a failed start, at the job's end.
        Its processors delete their own stores when they close; this removes what a failed
        close left behind. A snapshot never points into it (saved files are hard links)."""
        if self.member.data_dir is None or self.config.state_backend != "rocksdb":
            return
        shutil.rmtree(os.path.join(self.member.data_dir, "state", self.job_id),
                      ignore_errors=True)

    # --- the end of an execution -------------------------------------------------------------

    def _on_execution_end(self, execution: ExecutionDriver) -> None:
        with self._lock:
            if execution is not self._execution:
                return
            reason = self._stop_reason
        self._remove_state_dirs()
        if reason == StopReason.SHUTDOWN and (execution.error is None
                                         or is_restartable_cause(execution.error)):
            # stopped by a graceful member shutdown: the record says running, so the next start
            # resumes it, from the terminal snapshot if it committed
            self._set_status(JobStatus.SUSPENDED if self._terminal_committed
                             else JobStatus.NOT_RUNNING)
        elif reason == StopReason.CANCEL:
            self._finish_cancelled()
        elif reason == StopReason.SUSPEND:
            self._set_status(JobStatus.SUSPENDED)
        elif reason == StopReason.RESTART:
            self._restart_async("restart requested")
        elif execution.error is not None:
            err = execution.error
            if is_restartable_cause(err) and self.config.snapshots_enabled:
                log.warning("job %s: %s; restarting from the last snapshot", self.name, err)
                self._restart_async(str(err))
                return
            try:
                err.add_note(f"jetwake: job '{self.name}' failed in processor "
                             f"{execution.error_tasklet}")
            except AttributeError:  # pragma: no cover
                pass
            log.error("job %s failed in %s: %r", self.name, execution.error_tasklet, err)
            # a stateless stage fused into a vertex is named with the vertex's processor
            stage = fused_stage_of(err)
            where = execution.error_tasklet if stage is None else \
                f"{stage}, processor {execution.error_tasklet}"
            self.failure_text = f"{type(err).__name__}: {err} (in {where})"
            if self.config.suspend_on_failure:
                self.error = err
                self._set_status(JobStatus.SUSPENDED)
            else:
                self._finish(JobStatus.FAILED, err)
        else:
            self._set_status(JobStatus.COMPLETING)
            self.store.delete_job_snapshots(self.job_id)
            self._finish(JobStatus.COMPLETED, None)

    def _restart_async(self, why: str) -> None:
        self.restart_count += 1
        self.member.emit_event(self, f"restarting ({why})")
        self.restarts.begin()

    def recover(self) -> None:
        """Resumes, at member start, a job that was running when its member stopped. One
        attempt now; when it fails for a restartable cause the job is NOT_RUNNING (its failure
        says why) and the attempts go on in the background with back-off; a permanent cause
        marks the job FAILED with that cause. Never raises: one job that cannot start must
        not keep the member from recovering the others."""
        self.restart_count += 1
        self.restarts.attempts = 1
        try:
            self.start(restore="latest", persist_definition=False,
                       on_restartable=JobStatus.NOT_RUNNING)
            return
        except Exception as e:  # noqa: BLE001 - reported below, the member goes on
            error = e
        if self.status == JobStatus.NOT_RUNNING and is_restartable_cause(error) \
                and not self.restarts.stopped:
            self.restarts.failed_attempt(1, error, RESTART_BACKOFF_FIRST_S)
            self.restarts.begin(attempts_done=1)
        else:
            log.error("job %s (%s) could not be resumed: %s", self.name, self.job_id,
                      self.failure_text or repr(error))

    def _restart_attempt(self, attempt: int) -> None:
        """One attempt of a restart: a new execution from the last snapshot (a failure leaves
        the job NOT_RUNNING with why, or FAILED for a permanent cause)."""
        self.start(restore="latest", persist_definition=False,
                   on_restartable=JobStatus.NOT_RUNNING)

    def _restarts_settled(self) -> None:
        """After a series of restart attempts: a series stopped before an attempt began leaves
        no execution, so the job is not running."""
        with self._lock:
            stale = self.status in (JobStatus.RUNNING, JobStatus.STARTING) \
                and (self._execution is None or self._execution.finished.is_set())
        if stale:
            self._set_status(JobStatus.NOT_RUNNING)

    def _finish(self, status: JobStatus, error: BaseException | None) -> None:
        with self._lock:
            if self.status.is_terminal:
                return
            self.error = error
            if error is not None and self.failure_text is None:
                self.failure_text = f"{type(error).__name__}: {error}"
            self.completion_time = time.time()
        self.restarts.stop()
        self._remove_state_dirs()
        self._set_status(status)
        self._ended.set()

    def _finish_cancelled(self) -> None:
        self.restarts.stop()
        self.store.delete_job_snapshots(self.job_id)
        if self._retry_failure:  # the failed attempt is not why it ended
            self.failure_text = None
            self._retry_failure = False
        self._finish(JobStatus.FAILED, JobCancelledError(f"job '{self.name}' was cancelled"))

    # --- snapshots (the SnapshotOwner side of the snapshot driver) ------------------------

    @property
    def current_execution(self) -> ExecutionDriver | None:
        """The job's current (or last) execution."""
        return self._execution

    def current_run(self) -> tuple[ExecutionDriver, SnapshotPhases] | None:
        """The running execution and its snapshot phases; None when none runs."""
        with self._lock:
            execution, snap = self._execution, self._snapshot
        if execution is None or snap is None or execution.finished.is_set():
            return None
        return execution, snap

    def keeps_running(self, execution: ExecutionDriver) -> bool:
        """Whether ``execution`` is still the job's, running and not being stopped."""
        with self._lock:
            return execution is self._execution and self.status == JobStatus.RUNNING \
                and self._stop_reason == StopReason.NONE

    def take_snapshot(self, terminal: bool = False) -> CommitRecord:
        """Takes a snapshot of the running execution now (see SnapshotDriver.take)."""
        return self.snapshots.take(terminal)

    @property
    def last_snapshot(self) -> CommitRecord | None:
        """The newest good snapshot (taken, or restored by the current execution)."""
        return self.snapshots.last_snapshot

    @last_snapshot.setter
    def last_snapshot(self, rec: CommitRecord | None) -> None:
        self.snapshots.last_snapshot = rec

    @property
    def snapshot_count(self) -> int:
        return self.snapshots.count

    @property
    def snapshot_failures(self) -> int:
        return self.snapshots.failures

    @property
    def last_snapshot_error(self) -> str | None:
        return self.snapshots.last_error

    @property
    def snapshot_history(self) -> SnapshotHistory:
        return self.snapshots.history

    # --- operations --------------------------------------------------------------------------

    @property
    def is_stopping(self) -> bool:
        """Whether the current execution is being stopped (cancel, suspend, restart)."""
        return self._stop_reason != StopReason.NONE

    @property
    def stop_reason(self) -> StopReason:
        """Why the current execution is being stopped (NONE: it is not)."""
        with self._lock:
            return self._stop_reason

    def claim_stop(self, reason: StopReason,
                   execution: ExecutionDriver | None = None) -> bool:
        """Says why the current execution is being stopped, unless it is being stopped
        already or (given ``execution``) ``execution`` is no longer the job's running one;
        whether it was said. The caller stops the execution."""
        with self._lock:
            if self._stop_reason != StopReason.NONE:
                return False
            if execution is not None and (execution is not self._execution
                                          or execution.finished.is_set()):
                return False
            self._stop_reason = reason
            return True

    def stop_retrying(self) -> None:
        """A restart waiting to retry gives up; none is tried again."""
        self.restarts.stop()

    def _stop_execution(self, reason: StopReason) -> ExecutionDriver | None:
        with self._lock:
            self._stop_reason = reason
            execution = self._execution
        if execution is not None:
            execution.cancel()
        return execution

    def cancel(self) -> None:
        """Stops the job for good (FAILED with JobCancelledError, snapshots deleted), in any
        status: a running execution is stopped, a start in progress ends cancelled, a restart
        waiting to retry gives up."""
        with self._lock:
            if self.status.is_terminal:
                raise JobStateError(f"job '{self.name}' is already {self.status.value}; "
                                    "only a running or suspended job can be cancelled")
            self._stop_reason = StopReason.CANCEL
            execution = self._execution
            if execution is not None and execution.finished.is_set():
                execution = None  # the previous execution: it has ended already
            starting = self.status == JobStatus.STARTING
        self.restarts.stop()
        if execution is not None:
            execution.cancel()  # its end finishes the job
            return
        if starting:
            return  # start() sees the request and ends the job cancelled
        self._finish_cancelled()

    def suspend(self) -> None:
        self.require(JobStatus.RUNNING, "suspend")
        if self.config.snapshots_enabled:
            self.take_snapshot(terminal=True)
        self._stop_execution(StopReason.SUSPEND)

    def resume(self, accept_at_least_once_on_fallback: bool = False) -> None:
        """Starts a suspended job from its last good snapshot; see
        JobConfig.accept_at_least_once_on_fallback for the flag."""
        self.require(JobStatus.SUSPENDED, "resume")
        self.error = None
        self._accept_fallback_once = bool(accept_at_least_once_on_fallback)
        # a restartable cause (a full disk, a broker away) leaves it SUSPENDED: resume again
        self.start(restore="latest", persist_definition=False,
                   on_restartable=JobStatus.SUSPENDED)

    def stop_for_shutdown(self, timeout: float) -> bool:
        """Stops the job for a graceful member shutdown so that the next start resumes it.

        A running job takes a terminal snapshot first; if that fails (a full disk), the next
        start resumes from the last good snapshot instead. A start in progress is abandoned and
        a restart waiting to retry gives up. From here on the job record says RUNNING whatever
        the status in memory becomes (SUSPENDED after a committed terminal snapshot, else
        NOT_RUNNING), unless the job completes or fails meanwhile: then it says so. Returns
        whether the job stopped within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            status = self.status
            if status.is_terminal or status in (JobStatus.SUSPENDED,
                                                JobStatus.SUSPENDED_EXPORTING_SNAPSHOT):
                return True  # not running: a suspended job stays suspended
            self._resume_on_start = True
            stopping = self._stop_reason != StopReason.NONE
        if status == JobStatus.RUNNING and not stopping and self.config.snapshots_enabled:
            try:
                self.take_snapshot(terminal=True)
                self._terminal_committed = True
            except Exception as e:  # noqa: BLE001 - shutting down regardless
                log.warning("job %s: the terminal snapshot at shutdown failed (%s); the next "
                            "start resumes the job from its last good snapshot", self.name, e)
                self.member.emit_event(self, f"terminal snapshot failed at shutdown: {e}")
        self.restarts.stop()
        self._stop_execution(StopReason.SHUTDOWN)
        if status == JobStatus.NOT_RUNNING:
            self._save_record()  # says RUNNING now: resume on the next start
        ended = self.wait_for_status(
            {JobStatus.SUSPENDED, JobStatus.NOT_RUNNING, JobStatus.FAILED,
             JobStatus.COMPLETED}, max(0.0, deadline - time.monotonic()))
        return self.restarts.join(max(0.0, deadline - time.monotonic())) and ended

    def restart(self) -> None:
        self.require(JobStatus.RUNNING, "restart")
        self._stop_execution(StopReason.RESTART)

    def export_snapshot(self, name: str, cancel: bool = False) -> CommitRecord:
        with self._lock:
            status = self.status
        if status == JobStatus.SUSPENDED:
            if cancel:
                raise JobStateError(f"job '{self.name}' is suspended: export its snapshot, "
                                    "then cancel it")
            rec = self.last_snapshot or self.store.latest(self.job_id)
            if rec is None:
                raise JobStateError(f"job '{self.name}' is suspended without a snapshot to "
                                    "export (its guarantee is 'none')")
            self._set_status(JobStatus.SUSPENDED_EXPORTING_SNAPSHOT)
            try:
                return self.store.export(rec, name)
            finally:
                self._set_status(JobStatus.SUSPENDED)
        self.require(JobStatus.RUNNING, "export a snapshot of")
        if not self.config.snapshots_enabled:
            raise JobStateError(
                f"job '{self.name}' runs with processing_guarantee='none' and takes no "
                "snapshots; submit it with 'at_least_once' or 'exactly_once' to export state")
        rec = self.take_snapshot(terminal=cancel)
        exported = self.store.export(rec, name)
        self.member.emit_event(self, f"snapshot exported as '{name}'")
        if cancel:
            self._stop_execution(StopReason.CANCEL)
        return exported

    def require(self, status: JobStatus, action: str) -> None:
        """Raises JobStateError naming the current state unless the job is in ``status``."""
        with self._lock:
            if self.status != status:
                raise JobStateError(f"cannot {action} job '{self.name}': it is "
                                    f"{self.status.value}, not {status.value}")

    def join(self, timeout: float | None = None) -> None:
        if not self._ended.wait(timeout):
            raise TimeoutError(f"job '{self.name}' still {self.status.value} after {timeout} s")
        if self.error is not None:
            raise self.error

    def is_done(self) -> bool:
        return self._ended.is_set()

    def wait_ended(self, timeout: float | None) -> bool:
        """Waits until the job COMPLETED or FAILED; False on timeout."""
        return self._ended.wait(timeout)

    def running_tasklets(self) -> list:
        """The tasklets of the current execution (empty when none runs)."""
        execution = self._execution
        if execution is None or execution.finished.is_set():
            return []
        return list(execution.tasklets)

    # --- the cluster's coordinator changes --------------------------------------------------

    def running_execution(self) -> DistributedExecution | None:
        """The execution running now; None when none runs."""
        execution = self._execution
        if isinstance(execution, DistributedExecution) and not execution.finished.is_set():
            return execution
        return None

    def abandon(self) -> None:
        """This member is no longer the cluster's coordinator: stops coordinating the job
        without writing anything (the new coordinator resumes it from its records)."""
        self.deposed = True
        self.stop_retrying()
        self.member_changes.stop()
        self._stop_execution(StopReason.SHUTDOWN)

    def is_current(self, exec_key: str) -> bool:
        """Whether ``exec_key`` is the execution this coordinator prepares or runs."""
        if self.deposed or self.status.is_terminal or exec_key != self.current_exec_key:
            return False
        execution = self._execution
        return not (isinstance(execution, DistributedExecution)
                    and execution.exec_key == exec_key and execution.finished.is_set())

    def metrics(self) -> dict[str, dict[str, float]]:
        """Items in and out per vertex (with the other counters its processors keep), and per
        stateless stage fused into a vertex, by the stage's name: every stage the user wrote
        is there, under its own name or as the vertex named after it. Counts are the current
        (or last) execution's, on every member it runs on."""
        execution = self._execution
        # call latency percentiles are derived from the summed histogram (they do not add up)
        return {} if execution is None else with_percentiles(execution.metrics())

    def stage_metrics(self) -> dict[str, StageMetrics]:
        """Items in and out of each stateless stage fused into a vertex, summed over the
        processors that run it on this member."""
        execution = self._execution
        return {} if execution is None else stage_counts(execution.tasklets)

    def vertex_metrics(self) -> dict[str, dict[str, float]]:
        """Items in and out per vertex, summed over the vertex's processors on this member,
        with the other counters they keep in ``context.metrics``."""
        execution = self._execution
        return {} if execution is None else vertex_counts(execution.tasklets)


def _raised(error: BaseException, cls: type[BaseException]) -> bool:
    """Whether a member's call raised ``cls``: this member's own in-process, another's named
    by the network's error."""
    return isinstance(error, cls) or (isinstance(error, RemoteCallError) and error.raised(cls))


def start_failure(job: str, failed: dict[str, BaseException]) -> BaseException:
    """The error a start that failed on some members raises: restartable when every failure
    is, by the one verdict every path uses (is_restartable_cause; a member judges its own
    error and the network carries the verdict), so the job retries with back-off."""
    text = "; ".join(f"member {m}: {e}" for m, e in failed.items())
    restartable = all(is_restartable_cause(e) for e in failed.values())
    message = f"job '{job}' could not start on every member: {text}"
    return RestartableError(message) if restartable else MemberExecutionError(message)
