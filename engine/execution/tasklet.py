"""ProcessorTasklet: drives one processor cooperatively.

Each ``call()`` does a bounded slice of work and reports NO_PROGRESS, MADE_PROGRESS or DONE:
it moves the outbox into downstream queues, lets the processor handle its inbox, delivers
coalesced watermarks, takes part in snapshots, drains input queues (lower priority numbers
first), and at the end completes the processor and sends DONE downstream. Where it is in that
life is a :class:`ProcessorState`.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Callable

from jetwake.engine.core.stream_items import DONE, SnapshotBarrier, Watermark
from jetwake.engine.core.processor import Inbox, Outbox, Processor, ProcessorContext
from jetwake.engine.execution.inbound import InboundEdgeStream
from jetwake.engine.execution.outbound import OutboundEdgeStream
from jetwake.engine.execution.watermark_coalescer import WatermarkCoalescer

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.execution.execution_service import Execution, CooperativeWorker
    from jetwake.snapshot.protocol.snapshot_context import SnapshotContext

__all__ = ["ProcessorTasklet", "ProcessorState", "NO_PROGRESS", "MADE_PROGRESS", "DONE_STATE"]

NO_PROGRESS, MADE_PROGRESS, DONE_STATE = 0, 1, 2


class ProcessorState(IntEnum):
    """Where a processor is in its life; the tasklet moves it forward, never back (except out
    of TERMINATED when a terminal snapshot fails)."""

    PROCESS = 0
    """Draining inputs into ``process()``, delivering watermarks and completed edges."""
    SAVE_SNAPSHOT = 1
    """Every input delivered the barrier (or this is a source): ``save_to_snapshot()`` until
    True, then ``snapshot_commit_prepare()`` until True, then the barrier goes downstream."""
    COMPLETE = 2
    """Every input has ended (or this is a source): ``complete()`` until True."""
    WAITING_FOR_SNAPSHOT_COMPLETED = 3
    """``complete()`` returned True, but this processor did phase 1 of a snapshot whose phase 2
    has not reached it yet: it waits for that phase 2 before it saves its final state and ends,
    so that a two-phase sink commits (or rolls back) that snapshot's part before the job can
    complete. (A two-phase sink's ``complete()`` itself never commits what a snapshot has
    prepared; it returns False until that snapshot's phase 2.)"""
    SAVE_FINAL = 4
    """Completed: its final state is saved once and becomes part of every later snapshot."""
    EMIT_DONE = 5
    """Sends DONE downstream."""
    END = 6
    """Waits until DONE and everything before it left the outbox, then closes."""
    TERMINATED = 7
    """Phase 1 of a terminal snapshot (suspend, graceful shutdown, cancel-and-export) is done:
    nothing more is processed or emitted; only phase 2 runs. The execution is then stopped."""


_PROCESS = ProcessorState.PROCESS
_SAVE_SNAPSHOT = ProcessorState.SAVE_SNAPSHOT
_COMPLETE = ProcessorState.COMPLETE
_WAIT_SNAPSHOT = ProcessorState.WAITING_FOR_SNAPSHOT_COMPLETED
_SAVE_FINAL = ProcessorState.SAVE_FINAL
_EMIT_DONE = ProcessorState.EMIT_DONE
_END = ProcessorState.END
_TERMINATED = ProcessorState.TERMINATED

DRAIN_LIMIT = 8192  # items moved into the inbox per call: bounds a call to about a millisecond


class ProcessorTasklet:
    def __init__(self, processor: Processor, context: ProcessorContext,
                 inbound: list[InboundEdgeStream], outbound: list[OutboundEdgeStream],
                 coalescer: WatermarkCoalescer, outbox_capacity: int = 4096,
                 snapshot: "SnapshotContext | None" = None) -> None:
        self.processor = processor
        self.context = context
        self.name = f"{context.vertex_name}#{context.global_processor_index}"
        self.outbound = outbound
        self.outbox = Outbox(len(outbound), outbox_capacity)
        self.coalescer = coalescer
        self.snapshot = snapshot
        self.is_cooperative = True
        priorities = sorted({s.priority for s in inbound})
        self._groups = [[s for s in inbound if s.priority == p] for p in priorities]
        self._group = 0
        self._stream_rr = 0
        self._inbox = Inbox()
        self._inbox_ordinal = 0
        self._pending_wm: int | None = None
        self._pending_complete_edge: list[int] = []
        self._completed_streams: set[int] = set()
        self._state = _PROCESS if inbound else _COMPLETE
        self._last_snapshot_id = snapshot.restored_snapshot_id if snapshot else -1
        self._last_phase2_id = self._last_snapshot_id
        self._saving_id = -1
        self._closed = False
        self.items_in = 0
        self.items_out = 0
        # set by the execution service's scheduler
        self.steal_to: CooperativeWorker | None = None
        self.execution: Execution | None = None
        #: reads of the processor's state, each run on its own thread between two steps
        #: (:meth:`on_processor_thread`): job.state(consistency="latest")
        self.state_reads: deque[tuple[Callable[[Processor], Any], Future[Any]]] = deque()

    def init(self) -> None:
        self.processor.outbox = self.outbox
        self.processor.init(self.context)
        self.is_cooperative = bool(self.processor.is_cooperative())

    # --- the cooperative step ------------------------------------------------------------

    def on_processor_thread(self, fn: Callable[[Processor], Any]) -> "Future[Any]":
        """``fn(processor)`` run on the processor's own thread before its next step, so it
        sees the processor's state between two steps and never half-changed; its result (or
        error) in the returned future. A processor that ended keeps its state unchanged, so
        ``fn`` then runs at once on the caller's thread."""
        future: Future[Any] = Future()
        if self._closed or self._state in (_TERMINATED, _END):
            _run_into(fn, self.processor, future)
            return future
        self.state_reads.append((fn, future))
        if self._closed:  # closed meanwhile: nobody else serves it (a popleft is atomic)
            self._serve_state_reads()
        return future

    def _serve_state_reads(self) -> None:
        reads = self.state_reads
        while reads:
            fn, future = reads.popleft()
            _run_into(fn, self.processor, future)

    def call(self) -> int:
        if self.state_reads:
            self._serve_state_reads()
        added_before = self.outbox.added
        moved = self._flush_outbox()
        snap = self.snapshot
        if snap is not None and snap.phase2_id > self._last_phase2_id:
            self._do_phase2(snap)
        state = self._state
        if state == _PROCESS:
            progress = self._process()
        elif state == _COMPLETE:
            progress = self._complete()
        elif state == _SAVE_SNAPSHOT:
            progress = self._save_snapshot()
        elif state == _WAIT_SNAPSHOT:
            progress = self._wait_snapshot_completed()
        elif state == _SAVE_FINAL:
            progress = self._save_final()
        elif state == _TERMINATED:
            progress = False
        elif state == _EMIT_DONE:
            self.outbox.offer_control(DONE)
            self._state = _END
            self._flush_outbox()
            progress = True
        else:  # _END: wait until DONE and everything before it left the outbox
            if self._outbox_drained():
                self.close()
                return DONE_STATE
            progress = False
        if moved or progress or self.outbox.added != added_before:
            return MADE_PROGRESS
        return NO_PROGRESS

    def _process(self) -> bool:
        inbox = self._inbox
        proc = self.processor
        if inbox:
            before = len(inbox)
            proc.process(self._inbox_ordinal, inbox)
            if inbox:
                return len(inbox) != before
        progress = False
        if self._pending_wm is not None:
            if not proc.try_process_watermark(Watermark(self._pending_wm)):
                return False
            self._pending_wm = self.coalescer.take_deferred()
            if self._pending_wm is not None:
                return True
            progress = True
        while self._pending_complete_edge:
            if not proc.complete_edge(self._pending_complete_edge[0]):
                return progress
            self._pending_complete_edge.pop(0)
            progress = True
        if self._barrier_ready():
            self._saving_id = self._snapshots().requested_id
            self._state = _SAVE_SNAPSHOT
            return True
        if self._group >= len(self._groups):
            self._state = _COMPLETE
            return True
        if not proc.try_process():
            return progress
        return self._drain() or progress

    def _drain(self) -> bool:
        group = self._groups[self._group]
        n = len(group)
        progress = False
        paused = self.processor.paused_inputs
        for k in range(n):
            stream = group[(self._stream_rr + k) % n]
            if stream.is_done or (paused and stream.ordinal in paused):
                continue
            items: list[Any] = []
            moved, wm = stream.drain(items, DRAIN_LIMIT)
            if wm is not None:
                self._pending_wm = wm
            if stream.is_done and stream.ordinal not in self._completed_streams:
                self._completed_streams.add(stream.ordinal)
                self._pending_complete_edge.append(stream.ordinal)
            if moved:
                progress = True
            if items:
                self._stream_rr = (self._stream_rr + k + 1) % n
                self.items_in += len(items)
                self._inbox._fill(items)
                self._inbox_ordinal = stream.ordinal
                self.processor.process(stream.ordinal, self._inbox)
                return True
        if all(s.is_done for s in group):
            self._group += 1
            progress = True
        return progress

    def _barrier_ready(self) -> bool:
        snap = self.snapshot
        if snap is None or not self._groups:
            return False
        sid = snap.requested_id
        if sid <= self._last_snapshot_id:
            return False
        streams = [s for g in self._groups for s in g]
        if all(s.is_done for s in streams):
            return False
        return all(s.has_barrier(sid) for s in streams)

    def _complete(self) -> bool:
        snap = self.snapshot
        if snap is not None and not self._groups and snap.requested_id > self._last_snapshot_id:
            # a source takes part in a snapshot between two calls of complete()
            self._saving_id = snap.requested_id
            self._state = _SAVE_SNAPSHOT
            return True
        if self.processor.complete():
            self._state = _EMIT_DONE if snap is None else _WAIT_SNAPSHOT
            return True
        return False

    def _wait_snapshot_completed(self) -> bool:
        # phase 2 arrives through _do_phase2 at the start of every call
        if self._last_phase2_id < self._last_snapshot_id:
            return False
        self._state = _SAVE_FINAL
        return True

    def _save_final(self) -> bool:
        snap = self._snapshots()
        self.context.snapshot_id = snap.requested_id
        done = self.processor.save_to_snapshot()
        entries = self.outbox._take_snapshot()
        if entries:
            snap.store_final(self, entries)
        if done:
            snap.final_state_saved(self)
            self._state = _EMIT_DONE
        return True

    def restore_completed(self) -> None:
        """The restored snapshot says every processor of this vertex had completed: this one
        does not run again (its results were emitted before that snapshot); it only saves its
        restored state for later snapshots and ends."""
        self._state = _SAVE_FINAL if self.snapshot is not None else _EMIT_DONE

    def _save_snapshot(self) -> bool:
        proc = self.processor
        self.context.snapshot_id = self._saving_id
        done = proc.save_to_snapshot()
        entries = self.outbox._take_snapshot()
        snap = self._snapshots()
        if entries:
            snap.store(self, self._saving_id, entries)
        if not done:
            return bool(entries)
        if not proc.snapshot_commit_prepare():
            return bool(entries)
        sid = self._saving_id
        barrier = SnapshotBarrier(sid, snap.is_terminal)
        self.outbox.offer_control(barrier)
        self._last_snapshot_id = sid
        for group in self._groups:
            for stream in group:
                stream.unblock()
        snap.phase1_done(self, sid)
        self._state = _TERMINATED if barrier.is_terminal else self._resume_state()
        return True

    def _resume_state(self) -> ProcessorState:
        return _PROCESS if self._groups else _COMPLETE

    def _snapshots(self) -> SnapshotContext:
        """The job's snapshot context, in the states that only a job taking snapshots reaches
        (saving a snapshot, saving the final state)."""
        snap = self.snapshot
        assert snap is not None, f"{self.name}: a snapshot state in a job without snapshots"
        return snap

    def _do_phase2(self, snap: SnapshotContext) -> None:
        sid = snap.phase2_id
        if sid > self._last_snapshot_id:
            return  # this processor has not done phase 1 of that snapshot
        success = snap.phase2_success
        self.context.snapshot_id = sid
        if self.processor.snapshot_commit_finish(success):
            self._last_phase2_id = sid
            if self._state == _TERMINATED and not success:
                self._state = self._resume_state()  # the terminal snapshot failed: run on
            snap.phase2_done(self, sid)

    # --- outbox to queues -------------------------------------------------------------------

    def _flush_outbox(self) -> bool:
        moved = False
        outbox = self.outbox
        for stream in self.outbound:
            if stream.has_pending and not stream.flush_pending():
                continue
            entries = outbox._take(stream.ordinal)
            if not entries:
                continue
            moved = True
            for i, entry in enumerate(entries):
                if type(entry) is list:
                    self.items_out += len(entry)
                if not stream.send(entry):
                    outbox._put_back(stream.ordinal, entries[i + 1:])
                    break
        return moved

    def _outbox_drained(self) -> bool:
        self._flush_outbox()
        return self.outbox.is_empty() and not any(s.has_pending for s in self.outbound)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._serve_state_reads()
            try:
                self.processor.close()
            finally:
                self.context.release_state()

    def input_queue_fill(self) -> float:
        """The fullest input queue's fill, 0.0 to 1.0 (a metric of backpressure)."""
        fill = 0.0
        for group in self._groups:
            for stream in group:
                for q in stream.queues:
                    fill = max(fill, len(q) / q.capacity)
        return fill

    @property
    def state(self) -> ProcessorState:
        return ProcessorState(self._state)

    @property
    def is_closed(self) -> bool:
        """Whether the processor was closed (its state released)."""
        return self._closed

    @property
    def is_done(self) -> bool:
        return self._state == _END and self._closed

    def __repr__(self) -> str:
        return f"ProcessorTasklet({self.name})"


def _run_into(fn: Callable[[Processor], Any], processor: Processor, future: "Future[Any]") -> None:
    try:
        future.set_result(fn(processor))
    except BaseException as e:  # noqa: BLE001 - the reader gets the error
        future.set_exception(e)
