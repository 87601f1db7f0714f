"""The coordinator's view of one execution that runs on the members of a job: every member
of a cluster, or a single member (a cluster of one, whose participant is called in-process).

:class:`DistributedExecution` is the job coordinator's execution: it has ended when every
member's share has ended, it failed when any share failed (the others are then cancelled), and
cancelling it cancels every share.

:class:`DistributedSnapshot` is the job coordinator's side of a snapshot: it runs the two
phases on every member, in parallel:

1. every member starts phase 1 (sources save their position and emit the barrier, which crosses
   the network edges in-band and is aligned there under exactly-once);
2. the coordinator waits until every member's processors saved their state and each member
   synced its part of the snapshot (and, in a cluster, copied it where every member can read
   it); the parts are merged into one commit record (:class:`SnapshotCommitWriter`);
3. the job coordinator writes the commit record: the commit point, for every member;
4. phase 2 reaches every member (commit, or roll back when a member failed phase 1).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable

from jetwake.engine.core.errors import JetwakeError, RestartableError
from jetwake.engine.execution.execution_metrics import Counts, member_counts, summed
from jetwake.engine.jobs.execution_messages import (
    CancelExecution, CompletePhase1, CompletePhase2, ExecutionEnded, ExecutionMessage,
    ExecutionMetrics, ExecutionTransport, MemberCounts, Phase1Result, Phase2Result,
    StartExecution, StartSnapshot,
)
from jetwake.snapshot.store.snapshot_store import FORMAT_FRAMED, CommitRecord, SnapshotStore

__all__ = ["DistributedExecution", "DistributedSnapshot", "SnapshotCommitWriter",
           "MemberExecutionError"]

log = logging.getLogger("jetwake.cluster")

# what a member's call may take beyond the phase's own timeout (the network, syncing files)
_CALL_MARGIN_S = 30.0
# how often a wait for members' answers looks whether the execution still needs them
_RECHECK_S = 0.25
# how long Job.metrics() waits for a member's counts
_METRICS_TIMEOUT_S = 5.0


class MemberExecutionError(JetwakeError):
    """A member's share of an execution failed; the message names the member, the processor
    and the original error."""


class DistributedExecution:
    """One execution across ``members`` (ids, in member-index order). ``local`` is the
    coordinator's own member, whose processors (``local_tasklets``) it reads in-process."""

    def __init__(self, name: str, exec_key: str, members: list[str], call: ExecutionTransport,
                 on_end: Callable[["DistributedExecution"], None],
                 local_tasklets: Callable[[], list], local: str) -> None:
        self.name = name
        self.exec_key = exec_key
        self.members = list(members)
        self.local = local
        self._call = call
        self._on_end = on_end
        self._local_tasklets = local_tasklets
        self._remaining = set(members)
        # member -> what its processors counted, sent with the end of its share
        self._final_counts: dict[str, Counts] = {}
        self._lock = threading.Lock()
        self.cancelled = False
        self.error: BaseException | None = None
        self.error_tasklet: str | None = None
        self.finished = threading.Event()
        self.snapshot: DistributedSnapshot | None = None
        #: called with a member found out of reach while the execution was being stopped
        self.on_member_lost: Callable[[str], None] | None = None
        self._pool = ThreadPoolExecutor(max_workers=max(2, len(members)),
                                        thread_name_prefix=f"jetwake-exec-{name}")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Runs ``fn`` on the execution's threads (or a thread of its own once the execution
        has ended and its threads are gone)."""
        try:
            return self._pool.submit(fn, *args)
        except RuntimeError:
            future: Future = Future()

            def run() -> None:
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001 - handed to the waiter
                    future.set_exception(e)
            threading.Thread(target=run, daemon=True).start()
            return future

    @property
    def tasklets(self) -> list:
        """This member's processors of the execution (metrics look at them)."""
        return self._local_tasklets()

    def all_members(self, message: "ExecutionMessage | Callable[[int], ExecutionMessage]",
                    timeout: float, *, while_running: bool = False) -> dict[str, Any]:
        """Sends ``message`` to every member in parallel (or ``message(member_index)`` when
        each member gets its own); member id -> reply, or the exception it raised. See
        :meth:`gather` for ``while_running``."""
        messages = {m: message(i) if callable(message) else message
                    for i, m in enumerate(self.members)}
        futures = {m: self.call(m, msg, timeout) for m, msg in messages.items()}
        op = next(iter(messages.values())).OP if messages else ""
        return self.gather(futures, timeout + _CALL_MARGIN_S, op, while_running=while_running)

    def call(self, member: str, message: ExecutionMessage, timeout: float) -> Future:
        """Sends ``message`` to one member on the execution's threads."""
        return self.submit(self._call, member, message, timeout)

    def gather(self, futures: dict[str, Future], timeout: float, what: str, *,
               while_running: bool = False) -> dict[str, Any]:
        """Waits up to ``timeout`` for each member's answer; member id -> result, or the
        exception it raised.

        A member whose share has ended (it left, was found out of reach, or reported its end)
        is not waited for: its answer can no longer matter, and a member cut off from the
        coordinator would otherwise hold the caller (a snapshot, under the job's snapshot
        lock) for the call's full timeout. With ``while_running``, nobody is waited for once
        the execution is being cancelled (the answers of a snapshot's first steps)."""
        deadline = time.monotonic() + timeout
        out: dict[str, Any] = {}
        pending = dict(futures)
        while pending:
            for m, f in list(pending.items()):
                if f.done():
                    try:
                        out[m] = f.result()
                    except BaseException as e:  # noqa: BLE001 - the caller decides
                        out[m] = e
                elif m not in self._remaining:
                    out[m] = MemberExecutionError(
                        f"member {m}'s share of {self.exec_key} ended before it answered {what}")
                elif while_running and self.cancelled:
                    out[m] = MemberExecutionError(
                        f"{self.exec_key} was stopped before member {m} answered {what}")
                else:
                    continue
                del pending[m]
            left = deadline - time.monotonic()
            if pending and left <= 0:
                for m in pending:
                    out[m] = TimeoutError(f"member {m} did not answer {what} within "
                                          f"{timeout:g} s")
                break
            if pending:
                wait(list(pending.values()), min(left, _RECHECK_S), FIRST_COMPLETED)
        return {m: out[m] for m in futures}

    def metrics(self) -> Counts:
        """What the processors of every member counted, summed: a member whose share ended
        sent its counts with the end, this member's are read here, the others are asked now
        (metrics are polled: a member alone answers without a message). A member that does
        not answer (it is out of reach) is left out of the sum, which the log says."""
        with self._lock:
            parts = list(self._final_counts.values())
            running = [m for m in self.members if m not in self._final_counts
                       and m in self._remaining]
        if self.local in running:
            running.remove(self.local)
            parts.append(member_counts(self._local_tasklets()))
        ask = running
        request = ExecutionMetrics(exec_key=self.exec_key)
        futures = {m: self.call(m, request, _METRICS_TIMEOUT_S) for m in ask}
        for m, r in self.gather(futures, _METRICS_TIMEOUT_S, request.OP).items():
            if isinstance(r, MemberCounts):
                parts.append(r.counts)
                continue
            with self._lock:
                counts = self._final_counts.get(m)  # it ended meanwhile
            if counts is None:
                log.warning("%s: metrics without member %s's share: %s", self.exec_key, m, r)
                continue
            parts.append(counts)
        return summed(parts)

    def start(self) -> None:
        """Starts every member's share; a member that cannot start fails the execution."""
        results = self.all_members(StartExecution(exec_key=self.exec_key), 30.0)
        for m, result in results.items():
            if isinstance(result, BaseException):
                self.member_ended(ExecutionEnded(
                    exec_key=self.exec_key, member=m, cancelled=False,
                    error=f"{type(result).__name__}: {result}",
                    error_type=type(result).__name__, restartable=True))

    def fail(self, tasklet: Any, error: BaseException) -> None:
        with self._lock:
            if self.error is None and not self.cancelled:
                self.error = error
                self.error_tasklet = getattr(tasklet, "name", None)
        self.cancel()

    def cancel(self) -> None:
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            remaining = list(self._remaining)
        for m in remaining:
            self.submit(self._cancel_on, m)

    def discard(self) -> None:
        """Drops an execution that was initialized but never started. The share of the
        coordinator's own member (in-process) is closed before this returns: the
        coordinator removes the job's working state on this member next, which a share still
        closing would be reading. The other members drop theirs as a cancel reaches them, and
        remove their own working state."""
        with self._lock:
            self.cancelled = True
            local = self.local
            others = [m for m in self._remaining if m != local]
            mine = local in self._remaining
        if mine:
            try:
                self._call(local, CancelExecution(exec_key=self.exec_key), 30.0)
            except Exception as e:  # noqa: BLE001 - closing quietly: the start failed anyway
                log.warning("dropping %s on member %s failed: %s", self.exec_key, local, e)
        for m in others:
            self.submit(self._cancel_on, m)
        self._pool.shutdown(wait=False)  # the cancels queued still go out

    def _cancel_on(self, member: str) -> None:
        try:
            self._call(member, CancelExecution(exec_key=self.exec_key), 10.0)
        except Exception as e:  # noqa: BLE001 - a member out of reach ends by itself
            log.warning("cancelling %s on member %s failed: %s", self.exec_key, member, e)
            if getattr(e, "restartable", False):  # the network's verdict: out of reach
                # out of reach (its process is gone, most likely): its share is counted as
                # ended now, so the job restarts without waiting for Kafka to drop the member;
                # if it still runs, it stops when it learns its execution is no longer current
                if self.on_member_lost is not None:
                    self.on_member_lost(member)
                else:
                    self.member_left(member)

    def member_ended(self, ended: ExecutionEnded, cause: BaseException | None = None) -> None:
        """A member's share ended (reported by the member, or decided here when the member is
        gone). ``cause`` is the error itself when the end is delivered in-process (a member
        alone): the job then fails with the user's own exception."""
        member = ended.member
        error = None
        if ended.cancelled and not ended.error and not self.cancelled:
            # stopped on the member's side (it is shutting down): the job must run again
            ended = dataclasses.replace(ended, error="its share of the execution was stopped",
                                        restartable=True)
        if ended.error:
            where = f" in {ended.error_tasklet}" if ended.error_tasklet else ""
            text = f"on member {member}{where}: {ended.error}"
            if cause is not None:
                error = cause
            else:
                error = RestartableError(text) if ended.restartable \
                    else MemberExecutionError(text)
        with self._lock:
            if member not in self._remaining:
                return
            if ended.metrics is not None:
                self._final_counts[member] = ended.metrics
            self._remaining.discard(member)
            if error is not None and self.error is None and not self.cancelled:
                self.error = error
                self.error_tasklet = ended.error_tasklet or f"member {member}"
            first_stop = (error is not None or ended.cancelled) and not self.cancelled
            last = not self._remaining
        if first_stop:
            self.cancel()
        if last:
            self.finished.set()
            self._pool.shutdown(wait=False)
            self._on_end(self)

    def member_left(self, member: str) -> None:
        """A member of the execution left the cluster: its share is gone."""
        self.member_ended(ExecutionEnded(
            exec_key=self.exec_key, member=member, cancelled=False, restartable=True,
            error=f"member {member} left the cluster"))


