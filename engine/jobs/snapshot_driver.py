"""Takes a job's snapshots (Jet's MasterSnapshotContext): regular ones every interval,
terminal ones (suspend, rescale, shutdown) and exported ones, one at a time through one
request queue.

While an execution with snapshots runs, one thread serves the queue: it takes a regular
snapshot when the interval has passed since the end of the previous one, and every snapshot
asked for meanwhile in the order asked (the caller waits for its outcome). When no such thread
runs (the job is starting or stopping), a request is served on the caller's thread, still one
at a time.

It drives the two phases on every member of the execution (:class:`SnapshotPhases`), writes the commit point with the job's writer, keeps the last good snapshot,
the counts the metrics show and the history of the latest attempts. What it needs of the job
is :class:`SnapshotOwner`; it changes nothing of the job's status: a snapshot that cannot
complete raises, and the job's lifecycle decides.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Iterator, Protocol

from jetwake.engine.core.errors import (
    JobStateError, RestartableError, SnapshotError, SnapshotWriteError,
)
from jetwake.engine.jobs.execution_driver import ExecutionDriver, SnapshotCommit, SnapshotPhases
from jetwake.engine.jobs.snapshot_history import SnapshotHistory
from jetwake.snapshot.protocol.fault_injection import crash_point
from jetwake.snapshot.store.snapshot_store import CommitRecord

__all__ = ["PHASE_TIMEOUT_S", "SnapshotDriver", "SnapshotOwner"]

log = logging.getLogger("jetwake.job")

PHASE_TIMEOUT_S = 120.0

# how often the queue's thread looks whether its execution has ended
_RECHECK_S = 0.25


class SnapshotOwner(Protocol):
    """What the snapshot driver needs of its job."""

    name: str
    job_id: str

    @property
    def store(self) -> Any:
        """The member's snapshot store."""

    @property
    def member(self) -> Any:
        """The member (sync_maps, emit_event)."""

    def current_run(self) -> tuple[ExecutionDriver, SnapshotPhases] | None:
        """The running execution and its snapshot phases; None when none runs."""

    def keeps_running(self, execution: ExecutionDriver) -> bool:
        """Whether ``execution`` is still the job's, running and not being stopped."""

    def new_snapshot_writer(self, snapshot_id: int, terminal: bool) -> SnapshotCommit:
        """The writer that commits snapshot ``snapshot_id``."""


