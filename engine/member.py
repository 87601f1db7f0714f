"""Member: one jetwake process that runs jobs and holds named maps and lists.

``Member()`` runs embedded in the calling process, everything in memory. ``Member(data_dir)``
keeps maps, job records and snapshots under ``data_dir``.
"""

from __future__ import annotations

import os
import secrets
import threading
from typing import Any

from .errors import JobNotFoundError
from .execution.service import ExecutionService
from .job import Job
from .job_config import JobConfig
from .job_coordinator import JobCoordinator
from .named_list import NamedList

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
    """An embedded member: ``with Member() as m: m.new_job(pipeline).join()``."""

    def __init__(self, data_dir: str | os.PathLike | None = None, *,
                 cooperative_threads: int | None = None, local_parallelism: int | None = None,
                 journal_capacity: int = 1_000_000) -> None:
        from ..snapshot.maps import MapStore

        cpus = os.cpu_count() or 1
        threads = cooperative_threads if cooperative_threads is not None else min(2, cpus)
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"cooperative_threads must be a positive int, got {threads!r}")
        lp = local_parallelism if local_parallelism is not None else min(2, cpus)
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

    # --- jobs ------------------------------------------------------------------------------

    def new_job(self, pipeline: Any, config: JobConfig | None = None) -> Job:
        """Submits a Pipeline (or a core-API DAG) and starts it; returns its Job."""
        self._check_running()
        if config is None:
            config = JobConfig()
        elif not isinstance(config, JobConfig):
            raise TypeError(f"new_job() expects a JobConfig, got {type(config).__qualname__}")
        with self._lock:
            if config.name is not None:
                existing = self._find_by_name(config.name)
                if existing is not None and not existing.status.is_terminal:
                    raise ValueError(
                        f"a job named '{config.name}' already exists and is "
                        f"{existing.status.value}; choose another name or cancel that job")
            coordinator = JobCoordinator(self, new_job_id(), pipeline, config)
            self._jobs[coordinator.job_id] = coordinator
        coordinator.start()
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

    def jobs(self) -> list[Job]:
        """Every job this member knows, oldest first."""
        with self._lock:
            coords = sorted(self._jobs.values(), key=lambda c: c.submission_time)
        return [Job(c) for c in coords]

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

    def shutdown(self) -> None:
        """Cancels running jobs and stops the member's threads."""
        if self._shut_down:
            return
        self._shut_down = True
        for c in list(self._jobs.values()):
            if not c.status.is_terminal:
                try:
                    c.cancel()
                    c._ended.wait(5)
                except Exception:  # noqa: BLE001 - shutting down regardless
                    pass
        self.execution_service.shutdown()
        self._maps.close()

    def __enter__(self) -> "Member":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        where = self.data_dir or "in memory"
        return f"Member({where}, {len(self._jobs)} jobs)"