class SnapshotCommitWriter:
    """The coordinator's writer of a snapshot: the members' parts are merged in
    (:meth:`add_part`) and :meth:`commit` writes the commit record through ``publish`` (a
    cluster's records, where every member can read it) and in the member's own store."""

    def __init__(self, store: SnapshotStore, job_id: str, job_name: str, snapshot_id: int,
                 terminal: bool, publish: Callable[[CommitRecord], None]) -> None:
        self.store = store
        self.record = CommitRecord(job_id, job_name, snapshot_id, time.time(), 0.0,
                                   terminal=terminal, format=FORMAT_FRAMED)
        self._publish = publish
        self._started = time.perf_counter()

    def add_part(self, member: str, part: CommitRecord, refs: dict) -> None:
        self.record.merge_part(part, member, refs)

    def commit(self) -> CommitRecord:
        rec = self.record
        rec.duration_ms = (time.perf_counter() - self._started) * 1000
        self._publish(rec)  # the commit point: raises when this coordinator was deposed
        self.store.commit_record(rec)
        return rec

    def abort(self) -> None:
        """Nothing to drop here: each member drops its part when phase 2 says it failed."""


class DistributedSnapshot:
    """The coordinator's side of the snapshot protocol of a :class:`DistributedExecution`
    (its SnapshotPhases): each phase runs on every member's SnapshotContext, through its
    participant."""

    def __init__(self, execution: DistributedExecution) -> None:
        self.execution = execution
        self._writer: SnapshotCommitWriter | None = None
        self._phase2: dict[str, Future] | None = None
        self.phase1_failure: str | None = None

    def request(self, snapshot_id: int, writer: SnapshotCommitWriter, terminal: bool) -> None:
        self._writer = writer
        self.phase1_failure = None
        ex = self.execution
        results = ex.all_members(StartSnapshot(exec_key=ex.exec_key, snapshot_id=snapshot_id,
                                               terminal=terminal), 30.0, while_running=True)
        failed = {m: r for m, r in results.items() if isinstance(r, BaseException)}
        if failed:
            self.phase1_failure = "; ".join(f"{m}: {e}" for m, e in failed.items())

    def wait_phase1(self, snapshot_id: int, timeout: float,
                    cancelled: Callable[[], bool]) -> bool:
        """True when every member finished phase 1 and shared its part."""
        if self.phase1_failure is not None:
            log.warning("snapshot %d of %s failed to start: %s", snapshot_id,
                        self.execution.name, self.phase1_failure)
            return False
        ex = self.execution
        results = ex.all_members(CompletePhase1(exec_key=ex.exec_key, snapshot_id=snapshot_id,
                                                timeout=timeout), timeout, while_running=True)
        writer = self._writer
        ok = True
        for m, r in results.items():
            if not isinstance(r, Phase1Result) or not r.ok or r.part is None:
                ok = False
                why = r.why if isinstance(r, Phase1Result) else r
                log.warning("snapshot %d of %s: phase 1 failed on member %s: %s", snapshot_id,
                            ex.name, m, why)
                continue
            if writer is not None:
                writer.add_part(m, CommitRecord.from_json(r.part), r.refs)
        return ok and not cancelled()

    def start_phase2(self, snapshot_id: int, success: bool) -> None:
        ex = self.execution
        self._writer = None
        request = CompletePhase2(exec_key=ex.exec_key, snapshot_id=snapshot_id,
                                 success=success, timeout=_PHASE2_S)
        self._phase2 = {m: ex.call(m, request, _PHASE2_S) for m in ex.members}

    def wait_phase2(self, snapshot_id: int, timeout: float,
                    cancelled: Callable[[], bool]) -> bool:
        futures, self._phase2 = self._phase2 or {}, None
        # a member whose share ended is not waited for: a committed snapshot's phase 2 is
        # completed by the restore of the next execution
        results = self.execution.gather(futures, timeout, CompletePhase2.OP)
        ok = True
        for m, r in results.items():
            if not isinstance(r, Phase2Result) or not r.done:
                log.warning("snapshot %d of %s: phase 2 failed on member %s: %s", snapshot_id,
                            self.execution.name, m, r)
                ok = False
        return ok and not cancelled()


_PHASE2_S = 120.0
