"""The member side of the two-phase snapshot protocol, shared by one execution's tasklets.

The coordinator asks for snapshot N (``request``); sources save their position and emit a
barrier, other processors save their state when the barrier has passed (aligned under
exactly-once) and sinks prepare; each tasklet reports ``phase1_done``. When every live tasklet
has, the coordinator writes the commit record (the commit point) and starts phase 2
(``start_phase2``); each tasklet commits (or rolls back) and reports ``phase2_done``.

A tasklet that completes saves its final state once (``store_final``); that state is part of
every later snapshot, so a finished source is not replayed after a restore.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..snapshot.store import SnapshotWriter
    from .execution.tasklet import ProcessorTasklet

__all__ = ["SnapshotContext"]


class SnapshotContext:
    def __init__(self, restored_snapshot_id: int = -1) -> None:
        self.restored_snapshot_id = restored_snapshot_id
        self.requested_id = restored_snapshot_id
        self.is_terminal = False
        self.phase2_id = restored_snapshot_id
        self.phase2_success = True
        self._writer: "SnapshotWriter | None" = None
        self._tasklets: list["ProcessorTasklet"] = []
        self._phase1: set[int] = set()
        self._phase2: set[int] = set()
        self._ended: set[int] = set()
        self._final: dict[tuple[str, int], list[tuple[Any, Any]]] = {}
        self._cond = threading.Condition()
        self._in_progress = False
        self.error: BaseException | None = None

    def attach(self, tasklets: list["ProcessorTasklet"]) -> None:
        self._tasklets = tasklets

    # --- coordinator side ------------------------------------------------------------------

    def request(self, snapshot_id: int, writer: "SnapshotWriter", terminal: bool) -> None:
        with self._cond:
            self._writer = writer
            self._phase1 = set()
            self.is_terminal = terminal
            for (vertex, proc), entries in self._final.items():
                writer.add(vertex, proc, entries)
            self._in_progress = True
            self.requested_id = snapshot_id  # last: tasklets start on seeing it

    def wait_phase1(self, snapshot_id: int, timeout: float, cancelled) -> bool:
        """True when every live tasklet finished phase 1; False on timeout or cancellation."""
        return self._wait(lambda: self._all(self._phase1), timeout, cancelled)

    def start_phase2(self, snapshot_id: int, success: bool) -> None:
        with self._cond:
            self._in_progress = False
            self._phase2 = set()
            self.phase2_success = success
            self.phase2_id = snapshot_id

    def wait_phase2(self, snapshot_id: int, timeout: float, cancelled) -> bool:
        return self._wait(lambda: self._all(self._phase2), timeout, cancelled)

    def _all(self, done: set[int]) -> bool:
        return all(id(t) in done or id(t) in self._ended for t in self._tasklets)

    def _wait(self, predicate, timeout: float, cancelled) -> bool:
        with self._cond:
            end = _now() + timeout
            while True:
                # a cancelled execution cannot complete a snapshot, even if all its tasklets
                # have ended: their state was never saved
                if cancelled() or self.error is not None:
                    return False
                if predicate():
                    return True
                remaining = end - _now()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.05))

    # --- tasklet side ----------------------------------------------------------------------

    def store(self, tasklet: "ProcessorTasklet", snapshot_id: int,
              entries: list[tuple[Any, Any]]) -> None:
        writer = self._writer
        if writer is not None and snapshot_id == self.requested_id:
            writer.add(tasklet.context.vertex_name, tasklet.context.global_processor_index,
                       entries)

    def store_final(self, tasklet: "ProcessorTasklet", entries: list[tuple[Any, Any]]) -> None:
        with self._cond:
            key = (tasklet.context.vertex_name, tasklet.context.global_processor_index)
            self._final.setdefault(key, []).extend(entries)
            if self._in_progress and id(tasklet) not in self._phase1 and self._writer:
                # completed before its barrier: its final state belongs to this snapshot too
                self._writer.add(key[0], key[1], entries)

    def phase1_done(self, tasklet: "ProcessorTasklet", snapshot_id: int) -> None:
        with self._cond:
            if snapshot_id == self.requested_id:
                self._phase1.add(id(tasklet))
                self._cond.notify_all()

    def phase2_done(self, tasklet: "ProcessorTasklet", snapshot_id: int) -> None:
        with self._cond:
            if snapshot_id == self.phase2_id:
                self._phase2.add(id(tasklet))
                self._cond.notify_all()

    def tasklet_ended(self, tasklet: "ProcessorTasklet") -> None:
        """A tasklet stopped; only one that completed normally saved its final state and
        counts as done for later snapshots."""
        with self._cond:
            if tasklet.is_done:
                self._ended.add(id(tasklet))
            self._cond.notify_all()


def _now() -> float:
    import time
    return time.monotonic()