class SnapshotDriver:
    """One job's snapshots (see the module doc)."""

    def __init__(self, owner: SnapshotOwner) -> None:
        self.owner = owner
        self.last_snapshot: CommitRecord | None = None
        self.count = 0  # snapshots taken by this coordinator (metric)
        self.failures = 0  # snapshots that could not be written (metric)
        self.last_error: str | None = None
        self.history = SnapshotHistory()  # the latest snapshots' outcomes
        self._lock = threading.Lock()  # one snapshot at a time
        self._guard = threading.Lock()  # the queue and the thread serving it
        self._requests: queue.Queue[tuple[bool, Future]] | None = None
        # the execution whose terminal snapshot committed: it is about to stop (a suspend, a
        # cancel-and-export), so no regular snapshot of it starts any more; one would find
        # its processors stopped and hold the stop back until its phases time out
        self._terminal_of: ExecutionDriver | None = None

    @contextlib.contextmanager
    def paused(self, timeout: float = 2 * PHASE_TIMEOUT_S + 30) -> Iterator[None]:
        """No snapshot runs while this is held (one in progress finishes first, waited for up
        to ``timeout``: beyond both its phases' bounds, RestartableError)."""
        if not self._lock.acquire(timeout=timeout):
            raise RestartableError(f"job '{self.owner.name}': a snapshot was still being taken "
                                   f"after {timeout:.0f} s; tried again with back-off")
        try:
            yield
        finally:
            self._lock.release()

    def start_regular(self, execution: ExecutionDriver, interval_s: float) -> threading.Thread:
        """Starts the thread that serves the request queue while ``execution`` runs and takes
        a snapshot of it every ``interval_s``."""
        requests: queue.Queue[tuple[bool, Future]] = queue.Queue()
        with self._guard:
            self._requests = requests
        thread = threading.Thread(target=self._serve, args=(execution, interval_s, requests),
                                  daemon=True, name=f"jetwake-snapshots-{self.owner.name}")
        thread.start()
        return thread

    def take(self, terminal: bool = False) -> CommitRecord:
        """Takes a snapshot of the running execution and returns its commit record (see
        :meth:`take_now` for what it raises): queued behind any snapshot under way."""
        request: tuple[bool, Future] = (terminal, Future())
        with self._guard:
            requests = self._requests
            if requests is not None:
                requests.put(request)
        if requests is None:
            return self.take_now(terminal)
        return request[1].result()

    def _serve(self, execution: ExecutionDriver, interval_s: float,
               requests: "queue.Queue[tuple[bool, Future]]") -> None:
        """Serves the queue while ``execution`` runs: the requests in order, and a regular
        snapshot every interval, measured from the end of the previous one. Nothing ends this
        thread silently: a regular snapshot that could not be written is counted and tried
        again at the next interval; any other error restarts or fails the job."""
        next_regular = time.monotonic() + interval_s
        try:
            while not execution.finished.is_set() and self.owner.keeps_running(execution):
                wait = min(_RECHECK_S, max(0.0, next_regular - time.monotonic()))
                try:
                    terminal, done = requests.get(timeout=wait)
                except queue.Empty:
                    if time.monotonic() < next_regular or self._terminal_of is execution:
                        continue
                    if not self._regular(execution):
                        return
                    next_regular = time.monotonic() + interval_s
                    continue
                self._answer(terminal, done)
        finally:
            with self._guard:
                if self._requests is requests:
                    self._requests = None
            while True:  # asked for while the execution ended: served on this thread
                try:
                    terminal, done = requests.get_nowait()
                except queue.Empty:
                    break
                self._answer(terminal, done)

    def _answer(self, terminal: bool, done: Future) -> None:
        try:
            done.set_result(self.take_now(terminal))
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            done.set_exception(e)

    def _regular(self, execution: ExecutionDriver) -> bool:
        """Takes a regular snapshot; False when the thread is to end (the execution stopped,
        or it failed because of the snapshot)."""
        name = self.owner.name
        try:
            self.take_now()
        except SnapshotWriteError:
            return True  # counted and logged by take_now(); the job runs on
        except RestartableError as e:
            execution.fail(execution.tasklets[0] if execution.tasklets else None, e)
            return False
        except JobStateError:
            return False
        except BaseException as e:  # noqa: BLE001 - must reach the job, not vanish
            log.exception("job %s: the snapshot thread failed", name)
            error = SnapshotError(f"job '{name}': taking a snapshot failed: {e!r}")
            error.__cause__ = e
            execution.fail(execution.tasklets[0] if execution.tasklets else None, error)
            return False
        return True

    def take_now(self, terminal: bool = False) -> CommitRecord:
        """Runs both phases of one snapshot of the current execution, in these steps:

        1. Take a new snapshot id (never reused) and open the snapshot's writer.
        2. Phase 1: every processor saves its state as the barrier passes (sources save their
           position and emit the barrier; sinks prepare). Entries are serialized and written
           as they are offered.
        3. The commit point: sync the data and write the commit record.
        4. Phase 2: every processor commits, or rolls back if step 2 or 3 failed.
        5. Retention: older snapshots beyond the newest two are deleted.

        Raises :class:`SnapshotWriteError` when the snapshot could not be written (a full disk,
        say): that snapshot is rolled back and removed, the previous one stays valid, and the
        job runs on. Raises :class:`RestartableError` when phase 1 or phase 2 did not complete
        everywhere in time: the job must restart from its last committed snapshot (a committed
        snapshot whose phase 2 did not finish is completed by the restore). A snapshot that
        committed while the execution was being stopped is returned: the next execution
        restores it and completes its phase 2. Each attempt's outcome (the step it reached,
        the failure cause) goes to ``history``.
        """
        owner = self.owner
        name, job_id, store = owner.name, owner.job_id, owner.store
        with self._lock, self.history.attempt(terminal) as attempt:
            run = owner.current_run()
            if run is None:
                raise JobStateError(f"job '{name}' has no running execution to snapshot")
            execution, snap = run
            cancelled = lambda: execution.cancelled  # noqa: E731
            # 1.
            try:
                sid = store.next_snapshot_id(job_id)
            except OSError as e:
                raise self._write_failed(None, e) from e
            attempt.reached("started", id=sid)
            writer = owner.new_snapshot_writer(sid, terminal)
            # 2.
            snap.request(sid, writer, terminal)
            crash_point("snapshot-phase1")
            phase1_ok = snap.wait_phase1(sid, PHASE_TIMEOUT_S, cancelled)
            if phase1_ok:
                attempt.reached("phase 1")
            # 3.
            rec = write_error = None
            if phase1_ok:
                try:
                    # map writes and journal entries the snapshot points into are durable
                    # before the commit record that points into them
                    owner.member.sync_maps()
                    rec = writer.commit()
                except OSError as e:
                    write_error = e
            if rec is None:
                writer.abort()
            else:
                attempt.reached("committed", size_bytes=rec.size_bytes,
                                entries=rec.entry_count, duration_ms=rec.duration_ms)
                crash_point("after-commit-record")
            # 4.
            snap.start_phase2(sid, rec is not None)
            phase2_ok = snap.wait_phase2(sid, PHASE_TIMEOUT_S, cancelled)
            if rec is not None:
                if phase2_ok:
                    attempt.reached("phase 2")
                crash_point("after-phase2")
            if write_error is not None:
                if execution.finished.is_set() or execution.cancelled:
                    # the job ended meanwhile and its snapshots were removed: not a failure
                    raise JobStateError(f"job '{name}' ended during snapshot {sid}")
                raise self._write_failed(sid, write_error) from write_error
            if rec is None:
                if execution.cancelled:
                    raise JobStateError(f"job '{name}' stopped during snapshot {sid}")
                raise RestartableError(f"snapshot {sid} of job '{name}' did not complete "
                                       f"phase 1 within {PHASE_TIMEOUT_S:.0f} s")
            self.last_snapshot = rec
            self.count += 1
            self.last_error = None
            if terminal:
                self._terminal_of = execution
            if not phase2_ok and not execution.cancelled:
                raise RestartableError(
                    f"snapshot {sid} of job '{name}' is committed but its phase 2 did not "
                    f"complete within {PHASE_TIMEOUT_S:.0f} s; restarting from it completes it")
            # 5.
            store.prune(job_id)
            attempt.reached("done")
            owner.member.emit_event(
                owner, f"snapshot {sid} taken in {rec.duration_ms:.0f} ms, "
                       f"{rec.entry_count} entries, {rec.size_bytes} bytes")
            return rec

    def _write_failed(self, sid: int | None, error: OSError) -> SnapshotWriteError:
        name = self.owner.name
        which = f"snapshot {sid}" if sid is not None else "a snapshot"
        text = (f"writing {which} of job '{name}' failed: {error}; the previous snapshot "
                "stays valid, the job runs on and tries again at the next interval")
        self.failures += 1
        self.last_error = text
        log.error("job %s: %s", name, text)
        self.owner.member.emit_event(self.owner, f"snapshot failed: {error}")
        return SnapshotWriteError(text)
