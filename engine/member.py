"""Member: one jetwake process that runs jobs and holds named maps and lists.

``Member()`` runs embedded in the calling process, everything in memory. ``Member(data_dir)``
keeps maps, job records and snapshots under ``data_dir``.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from typing import Any, Callable

from .errors import JobNotFoundError, SnapshotNotFoundError
from .execution.service import ExecutionService
from .job import Job
from .job_config import JobConfig
from .job_coordinator import JobCoordinator
from .job_status import JobStatus
from .named_list import NamedList

log = logging.getLogger("jetwake.member")

# statuses in which a job was running when its member stopped: it resumes on the next start
_WAS_RUNNING = {JobStatus.STARTING.value, JobStatus.RUNNING.value, JobStatus.COMPLETING.value,
                JobStatus.NOT_RUNNING.value}

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
    """

    def __init__(self, data_dir: str | os.PathLike | None = None, *,
                 cooperative_threads: int | None = None, local_parallelism: int | None = None,
                 journal_capacity: int = 1_000_000) -> None:
        from ..snapshot.job_records import JobRecordStore
        from ..snapshot.maps import MapStore
        from ..snapshot.store import SnapshotStore

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
        if self.data_dir is not None:
            os.makedirs(self.data_dir, exist_ok=True)
        self.default_local_parallelism = lp
        self.execution_service = ExecutionService(threads)
        self._maps = MapStore(self.data_dir, journal_capacity=journal_capacity)
        self._lists: dict[str, NamedList] = {}
        self._jobs: dict[str, JobCoordinator] = {}
        self._lock = threading.RLock()
        self._shut_down = False
        self.snapshot_store = SnapshotStore(self.data_dir)
        self.job_records = JobRecordStore(self.data_dir)
        self._listeners: list[Callable[[str, str, str], None]] = []
        if self.data_dir is not None:
            self._recover_jobs()

    def _recover_jobs(self) -> None:
        """Loads the job records of the data directory; jobs that were running resume from
        their last snapshot."""
        for rec in self.job_records.load_all():
            definition = self.job_records.load_definition(rec.job_id)
            known = JobConfig.__dataclass_fields__
            config = JobConfig(**{k: v for k, v in rec.config.items() if k in known})
            c = JobCoordinator(self, rec.job_id, definition, config, rec.submission_time)
            c.completion_time = rec.completion_time
            c.failure_text = rec.failure
            c.restart_count = rec.extra.get("restart_count", 0)
            self._jobs[c.job_id] = c
            if rec.status in _WAS_RUNNING:
                log.info("job %s (%s) was %s when the member stopped: resuming it", c.name,
                         c.job_id, rec.status)
                c.restart_count += 1
                c.start(restore="latest", persist_definition=False)
            else:
                c.status = JobStatus(rec.status)
                if c.status.is_terminal:
                    c._ended.set()

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
        self._check_running()
        if config is None:
            config = JobConfig()
        elif not isinstance(config, JobConfig):
            raise TypeError(f"new_job() expects a JobConfig, got {type(config).__qualname__}")
        if config.state_backend == "rocksdb" and self.data_dir is None:
            raise ValueError("JobConfig(state_backend='rocksdb') keeps state on disk and needs a "
                             "member with a data directory: Member(data_dir=...)")
        with self._lock:
            if config.name is not None:
                existing = self._find_by_name(config.name)
                if existing is not None and not existing.status.is_terminal:
                    raise ValueError(
                        f"a job named '{config.name}' already exists and is "
                        f"{existing.status.value}; choose another name or cancel that job")
            coordinator = JobCoordinator(self, new_job_id(), pipeline, config)
            self._jobs[coordinator.job_id] = coordinator
        coordinator.start(restore="initial")
        return Job(coordinator)

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

    def get_map(self, name: str):
        """The named map (created empty on first use): a Mapping with put/remove/..."""
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

        With a data directory (and by default), jobs with a processing guarantee are suspended
        with a terminal snapshot and marked to resume on the next start; other running jobs
        are cancelled. Without a data directory running jobs are cancelled.
        """
        if self._shut_down:
            return
        self._shut_down = True
        if graceful is None:
            graceful = self.data_dir is not None
        for c in list(self._jobs.values()):
            if c.status.is_terminal or c.status == JobStatus.SUSPENDED:
                continue
            if c.is_stopping:  # already being cancelled or suspended: let it end
                c.wait_for_status({JobStatus.SUSPENDED, JobStatus.FAILED,
                                   JobStatus.COMPLETED}, 10)
                continue
            try:
                if graceful and c.config.snapshots_enabled and c.status == JobStatus.RUNNING:
                    c.suspend()
                    c.wait_for_status({JobStatus.SUSPENDED}, 30)
                    c.mark_resume_on_start()
                else:
                    c.cancel()
                    c._ended.wait(5)
            except Exception:  # noqa: BLE001 - shutting down regardless
                log.exception("stopping job %s", c.name)
        self.execution_service.shutdown()
        self._maps.close()

    def __enter__(self) -> "Member":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        where = self.data_dir or "in memory"
        return f"Member({where}, {len(self._jobs)} jobs)"
