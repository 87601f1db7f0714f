"""The member side of a job: this member's share of an execution.

Every execution runs through participants, a single member's too (a cluster of one, whose
coordinator calls its own participant in-process). The coordinator of a job drives each
execution on every member through these calls (Jet's init, start and snapshot operations), each
answered by the member's participant:

``init``
    Compile the job, build this member's processors with the cluster's member list (global
    processor indices, partitions spread over members, distributed edges over the network),
    restore the snapshot it names, initialize the processors. Nothing runs yet, so no packet
    can reach a member whose receiving queues are not registered.
``start``
    Run the processors on the member's execution service.
``snapshot`` / ``phase1`` / ``phase2``
    The member's part of the two-phase snapshot: start phase 1 with a writer of the member's
    part; wait until its processors saved their state, sync the part and (in a cluster) copy it
    where every member can read it; then commit (or roll back) and wait for phase 2.
``cancel``
    Stop the processors.

When the member's processors have all ended it tells the coordinator how (``exec.ended``),
whatever the reason; the coordinator decides what the job does next.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

import cloudpickle

from jetwake.engine.core.dag import DAG
from jetwake.engine.core.errors import RestartableError, is_restartable_cause
from jetwake.engine.jobs.execution_messages import (
    CancelExecution, CompletePhase1, CompletePhase2, ExecutionEnded, ExecutionMessage,
    ExecutionMetrics, ForgetJob, InitExecution, Initialized, MemberCounts, Phase1Result,
    Phase2Result, ReadState, StartExecution, StartSnapshot, StateEntries,
)
from jetwake.engine.jobs.member_share import close_quietly, prepare_share
from jetwake.engine.jobs.state_reading import count_local_state, read_local_state
from jetwake.engine.execution.execution_metrics import Counts
from jetwake.engine.execution.execution_service import Execution
from jetwake.engine.execution.plan import PlanContext
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_coordinator import compile_definition, state_factory
from jetwake.snapshot.protocol.fault_injection import crash_point
from jetwake.snapshot.protocol.snapshot_context import SnapshotContext
from jetwake.snapshot.store.snapshot_store import CommitRecord, SnapshotWriter

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.jobs.member_context import MemberContext

__all__ = ["ExecutionParticipant", "EdgeTransport", "ReportEnd", "SharePart"]


class EdgeTransport(Protocol):
    """The network ends of distributed edges (a cluster's peer network); a member alone has
    none."""

    def remote_queue(self, exec_key: str, stream: tuple[int, int, int], peer_id: str,
                     address: str) -> Any:
        """The sending end of ``stream`` to member ``peer_id`` at ``address``."""

    def inbound_queue(self, exec_key: str, stream: tuple[int, int, int], name: str) -> Any:
        """The receiving end of ``stream``."""

    def release(self, exec_key: str) -> None:
        """Forgets every stream of an execution."""


#: delivers an execution's end to the member that coordinates it: (coordinator id, the end,
#: the error itself when it is delivered in-process, else None)
ReportEnd = Callable[[str, ExecutionEnded, "BaseException | None"], None]
#: copies a snapshot part's directory where every member can read it: (directory, key
#: prefix) -> where its files are (a cluster's snapshot data topic)
SharePart = Callable[[str, str], dict]

log = logging.getLogger("jetwake.cluster")


class _RemoteEnds:
    """The network ends of one execution's distributed edges (see plan.RemoteEdges)."""

    def __init__(self, edges: EdgeTransport, exec_key: str,
                 members: list[tuple[str, str]]) -> None:
        self.edges = edges
        self.exec_key = exec_key
        self.members = members

    def outbound(self, edge_index: int, src: int, dst: int, dst_member: int) -> Any:
        member_id, address = self.members[dst_member]
        return self.edges.remote_queue(self.exec_key, (edge_index, src, dst), member_id, address)

    def inbound(self, edge_index: int, src: int, dst: int, src_member: int) -> Any:
        return self.edges.inbound_queue(
            self.exec_key, (edge_index, src, dst),
            f"{self.exec_key}/{edge_index}[{src}@{self.members[src_member][0]}->{dst}]")


class _LocalExecution:
    """This member's share of one execution."""

    def __init__(self, exec_key: str, job_id: str, job_name: str, coordinator: str,
                 config: JobConfig) -> None:
        self.exec_key = exec_key
        self.job_id = job_id
        self.job_name = job_name
        self.coordinator = coordinator  # member id the end is reported to
        self.config = config
        self.execution: Execution | None = None
        self.snapshot: SnapshotContext | None = None
        self.writer: SnapshotWriter | None = None
        self.started = False


class ExecutionParticipant:
    """Runs this member's share of executions. ``report`` delivers an execution's end to the
    member that coordinates it; ``edges`` carries distributed edges to other members (None
    for a member alone); ``share_part`` copies a snapshot part where every member can read it
    (None: the member's own store is where the snapshot is read)."""

    def __init__(self, member: "MemberContext", member_id: str, edges: EdgeTransport | None,
                 report: ReportEnd, share_part: SharePart | None = None) -> None:
        self.member = member
        self.member_id = member_id
        self.edges = edges
        self._report = report
        self._share_part = share_part
        self._executions: dict[str, _LocalExecution] = {}
        # executions that ended lately: a snapshot in progress still completes on them
        self._recently_ended: dict[str, _LocalExecution] = {}
        self._lock = threading.Lock()
        self._handlers: dict[type, Callable[[Any], ExecutionMessage | None]] = {
            InitExecution: self.init, StartExecution: self.start, StartSnapshot: self.snapshot,
            CompletePhase1: self.phase1, CompletePhase2: self.phase2,
            CancelExecution: lambda m: self.cancel(m.exec_key),
            ForgetJob: lambda m: self.forget_job(m.job_id), ExecutionMetrics: self.metrics,
            ReadState: self.read_state,
        }

    def handle(self, message: ExecutionMessage) -> ExecutionMessage | None:
        """Serves one request of the job's coordinator; returns the reply."""
        return self._handlers[type(message)](message)

    def _get(self, exec_key: str) -> _LocalExecution:
        with self._lock:
            ex = self._executions.get(exec_key) or self._recently_ended.get(exec_key)
        if ex is None:
            raise RestartableError(f"member {self.member_id} has no execution {exec_key} (it "
                                   "ended, or the member restarted)")
        return ex

    def running(self) -> list[_LocalExecution]:
        with self._lock:
            return list(self._executions.values())

    def tasklets_of_execution(self, exec_key: str) -> list:
        """This member's processors of an execution (for metrics); empty once it ended."""
        with self._lock:
            ex = self._executions.get(exec_key) or self._recently_ended.get(exec_key)
        return list(ex.execution.tasklets) if ex is not None and ex.execution else []

    # --- the calls ---------------------------------------------------------------------------

    def init(self, msg: InitExecution) -> Initialized:
        """Builds, initializes and restores this member's processors (see the module doc).
        A damaged snapshot raises SnapshotDamagedError (the coordinator tries an older one);
        a fallback past one that could duplicate output raises FallbackRefusedError, after
        the processors are initialized and before any state is restored into them."""
        cfg = JobConfig.from_dict(msg.config)
        exec_key, job_id, job_name = msg.exec_key, msg.job_id, msg.job_name
        default_parallelism, member_index = msg.default_parallelism, msg.member_index
        dag = self._dag(msg)
        members = [(str(m[0]), str(m[1])) for m in msg.members]
        ex = _LocalExecution(exec_key, job_id, job_name, msg.coordinator, cfg)
        store = self.member.snapshot_store
        rec = CommitRecord.from_json(msg.restore) if msg.restore else None
        reader = store.reader(rec) if rec is not None else None
        if reader is not None:
            reader.verify()  # raises SnapshotDamagedError: the coordinator tries an older one
        restored_id = rec.snapshot_id if rec is not None and rec.name is None else -1
        snapshot = SnapshotContext(restored_id, store.staging_dir(job_id, msg.execution_count)) \
            if cfg.snapshots_enabled else None
        ctx = PlanContext(
            job_id=job_id, job_name=job_name, processing_guarantee=cfg.processing_guarantee,
            default_parallelism=default_parallelism, member=self.member,
            member_index=member_index, member_count=len(members), snapshot=snapshot,
            state_factory=state_factory(self.member.data_dir, job_id, cfg, exec_key),
            state_backend=cfg.state_backend,
            snapshot_interval_ms=cfg.snapshot_interval_ms if cfg.snapshots_enabled else 0,
            remote=_RemoteEnds(self.edges, exec_key, members)
            if len(members) > 1 and self.edges is not None else None, execution_key=exec_key)
        try:
            tasklets = prepare_share(dag, ctx, cfg, reader, msg.restore_desc,
                                     msg.skipped_damaged, msg.accept_fallback)
        except BaseException:
            self._release_edges(exec_key)
            self._remove_state(job_id, exec_key)
            raise
        ex.snapshot = snapshot
        ex.execution = Execution(job_name, tasklets, lambda e: self._ended(ex), snapshot)
        if snapshot is not None:
            snapshot.attach(tasklets)
        with self._lock:
            self._executions[exec_key] = ex
        return Initialized(processors=len(tasklets))

    def _dag(self, msg: InitExecution) -> DAG:
        """The DAG of the execution: a copy of the definition sent, or, from this member's own
        coordinator (an empty definition), the job's DAG itself."""
        if msg.definition:
            return compile_definition(cloudpickle.loads(msg.definition),
                                      msg.default_parallelism)
        coordinator = self.member.find_coordinator(msg.job_id)
        if coordinator is None:
            raise RestartableError(f"member {self.member_id} no longer coordinates job "
                                   f"{msg.job_name}")
        return coordinator.dag

    def start(self, msg: StartExecution) -> None:
        """Runs the initialized share on the member's execution service."""
        ex = self._get(msg.exec_key)
        ex.started = True
        service = self.member.execution_service
        assert service is not None and ex.execution is not None  # a started member, prepared
        service.submit(ex.execution)

    def snapshot(self, msg: StartSnapshot) -> None:
        """Starts phase 1 of the snapshot on this member."""
        exec_key, snapshot_id, terminal = msg.exec_key, msg.snapshot_id, msg.terminal
        ex = self._get(exec_key)
        if ex.snapshot is None:
            raise RestartableError(f"execution {exec_key} takes no snapshots")
        writer = self.member.snapshot_store.writer(ex.job_id, ex.job_name, snapshot_id,
                                                   terminal)
        ex.writer = writer
        ex.snapshot.request(snapshot_id, writer, terminal)

    def phase1(self, msg: CompletePhase1) -> Phase1Result:
        """Waits for this member's phase 1; then syncs its part of the snapshot and shares
        it. Not ``ok`` when it did not complete in time or the execution stopped."""
        snapshot_id, timeout = msg.snapshot_id, msg.timeout
        ex = self._get(msg.exec_key)
        execution, snap, writer = ex.execution, ex.snapshot, ex.writer
        assert execution is not None  # prepared
        if snap is None or writer is None or writer.record.snapshot_id != snapshot_id:
            return Phase1Result(ok=False, why=f"snapshot {snapshot_id} was not requested here")
        if not snap.wait_phase1(snapshot_id, timeout, lambda: execution.cancelled):
            return Phase1Result(ok=False, why=f"phase 1 did not complete on {self.member_id}")
        crash_point("member-phase1")
        part = writer.finish_part()
        refs: dict = {}
        if self._share_part is not None and writer.directory is not None:
            refs = self._share_part(writer.directory,
                                    f"{ex.job_id}/{snapshot_id}/{self.member_id}")
        return Phase1Result(ok=True, part=part.to_json(), refs=refs)

    def phase2(self, msg: CompletePhase2) -> Phase2Result:
        """Commits (or rolls back) this member's part; done when every processor finished
        phase 2 in time."""
        snapshot_id, success = msg.snapshot_id, msg.success
        ex = self._get(msg.exec_key)
        snap, execution = ex.snapshot, ex.execution
        assert execution is not None  # prepared
        if snap is None:
            return Phase2Result(done=True)
        if success:
            crash_point("member-before-phase2")
        writer, ex.writer = ex.writer, None
        snap.start_phase2(snapshot_id, success)
        crash_point("member-phase2")
        if not success and writer is not None and writer.record.snapshot_id == snapshot_id:
            writer.abort()
        done = snap.wait_phase2(snapshot_id, msg.timeout, lambda: execution.cancelled)
        if success:
            # the previous snapshot stays (a restore may fall back to it), older ones go
            self.member.snapshot_store.remove_local_before(ex.job_id, snapshot_id - 1)
        return Phase2Result(done=done)

    def cancel(self, exec_key: str) -> None:
        with self._lock:
            ex = self._executions.get(exec_key)
        if ex is None or ex.execution is None:
            return
        if not ex.started:
            # initialized but never started: close here, nothing else will
            with self._lock:
                self._executions.pop(exec_key, None)
            close_quietly(ex.execution.tasklets)
            self._release_edges(exec_key)
            self._remove_state(ex.job_id, exec_key)
            return
        ex.execution.cancel()

    def metrics(self, msg: ExecutionMetrics) -> MemberCounts:
        """What this member's processors of an execution counted."""
        ex = self._get(msg.exec_key)
        counts: Counts = {} if ex.execution is None else ex.execution.metrics()
        return MemberCounts(counts=counts)

    def read_state(self, msg: ReadState) -> StateEntries:
        """The live state this member's processors of ``msg.vertices`` hold for ``msg.keys``,
        each read on its processor's own thread."""
        ex = self._get(msg.exec_key)
        tasklets = [] if ex.execution is None else list(ex.execution.tasklets)
        if msg.count_only:
            return StateEntries(parts=[], count=count_local_state(tasklets, msg.vertices))
        return StateEntries(parts=read_local_state(tasklets, msg.vertices, msg.keys))

    def forget_job(self, job_id: str) -> None:
        """The job ended for good: drops this member's copies of its snapshots."""
        self.member.snapshot_store.remove_local_job(job_id)

    def cancel_all(self) -> None:
        """Stops every execution (the member is shutting down)."""
        for ex in self.running():
            self.cancel(ex.exec_key)

    # --- the end -----------------------------------------------------------------------------

    def _ended(self, ex: _LocalExecution) -> None:
        with self._lock:
            self._executions.pop(ex.exec_key, None)
            self._recently_ended[ex.exec_key] = ex
            while len(self._recently_ended) > _KEEP_ENDED:
                self._recently_ended.pop(next(iter(self._recently_ended)))
        execution = ex.execution
        err = execution.error if execution is not None else None
        self._release_edges(ex.exec_key)
        self._remove_state(ex.job_id, ex.exec_key)
        payload = ExecutionEnded(
            exec_key=ex.exec_key, member=self.member_id,
            cancelled=bool(execution.cancelled) if execution is not None else True,
            error=None if err is None else f"{type(err).__name__}: {err}",
            error_type=None if err is None else type(err).__name__,
            restartable=err is not None and is_restartable_cause(err),
            error_tasklet=execution.error_tasklet if execution is not None else None,
            metrics=execution.metrics() if execution is not None else None)
        try:
            self._report(ex.coordinator, payload, err)
        except Exception:  # noqa: BLE001 - the coordinator notices the member otherwise
            log.warning("member %s could not report the end of %s to %s", self.member_id,
                        ex.exec_key, ex.coordinator, exc_info=True)

    def _release_edges(self, exec_key: str) -> None:
        if self.edges is not None:
            self.edges.release(exec_key)

    def _remove_state(self, job_id: str, exec_key: str) -> None:
        if self.member.data_dir is not None:
            shutil.rmtree(os.path.join(self.member.data_dir, "state", job_id, exec_key),
                          ignore_errors=True)


_KEEP_ENDED = 16
