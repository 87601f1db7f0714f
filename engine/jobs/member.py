"""Member: one jetwake process that runs jobs and holds named maps and lists.

``Member()`` runs embedded in the calling process, everything in memory. ``Member(data_dir)``
keeps maps, job records and snapshots under ``data_dir``, which it locks for its whole life:
one data directory, one member (see engine/jobs/data_dir_lock.py).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from jetwake.engine.jobs.data_dir_lock import DataDirectoryLock
from jetwake.engine.core.errors import JobNotFoundError, SnapshotNotFoundError
from jetwake.engine.execution.execution_service import ExecutionService
from jetwake.engine.jobs.execution_messages import (
    ExecutionEnded, ExecutionMessage, decode, decode_request,
)
from jetwake.engine.jobs.execution_participant import ExecutionParticipant
from jetwake.engine.jobs.job import Job
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_coordinator import JobCoordinator
from jetwake.engine.jobs.stop_reason import StopReason
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.data.named_list import NamedList

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.jobs.job_records import JobRecordStore
    from jetwake.snapshot.store.snapshot_store import CommitRecord, SnapshotStore

log = logging.getLogger("jetwake.member")


# how long a graceful shutdown waits for all jobs to stop (terminal snapshots included)
SHUTDOWN_TIMEOUT_S = 60.0

__all__ = ["Member"]


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what} name must be a non-empty string, got {name!r}")
    return name


def new_job_id() -> str:
    """A 64-bit random id, formatted like Jet's: 0123-4567-89ab-cdef."""
    h = secrets.token_hex(8)
    return "-".join(h[i:i + 4] for i in range(0, 16, 4))


