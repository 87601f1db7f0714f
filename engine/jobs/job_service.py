"""The jobs of a member (Jet's JobCoordinationService): submitted, listed, found, resumed when
the member starts (or becomes a cluster's coordinator), their events told to listeners, their
records written again after a failed write, and stopped when the member shuts down."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from jetwake.engine.core.errors import JobNotFoundError, SnapshotNotFoundError
from jetwake.engine.jobs.job import Job
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_coordinator import JobCoordinator, compile_definition
from jetwake.engine.jobs.upgrade_plan import UpgradePlan, plan_upgrade
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.jobs.stop_reason import StopReason

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.jobs.job_records import JobRecord
    from jetwake.engine.jobs.member_context import MemberContext

__all__ = ["JobService", "new_job_id"]

log = logging.getLogger("jetwake.member")


def new_job_id() -> str:
    """A 64-bit random id, formatted like Jet's: 0123-4567-89ab-cdef."""
    h = secrets.token_hex(8)
    return "-".join(h[i:i + 4] for i in range(0, 16, 4))


class JobService:
    """The jobs of ``member`` (see the module doc)."""

    def __init__(self, member: "MemberContext") -> None:
        self.member = member
        self._jobs: dict[str, JobCoordinator] = {}
        self._lock = threading.RLock()
        self._listeners: list[Callable[[str, str, str], None]] = []
        # jobs whose record could not be written (a full disk): written again with back-off
        self._stale_records: set[JobCoordinator] = set()
        self._record_writer: threading.Thread | None = None
        self._stopping = threading.Event()
        #: job id -> why its record could not be turned into a job at this start (the record
        #: is kept as it is, so a start with the problem fixed resumes it)
        self.recovery_errors: dict[str, str] = {}

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

    # --- submitting --------------------------------------------------------------------------

    def add(self, pipeline: Any, config: JobConfig | None = None) -> JobCoordinator:
        """Checks and registers a job and saves its definition, without starting it (its
        ``start(restore="initial", persist_definition=False)`` does). A submission refused
        here leaves nothing behind."""
        member = self.member
        if config is None:
            config = JobConfig()
        elif not isinstance(config, JobConfig):
            raise TypeError(f"new_job() expects a JobConfig, got {type(config).__qualname__}")
        if config.state_backend == "rocksdb" and member.data_dir is None:
            raise ValueError("JobConfig(state_backend='rocksdb') keeps state on disk and needs a "
                             "member with a data directory: Member(data_dir=...)")
        name = config.initial_snapshot_name
        saved = member.snapshot_store.get_export(name) if name else None
        if name and saved is None:
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
            coordinator = JobCoordinator(member, new_job_id(), pipeline, config)
            if saved is not None and not config.allow_state_drop:
                # refused before it is registered: a job that would drop saved state
                plan = plan_upgrade(coordinator.dag, saved)
                if plan.drops_state:
                    raise plan.refusal(coordinator.name)
            self._jobs[coordinator.job_id] = coordinator
        try:
            coordinator.save_definition()
        except BaseException as e:
            # not saved: the job was never submitted (a full disk, say), nothing is left of it
            with self._lock:
                self._jobs.pop(coordinator.job_id, None)
            member.job_records.delete(coordinator.job_id)
            e.add_note(f"jetwake: the job was not submitted: its definition could not be saved "
                       f"in {member.data_dir}")
            raise
        return coordinator

    def default_parallelism(self, config: JobConfig) -> int:
        """Processors per vertex of a job of ``config`` where its stages set no number."""
        lp = config.local_parallelism
        return lp if lp > 0 else self.member.default_local_parallelism

    def plan_upgrade(self, pipeline: Any, config: JobConfig) -> UpgradePlan:
        """What a job of ``pipeline`` started from ``config.initial_snapshot_name`` does with
        its saved state (the dry run: nothing is registered or started)."""
        name = config.initial_snapshot_name
        saved = self.member.snapshot_store.get_export(name) if name else None
        if saved is None:
            raise SnapshotNotFoundError(
                f"no exported snapshot named '{name}' (JobConfig.initial_snapshot_name); "
                "member.snapshots() lists them")
        return plan_upgrade(compile_definition(pipeline, self.default_parallelism(config)),
                            saved, config.allow_state_drop)

    def add_light(self, job_id: str, pipeline: Any, config: JobConfig) -> JobCoordinator:
        """Registers a light job (no snapshots, no record) under ``job_id``."""
        with self._lock:
            c = JobCoordinator(self.member, job_id, pipeline, config, light=True)
            self._jobs[c.job_id] = c
        return c

    # --- finding -----------------------------------------------------------------------------

    def _find_by_name(self, name: str) -> JobCoordinator | None:
        found = [c for c in self._jobs.values() if c.name == name]
        if not found:
            return None
        active = [c for c in found if not c.status.is_terminal]
        return (active or sorted(found, key=lambda c: c.submission_time))[-1]

    def find(self, name_or_id: str) -> JobCoordinator | None:
        """The coordinator of the job with this id, or of the newest job with this name."""
        with self._lock:
            return self._jobs.get(name_or_id) or self._find_by_name(name_or_id)

    def get(self, name_or_id: str) -> Job | None:
        """The job with this id, or the newest job with this name; None if there is none."""
        c = self.find(name_or_id)
        return Job(c) if c is not None else None

    def job(self, name_or_id: str) -> Job:
        """Like :meth:`get` but raises :class:`JobNotFoundError` for an unknown job."""
        job = self.get(name_or_id)
        if job is None:
            raise JobNotFoundError(f"no job with name or id '{name_or_id}' on this member")
        return job

    def coordinators(self) -> list[JobCoordinator]:
        """Every job's coordinator, oldest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda c: c.submission_time)

    def known_ids(self) -> set[str]:
        with self._lock:
            return set(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    # --- resuming ----------------------------------------------------------------------------

    def recover(self, records: "list[JobRecord]", definitions: Any) -> None:
        """Turns job records into jobs; those that were running resume from their last
        snapshot, each on its own (see JobCoordinator.recover). ``definitions`` loads a job's
        definition by id (a record store)."""
        to_resume: list[tuple[JobCoordinator, str]] = []
        for rec in records:
            try:
                definition = definitions.load_definition(rec.job_id)
                config = JobConfig.from_dict(rec.config)
                c = JobCoordinator(self.member, rec.job_id, definition, config,
                                   rec.submission_time)
            except Exception as e:  # noqa: BLE001 - one job must not stop the others
                text = f"{type(e).__name__}: {e}"
                self.recovery_errors[rec.job_id] = text
                log.error("job %s (%s) cannot be loaded and is left out of this member; its "
                          "record is kept, so a start with the problem fixed resumes it: %s",
                          rec.name, rec.job_id, text)
                continue
            with self._lock:
                self._jobs[c.job_id] = c
            if c.load_record(rec):
                to_resume.append((c, rec.status))
        for c, was in to_resume:
            log.info("job %s (%s) was %s when the member stopped: resuming it", c.name,
                     c.job_id, was)
            c.recover()

    def abandon_all(self, keep: Callable[[JobCoordinator], bool]) -> int:
        """Stops coordinating every job but those ``keep`` accepts, writing nothing (this
        member is no longer a cluster's coordinator); how many it gave up."""
        with self._lock:
            jobs = [c for c in self._jobs.values() if not keep(c)]
            for c in jobs:
                self._jobs.pop(c.job_id, None)
        for c in jobs:
            c.abandon()
        return len(jobs)

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
            pass  # the member is shutting down: stop() makes the last attempt
        finally:
            with self._lock:
                if self._record_writer is threading.current_thread():
                    self._record_writer = None

    # --- stopping ----------------------------------------------------------------------------

    def stop_all(self, graceful: bool, timeout: float) -> list[str]:
        """Stops every job for the member's shutdown (see Member.shutdown); the names of the
        jobs that did not stop within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        stuck: list[str] = []
        for c in self.coordinators():
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
        return stuck

    def stop_background_writes(self) -> None:
        """No record is written again in the background (the member stops; see
        :meth:`write_stale_records`)."""
        self._stopping.set()

    def stop_retrying(self) -> None:
        """No job retries a start any more, nor is a record written again (a member start
        that failed)."""
        self._stopping.set()
        for c in self.coordinators():
            c.stop_retrying()

    def write_stale_records(self) -> None:
        """The last attempt to write the records that could not be written (at shutdown)."""
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
