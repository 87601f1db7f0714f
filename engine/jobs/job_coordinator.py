"""Runs one job on the member: plans it, runs its executions, snapshots it, and restarts it.

This is the coordinator side of a job (Jet's MasterContext). It owns the job's status and is
the only place that changes it. An *execution* is one run of the job's processors; a job may
have several (restart, suspend/resume, recovery after a crash), each restoring the last good
snapshot.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from typing import TYPE_CHECKING, Any

from jetwake.engine.jobs.job_records import JobRecord
from jetwake.engine.jobs.member_share import close_quietly, prepare_share
from jetwake.engine.jobs.restore_plan import damaged_export_error, restore_candidates
from jetwake.snapshot.store.snapshot_store import (
    CommitRecord, SnapshotDamagedError,
)
from jetwake.engine.core.dag import DAG
from jetwake.engine.core.errors import (
    FallbackRefusedError, JobCancelledError, JobStateError, is_restartable_cause,
)
from jetwake.engine.execution.plan import PlanContext
from jetwake.engine.execution.execution_service import Execution
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.jobs.execution_driver import ExecutionDriver, SnapshotCommit, SnapshotPhases
from jetwake.engine.jobs.snapshot_driver import SnapshotDriver
from jetwake.engine.jobs.snapshot_history import SnapshotHistory
from jetwake.engine.jobs.stop_reason import StopReason
from jetwake.engine.execution.execution_metrics import StageMetrics, stage_counts, vertex_counts
from jetwake.engine.pipeline.fusion import fused_stage_of
from jetwake.snapshot.protocol.snapshot_context import SnapshotContext
from jetwake.snapshot.state.keyed_state import in_memory_state_factory
from jetwake.snapshot.state.rocksdb_backend import RocksDBStateBackend

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.jobs.member import Member

__all__ = ["JobCoordinator", "compile_definition", "state_factory"]

log = logging.getLogger("jetwake.job")

# a start that fails for a restartable cause is tried again after 0.5 s, 1 s, 2 s, ... up to
# this much between attempts, until it succeeds, the job is cancelled or the member shuts down
RESTART_BACKOFF_FIRST_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0
# failed attempts beyond the first three are logged at most this often (each is still an event)
_RETRY_LOG_EVERY_S = 60.0



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
    def __init__(self, member: "Member", job_id: str, definition: Any, config: JobConfig,
                 submission_time: float | None = None) -> None:
        self.member = member
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
        self.restart_attempts = 0  # start attempts of the restart in progress
        self._retry_stop = threading.Event()  # restarts stop retrying: cancel, member shutdown
        self._retrier: threading.Thread | None = None
        self._retry_failure = False  # failure_text says why a restart attempt failed
        self._last_retry_log = 0.0
        # set by a graceful member shutdown: the record says "running" unless the job ends
        self._resume_on_start = False
        self._terminal_committed = False  # the shutdown's terminal snapshot committed
        self.dag: DAG = self._compile()

    def _compile(self) -> DAG:
        return compile_definition(self.definition, self._default_parallelism())

    def _default_parallelism(self) -> int:
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

    def _save_record(self, definition: Any = None, *, raise_errors: bool = False) -> bool:
        """Writes the job record (and the definition, when given); True when written.

        An OSError (a full disk) is raised with ``raise_errors``; otherwise it is reported
        (``record_error``, a log line, an event) and the member writes the record again with
        back-off until it succeeds, so the status on disk catches up once there is space."""
        records = self.member.job_records
        if not records.persistent:
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
        return {"restart_count": self.restart_count}

    def restore_record_extra(self, extra: dict) -> None:
        self.restart_count = extra.get("restart_count", 0)

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
                self.restart_attempts = 0
                self.status = JobStatus.RUNNING
                self._state_changed.notify_all()
        if reason != StopReason.NONE:
            self._discard(execution)
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
        self._launch(execution)
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
                self.failure_text = (f"{text} (start attempt {max(1, self.restart_attempts)} "
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

    # --- how an execution is made and run: a job of a cluster overrides these ----------------

    @property
    def _accepts_fallback(self) -> bool:
        """The user accepted, for this start, duplicates from a fallback past a damaged
        snapshot (resume(accept_at_least_once_on_fallback=True))."""
        return self._accept_fallback_once

    def _prepare_execution(self, restore: str) -> tuple[Any, Any, str]:
        """Builds, initializes and restores an execution; returns it, the coordinator's side
        of its snapshots (None without snapshots) and what it was restored from."""
        tasklets, snapshot, desc = self._start_tasklets(restore)
        execution = Execution(self.name, tasklets, self._on_execution_end, snapshot)
        if snapshot is not None:
            snapshot.attach(tasklets)
        return execution, snapshot, desc

    def _discard(self, execution: Any) -> None:
        """Drops an execution that was prepared but never launched."""
        close_quietly(execution.tasklets)

    def _launch(self, execution: Any) -> None:
        assert self.member.execution_service is not None  # a started member
        self.member.execution_service.submit(execution)

    def _execution_description(self, execution: Any) -> str:
        return f"{len(execution.tasklets)} processors"

    def new_snapshot_writer(self, snapshot_id: int, terminal: bool) -> SnapshotCommit:
        """The writer that commits snapshot ``snapshot_id`` (SnapshotOwner)."""
        return self.store.writer(self.job_id, self.name, snapshot_id, terminal)

    def _start_tasklets(self, restore: str) -> tuple[list, SnapshotContext | None, str]:
        """Builds and initializes the processors and restores the newest good snapshot into
        them; a snapshot found damaged on the way is skipped (see restore_plan)."""
        self.store.remove_staging(self.job_id)
        damaged: list[str] = []
        for rec, desc in restore_candidates(self.store, self.job_id, self.config, restore):
            reader = self.store.reader(rec) if rec is not None else None
            if reader is not None:
                try:
                    reader.verify()
                except SnapshotDamagedError as e:
                    assert rec is not None  # the reader's
                    damaged.append(self._skip_damaged(rec, e, restore))
                    continue
            restored_id = rec.snapshot_id if rec is not None and rec.name is None else -1
            snapshot = SnapshotContext(
                restored_id, self.store.staging_dir(self.job_id, self.execution_count)) \
                if self.config.snapshots_enabled else None
            try:
                tasklets = prepare_share(self.dag, self._plan_context(snapshot), self.config,
                                         reader, desc, damaged, self._accept_fallback_once)
            except SnapshotDamagedError as e:
                assert rec is not None  # raised by the reader's data
                damaged.append(self._skip_damaged(rec, e, restore))
                continue
            if rec is not None and rec.name is None:
                self.last_snapshot = rec
            return tasklets, snapshot, desc if rec is not None else ""
        raise AssertionError("unreachable: the last candidate is a start without state")

    def _skip_damaged(self, rec: CommitRecord, error: Exception, restore: str) -> str:
        """Reports a damaged snapshot the restore skips; how the next attempt names it."""
        refused = damaged_export_error(rec, error)
        if refused is not None:  # an export the user asked for: no silent fallback
            raise refused from error
        log.warning("job %s: snapshot %d is damaged (%s); falling back to the previous good "
                    "snapshot", self.name, rec.snapshot_id, error)
        self.member.emit_event(self, f"snapshot {rec.snapshot_id} is damaged: {error}")
        return f"snapshot {rec.snapshot_id} ({error})"

    def _plan_context(self, snapshot: SnapshotContext | None) -> PlanContext:
        """How this member's processors of the job are built (the only member)."""
        return PlanContext(job_id=self.job_id, job_name=self.name,
                           processing_guarantee=self.config.processing_guarantee,
                           default_parallelism=self._default_parallelism(),
                           member=self.member, snapshot=snapshot,
                           state_factory=self._state_factory(),
                           state_backend=self.config.state_backend,
                           snapshot_interval_ms=self.config.snapshot_interval_ms
                           if self.config.snapshots_enabled else 0)

    def _state_factory(self):
        """Creates each processor's keyed state store, per JobConfig.state_backend."""
        return state_factory(self.member.data_dir, self.job_id, self.config,
                             f"execution-{self.restart_count}-{time.monotonic_ns()}")

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
        self._start_retrier(attempts_done=0)

    def _start_retrier(self, attempts_done: int) -> None:
        thread = threading.Thread(target=self._restart, args=(attempts_done,), daemon=True,
                                  name=f"jetwake-restart-{self.name}")
        self._retrier = thread
        thread.start()

    def recover(self) -> None:
        """Resumes, at member start, a job that was running when its member stopped. One
        attempt now; when it fails for a restartable cause the job is NOT_RUNNING (its failure
        says why) and the attempts go on in the background with back-off; a permanent cause
        marks the job FAILED with that cause. Never raises: one job that cannot start must
        not keep the member from recovering the others."""
        self.restart_count += 1
        self.restart_attempts = 1
        try:
            self.start(restore="latest", persist_definition=False,
                       on_restartable=JobStatus.NOT_RUNNING)
            return
        except Exception as e:  # noqa: BLE001 - reported below, the member goes on
            error = e
        if self.status == JobStatus.NOT_RUNNING and is_restartable_cause(error) \
                and not self._retry_stop.is_set():
            self._report_failed_attempt(1, error, RESTART_BACKOFF_FIRST_S)
            self._start_retrier(attempts_done=1)
        else:
            log.error("job %s (%s) could not be resumed: %s", self.name, self.job_id,
                      self.failure_text or repr(error))

    def _restart(self, attempts_done: int = 0) -> None:
        """Starts a new execution from the last snapshot. A failure for a restartable cause
        (:func:`is_restartable_cause`) is retried with exponential back-off until the job
        runs, is cancelled, or the member shuts down; in between the job is NOT_RUNNING, its
        failure text says why and each failed attempt is an event. A permanent cause fails the
        job (start() marks it)."""
        from tenacity import Retrying, retry_if_exception, wait_exponential

        count = attempts_done

        def attempt() -> None:
            nonlocal count
            if self._retry_stop.is_set():
                raise JobStateError(f"job '{self.name}': restart abandoned (cancelled, or the "
                                    "member is shutting down)")
            count += 1
            self.restart_attempts = count
            self.start(restore="latest", persist_definition=False,
                       on_restartable=JobStatus.NOT_RUNNING)

        def report(state: Any) -> None:
            self._report_failed_attempt(count, state.outcome.exception(),
                                        state.next_action.sleep)

        if attempts_done:  # the first attempt was made by the caller: wait before the next
            self._retry_stop.wait(RESTART_BACKOFF_FIRST_S)
        retrying = Retrying(
            retry=retry_if_exception(is_restartable_cause),
            wait=wait_exponential(multiplier=RESTART_BACKOFF_FIRST_S, max=RESTART_BACKOFF_MAX_S),
            # cut short by a cancel or a member shutdown (tenacity ignores wait()'s result)
            sleep=self._retry_stop.wait,  # type: ignore[arg-type]
            before_sleep=report, reraise=True)
        try:
            retrying(attempt)
        except BaseException as e:  # noqa: BLE001 - start() marked the job; say why here
            if self._retry_stop.is_set():
                log.info("job %s: restart stopped (%s)", self.name, e)
            else:
                log.error("job %s could not restart: %s", self.name,
                          self.failure_text or repr(e))
        with self._lock:
            # stopped before an attempt began: the execution is gone, so it is not running
            stale = self.status in (JobStatus.RUNNING, JobStatus.STARTING) \
                and (self._execution is None or self._execution.finished.is_set())
        if stale:
            self._set_status(JobStatus.NOT_RUNNING)

    def _report_failed_attempt(self, attempt: int, error: BaseException | None,
                               delay: float) -> None:
        text = f"{type(error).__name__}: {error}"
        self.member.emit_event(self, f"start attempt {attempt} failed ({text}); retrying in "
                                     f"{delay:.1f} s")
        now = time.monotonic()
        if attempt <= 3 or now - self._last_retry_log >= _RETRY_LOG_EVERY_S:
            self._last_retry_log = now
            log.warning("job %s: start attempt %d failed (%s); retrying in %.1f s%s", self.name,
                        attempt, text, delay,
                        "" if attempt < 3 else " (further attempts are logged at most once a "
                        "minute; each is a job event)")

    def _finish(self, status: JobStatus, error: BaseException | None) -> None:
        with self._lock:
            if self.status.is_terminal:
                return
            self.error = error
            if error is not None and self.failure_text is None:
                self.failure_text = f"{type(error).__name__}: {error}"
            self.completion_time = time.time()
        self._retry_stop.set()
        self._remove_state_dirs()
        self._set_status(status)
        self._ended.set()

    def _finish_cancelled(self) -> None:
        self._retry_stop.set()
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

    def _claim_stop(self, reason: StopReason,
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

    def _stop_retrying(self) -> None:
        """A restart waiting to retry gives up; none is tried again."""
        self._retry_stop.set()

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
        self._retry_stop.set()
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
        self._retry_stop.set()
        self._stop_execution(StopReason.SHUTDOWN)
        if status == JobStatus.NOT_RUNNING:
            self._save_record()  # says RUNNING now: resume on the next start
        ended = self.wait_for_status(
            {JobStatus.SUSPENDED, JobStatus.NOT_RUNNING, JobStatus.FAILED,
             JobStatus.COMPLETED}, max(0.0, deadline - time.monotonic()))
        retrier = self._retrier
        if retrier is not None and retrier is not threading.current_thread():
            retrier.join(max(0.0, deadline - time.monotonic()))
            ended = ended and not retrier.is_alive()
        return ended

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

    def metrics(self) -> dict[str, dict[str, float]]:
        """Items in and out per vertex (with the other counters its processors keep), and per
        stateless stage fused into a vertex, by the stage's name: every stage the user wrote
        is there, under its own name or as the vertex named after it. Counts are the current
        (or last) execution's, on every member it runs on."""
        execution = self._execution
        return {} if execution is None else execution.metrics()

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