class Member:
    """An embedded member: ``with Member() as m: m.new_job(pipeline).join()``.

    ``local_parallelism``: processors per vertex when a stage or job sets none (default 1).
    ``cooperative_threads``: worker threads for cooperative tasklets (default 2).
    ``journal_capacity``: events kept in each map's event journal.

    With a data directory the member locks it (another member on it fails at once with
    :class:`DataDirectoryLockedError`), removes RocksDB working state left by executions of a
    process that crashed, and resumes each job that was running, each on its own: a job that
    cannot start for a restartable cause keeps being retried with back-off, one with a
    permanent cause is marked FAILED, and neither keeps the others from running.

    A member alone is a cluster of one: its jobs' executions run through its own
    :class:`ExecutionParticipant`, which their coordinators call in-process, exactly as a
    cluster's coordinator calls the participants of every member.
    """

    #: the member's id in its cluster (a member alone has this one)
    member_id: str = "local"

    def __init__(self, data_dir: str | os.PathLike | None = None, *,
                 cooperative_threads: int | None = None, local_parallelism: int | None = None,
                 journal_capacity: int = 1_000_000) -> None:
        from jetwake.engine.data.named_maps import MapStore

        cpus = os.cpu_count() or 1
        threads = cooperative_threads if cooperative_threads is not None else min(2, cpus)
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"cooperative_threads must be a positive int, got {threads!r}")
        # one processor per vertex by default: under the GIL a member does about one core of
        # Python work, and more processors on one member cost switching, not speed (measured
        # in docs/performance.md); more cores are used by more members
        lp = local_parallelism if local_parallelism is not None else 1
        if not isinstance(lp, int) or lp < 1:
            raise ValueError(f"local_parallelism must be a positive int, got {lp!r}")
        self.data_dir = os.fspath(data_dir) if data_dir is not None else None
        self._dir_lock: DataDirectoryLock | None = None
        if self.data_dir is not None:
            os.makedirs(self.data_dir, exist_ok=True)
            # first of all: nothing in the directory is touched before it is ours
            self._dir_lock = DataDirectoryLock(self.data_dir)
            self._dir_lock.acquire()
        self.default_local_parallelism = lp
        self._lists: dict[str, NamedList] = {}
        self._jobs: dict[str, JobCoordinator] = {}
        self._lock = threading.RLock()
        self._shut_down = False
        self._listeners: list[Callable[[str, str, str], None]] = []
        # jobs whose record could not be written (a full disk): written again with back-off
        self._stale_records: set[JobCoordinator] = set()
        self._record_writer: threading.Thread | None = None
        self._stopping = threading.Event()
        #: job id -> why its record could not be turned into a job at this start (the record
        #: is kept as it is, so a start with the problem fixed resumes it)
        self.recovery_errors: dict[str, str] = {}
        self.execution_service: ExecutionService | None = None
        self._maps = None
        #: runs this member's share of every execution
        self.participant = ExecutionParticipant(self, self.member_id, None,
                                                self._report_end_in_process)
        try:
            self.execution_service = ExecutionService(threads)
            self._maps = MapStore(self.data_dir, journal_capacity=journal_capacity)
            self.snapshot_store = self._new_snapshot_store()
            self.job_records = self._new_job_records()
            if self.data_dir is not None:
                self._remove_stale_state()
                self._recover_jobs()
        except BaseException:
            self._abandon_start()
            raise

    def _new_job_records(self) -> "JobRecordStore":
        from jetwake.engine.jobs.job_records import JobRecordStore
        return JobRecordStore(self.data_dir)

    def _new_snapshot_store(self) -> "SnapshotStore":
        from jetwake.snapshot.store.snapshot_store import SnapshotStore
        return SnapshotStore(self.data_dir)

    # --- executions: the member as a cluster of one ------------------------------------------

    def execution_members(self) -> list[tuple[str, str]]:
        """The members an execution starting now runs on: (id, peer address)."""
        return [(self.member_id, "")]

    def call_execution(self, member_id: str, message: ExecutionMessage,
                       timeout: float) -> ExecutionMessage | None:
        """Delivers an execution's request to this member's participant, in-process through
        the encoding a cluster's members use, and decodes its reply (the ExecutionTransport of
        the job coordinators). An error raised by the participant reaches the caller as it
        is."""
        if member_id != self.member_id:
            raise ValueError(f"member {self.member_id} is alone: it has no member {member_id}")
        reply = self.participant.handle(decode_request(message.OP, [message.to_wire()]))
        reply_type = message.REPLY
        return None if reply is None or reply_type is None \
            else decode(reply_type, reply.to_wire())

    def _report_end_in_process(self, coordinator: str, ended: ExecutionEnded,
                               cause: BaseException | None) -> None:
        self.deliver_execution_end(decode(ExecutionEnded, ended.to_wire()), cause)

    def deliver_execution_end(self, ended: ExecutionEnded,
                              cause: BaseException | None = None) -> None:
        """A member's share of an execution ended: tells the execution, if it is still its
        job's current one (``cause``: the error itself, when it ended in this process)."""
        c = self.find_coordinator(ended.exec_key.split(".")[0])
        execution = c.running_execution() if c is not None else None
        if execution is not None and execution.exec_key == ended.exec_key:
            execution.member_ended(ended, cause)

    def publish_commit_record(self, rec: "CommitRecord") -> None:
        """Makes a snapshot's commit record readable by every member: a member alone is the
        only reader, and its store holds the record."""

    def note_unreachable(self, member_id: str) -> None:
        """A member of an execution did not answer (never, for a member alone)."""

    def _abandon_start(self) -> None:
        """Undoes a start that failed: nothing may keep the directory locked."""
        self._shut_down = True
        self._stopping.set()
        for c in list(self._jobs.values()):
            c.stop_retrying()
        if self.execution_service is not None:
            self.execution_service.shutdown()
        if self._maps is not None:
            self._maps.close()
        if self._dir_lock is not None:
            self._dir_lock.release()

    def _remove_stale_state(self) -> None:
        """Removes the RocksDB working state of every execution found: at member start none
        runs, and the directory lock guarantees no other member uses it, so it is what
        executions of a crashed process left behind (a restore rebuilds state from the
        snapshot, never from these)."""
        root = os.path.join(self.data_dir, "state")  # type: ignore[arg-type]
        try:
            jobs = os.listdir(root)
        except FileNotFoundError:
            return
        removed = 0
        for job_id in jobs:
            job_dir = os.path.join(root, job_id)
            try:
                executions = os.listdir(job_dir)
            except (NotADirectoryError, FileNotFoundError):
                continue
            removed += len(executions)
            shutil.rmtree(job_dir, ignore_errors=True)
        if removed:
            log.info("removed the RocksDB state of %d execution(s) that did not end cleanly "
                     "(in %s)", removed, root)

    def _recover_jobs(self, records: list | None = None) -> None:
        """Loads the job records (of the data directory, or ``records``); jobs that were
        running resume from their last snapshot, each on its own (see
        JobCoordinator.recover)."""
        to_resume: list[tuple[JobCoordinator, str]] = []
        if records is None:
            records = self.job_records.load_all()  # a damaged record is an error naming it
        for rec in records:
            try:
                definition = self.job_records.load_definition(rec.job_id)
                config = JobConfig.from_dict(rec.config)
                c = self._new_coordinator(rec.job_id, definition, config, rec.submission_time)
            except Exception as e:  # noqa: BLE001 - one job must not stop the others
                text = f"{type(e).__name__}: {e}"
                self.recovery_errors[rec.job_id] = text
                log.error("job %s (%s) cannot be loaded and is left out of this member; its "
                          "record is kept, so a start with the problem fixed resumes it: %s",
                          rec.name, rec.job_id, text)
                continue
            self._jobs[c.job_id] = c
            if c.load_record(rec):
                to_resume.append((c, rec.status))
        for c, was in to_resume:
            log.info("job %s (%s) was %s when the member stopped: resuming it", c.name,
                     c.job_id, was)
            c.recover()

    # --- job records that could not be written ------------------------------------------------

    def retry_record_later(self, coordinator: JobCoordinator) -> None:
        """Writes ``coordinator``'s job record again, with back-off, until it succeeds or the
        member shuts down (called when a write failed, a full disk say)."""
        with self._lock:
            self._stale_records.add(coordinator)
            if self._record_writer is not None or self._stopping.is_set():
                return
            self._record_writer = threading.Thread(target=self._write_stale_records_loop,
                                                   daemon=True, name="jetwake-job-records")
            self._record_writer.start()

    def _write_stale_records(self) -> int:
        """One attempt for every stale record; how many are still stale."""
        with self._lock:
            pending = list(self._stale_records)
        for c in pending:
            with self._lock:
                self._stale_records.discard(c)
            c.save_record()  # on failure it is added again
        with self._lock:
            left = len(self._stale_records)
            if not left:
                self._record_writer = None
            return left

    def _write_stale_records_loop(self) -> None:
        from tenacity import RetryError, Retrying, retry_if_result, wait_exponential

        retrying = Retrying(retry=retry_if_result(lambda left: left > 0),
                            wait=wait_exponential(multiplier=0.5, max=10.0),
                            stop=lambda _state: self._stopping.is_set(),
                            sleep=self._stopping.wait)  # type: ignore[arg-type]  # result unused
        try:
            retrying(self._write_stale_records)
        except RetryError:
            pass  # the member is shutting down: shutdown() makes the last attempt
        finally:
            with self._lock:
                if self._record_writer is threading.current_thread():
                    self._record_writer = None

    # --- events ----------------------------------------------------------------------------

    def add_listener(self, fn: Callable[[str, str, str], None]) -> None:
        """``fn(job_id, job_name, event)`` is called for every job lifecycle event."""
        self._listeners.append(fn)

    def emit_event(self, job: JobCoordinator, event: str) -> None:
        log.info("job %s (%s): %s", job.name, job.job_id, event)
        for fn in list(self._listeners):
            try:
                fn(job.job_id, job.name, event)
            except Exception:  # noqa: BLE001 - a listener must not break the job
                log.exception("job event listener failed")

    # --- jobs ------------------------------------------------------------------------------

    def new_job(self, pipeline: Any, config: JobConfig | None = None) -> Job:
        """Submits a Pipeline (or a core-API DAG) and starts it; returns its Job."""
        coordinator = self.add_job(pipeline, config)
        coordinator.start(restore="initial", persist_definition=False)
        return Job(coordinator)

    def add_job(self, pipeline: Any, config: JobConfig | None = None) -> JobCoordinator:
        """Checks and registers a job and saves its definition, without starting it (its
        ``start(restore="initial", persist_definition=False)`` does). :meth:`new_job` starts it
        at once; the member service starts it on a thread of its own, so that a client hears
        about the job while it starts. A submission refused here leaves nothing behind."""
        self._check_running()
        if config is None:
            config = JobConfig()
        elif not isinstance(config, JobConfig):
            raise TypeError(f"new_job() expects a JobConfig, got {type(config).__qualname__}")
        if config.state_backend == "rocksdb" and self.data_dir is None:
            raise ValueError("JobConfig(state_backend='rocksdb') keeps state on disk and needs a "
                             "member with a data directory: Member(data_dir=...)")
        name = config.initial_snapshot_name
        if name and self.snapshot_store.get_export(name) is None:
            raise SnapshotNotFoundError(
                f"no exported snapshot named '{name}' (JobConfig.initial_snapshot_name); "
                "member.snapshots() lists them")
        with self._lock:
            if config.name is not None:
                existing = self._find_by_name(config.name)
                if existing is not None and not existing.status.is_terminal:
                    raise ValueError(
                        f"a job named '{config.name}' already exists and is "
                        f"{existing.status.value}; choose another name or cancel that job")
            coordinator = self._new_coordinator(new_job_id(), pipeline, config)
            self._jobs[coordinator.job_id] = coordinator
        try:
            coordinator.save_definition()
        except BaseException as e:
            # not saved: the job was never submitted (a full disk, say), nothing is left of it
            with self._lock:
                self._jobs.pop(coordinator.job_id, None)
            self.job_records.delete(coordinator.job_id)
            e.add_note(f"jetwake: the job was not submitted: its definition could not be saved "
                       f"in {self.data_dir}")
            raise
        return coordinator

    def _new_coordinator(self, job_id: str, definition: Any, config: JobConfig,
                         submission_time: float | None = None) -> JobCoordinator:
        """The coordinator of a job of this member (a cluster member makes cluster-wide
        ones)."""
        return JobCoordinator(self, job_id, definition, config, submission_time)

    def _find_by_name(self, name: str) -> JobCoordinator | None:
        found = [c for c in self._jobs.values() if c.name == name]
        if not found:
            return None
        active = [c for c in found if not c.status.is_terminal]
        return (active or sorted(found, key=lambda c: c.submission_time))[-1]

    def get_job(self, name_or_id: str) -> Job | None:
        """The job with this id, or the newest job with this name; None if there is none."""
        with self._lock:
            c = self._jobs.get(name_or_id) or self._find_by_name(name_or_id)
        return Job(c) if c is not None else None

    def job(self, name_or_id: str) -> Job:
        """Like :meth:`get_job` but raises :class:`JobNotFoundError` for an unknown job."""
        job = self.get_job(name_or_id)
        if job is None:
            raise JobNotFoundError(f"no job with name or id '{name_or_id}' on this member")
        return job

    # the coordinators behind the Job handles, for the member's own services (network
    # service, metrics); user code works with Job
    def coordinators(self) -> list[JobCoordinator]:
        """Every job's coordinator, oldest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda c: c.submission_time)

    def find_coordinator(self, name_or_id: str) -> JobCoordinator | None:
        """The coordinator of the job with this id, or of the newest job with this name."""
        with self._lock:
            return self._jobs.get(name_or_id) or self._find_by_name(name_or_id)

    def jobs(self) -> list[Job]:
        """Every job this member knows, oldest first."""
        with self._lock:
            coords = sorted(self._jobs.values(), key=lambda c: c.submission_time)
        return [Job(c) for c in coords]

    # --- exported snapshots ------------------------------------------------------------------

    def snapshots(self) -> list:
        """The named (exported) snapshots, as commit records (name, job, time, size)."""
        return self.snapshot_store.exports()

    def delete_snapshot(self, name: str) -> None:
        """Deletes a named snapshot; raises SnapshotNotFoundError if there is none."""
        if not self.snapshot_store.delete_export(name):
            raise SnapshotNotFoundError(f"no exported snapshot named '{name}'")

    # --- data ------------------------------------------------------------------------------

    def sync_maps(self) -> None:
        """Makes every map change made so far durable; a snapshot calls it before its commit
        record, which may point into a map's journal (a map journal source's position) or
        count on its contents (a map sink under exactly-once). Raises OSError when a map's
        log cannot be synced (the snapshot then fails)."""
        maps = self._maps
        if maps is not None:
            maps.sync()

    def get_map(self, name: str):
        """The named map (created empty on first use): a Mapping with put/remove/..."""
        assert self._maps is not None  # a started member
        return self._maps.get_map(_check_name(name, "a map"))

    def get_list(self, name: str) -> NamedList:
        """The named list (created empty on first use), a Sequence."""
        _check_name(name, "a list")
        with self._lock:
            lst = self._lists.get(name)
            if lst is None:
                lst = self._lists[name] = NamedList(name)
            return lst

    # --- lifecycle -------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self._shut_down:
            raise RuntimeError("this member is shut down; create a new Member")

    def shutdown(self, graceful: bool | None = None) -> None:
        """Stops the member.

        With a data directory (and by default), every job with a processing guarantee that is
        running, starting or retrying a restart stops so that the next start resumes it: a
        running one takes a terminal snapshot first (if that fails, it resumes from its last
        good snapshot). Its record says it was running whatever happens, unless it completes
        or fails meanwhile. Other running jobs are cancelled; suspended jobs stay suspended.
        Without a data directory running jobs are cancelled.

        The data directory's lock is released when every job has stopped; if one did not stop
        within SHUTDOWN_TIMEOUT_S, the lock stays held until this process ends, since that job
        could still write into the directory.
        """
        if self._shut_down:
            return
        self._shut_down = True
        if graceful is None:
            graceful = self.data_dir is not None
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        stuck: list[str] = []
        for c in list(self._jobs.values()):
            remaining = max(0.0, deadline - time.monotonic())
            status, reason = c.status, c.stop_reason
            user_stop = reason in (StopReason.CANCEL, StopReason.SUSPEND)
            if status.is_terminal or status in (JobStatus.SUSPENDED,
                                                JobStatus.SUSPENDED_EXPORTING_SNAPSHOT):
                continue
            try:
                if user_stop:  # already being cancelled or suspended: let it end
                    ok = c.wait_for_status({JobStatus.SUSPENDED, JobStatus.FAILED,
                                            JobStatus.COMPLETED}, remaining)
                elif graceful and c.config.snapshots_enabled:
                    ok = c.stop_for_shutdown(remaining)
                else:
                    c.cancel()
                    ok = c.wait_ended(remaining)
            except Exception:  # noqa: BLE001 - shutting down regardless
                log.exception("stopping job %s", c.name)
                ok = c.wait_for_status({JobStatus.SUSPENDED, JobStatus.NOT_RUNNING,
                                        JobStatus.FAILED, JobStatus.COMPLETED}, remaining)
            if not ok:
                stuck.append(c.name)
        self._stopping.set()
        self._after_jobs_stopped()
        assert self.execution_service is not None  # a started member
        self.execution_service.shutdown()
        if self._maps is not None:
            self._maps.close()
        with self._lock:  # set and started in one step under the lock (retry_record_later)
            writer = self._record_writer
        if writer is not None:
            writer.join(5)
        if self._write_stale_records():
            with self._lock:
                names = sorted(c.name for c in self._stale_records)
            log.error("the job records of %s could not be written (%s); the data directory "
                      "keeps their earlier status", names,
                      "; ".join(c.record_error or "" for c in self._stale_records))
        if stuck:
            log.error("job(s) %s did not stop within %.0f s; their records say they resume on "
                      "the next start. The data directory stays locked until this process "
                      "ends, since they could still write into it", stuck, SHUTDOWN_TIMEOUT_S)
        elif self._dir_lock is not None:
            self._dir_lock.release()

    def _after_jobs_stopped(self) -> None:
        """Called by :meth:`shutdown` once its jobs have stopped, before the execution service
        stops (a cluster member leaves its cluster here)."""

    def __enter__(self) -> "Member":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        where = self.data_dir or "in memory"
        return f"Member({where}, {len(self._jobs)} jobs)"
