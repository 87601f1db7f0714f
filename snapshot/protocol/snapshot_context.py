"""The member side of the two-phase snapshot protocol, shared by one execution's tasklets.

The coordinator asks for snapshot N (``request``); sources save their position and emit a
barrier, other processors save their state when the barrier has passed (aligned under
exactly-once) and sinks prepare; each tasklet reports ``phase1_done``. When every live tasklet
has, the coordinator writes the commit record (the commit point) and starts phase 2
(``start_phase2``); each tasklet commits (or rolls back) and reports ``phase2_done``.

What a processor saves is serialized the moment it is offered (``store``, on the processor's
thread), so the snapshot is a true cut even when the processor changes its state in place right
after.

A tasklet that completes saves its final state once (``store_final``); that state is encoded
at once and written into every later snapshot, so a finished source is not replayed after a
restore.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from jetwake.engine.core.errors import SnapshotError
from jetwake.engine.core.serialization import SerializationError
from jetwake.snapshot.store.snapshot_files import SnapshotFiles, save_files
from jetwake.snapshot.store.snapshot_store import (
    SavedFilesRef, SnapshotWriter, encode_frame, vertex_dir_name,
)

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.execution.tasklet import ProcessorTasklet

__all__ = ["SnapshotContext"]


class SnapshotContext:
    """``staging_dir``: where files of finished processors' final state wait to be linked into
    each later snapshot (None without a data directory)."""

    def __init__(self, restored_snapshot_id: int = -1, staging_dir: str | None = None) -> None:
        self.restored_snapshot_id = restored_snapshot_id
        self.requested_id = restored_snapshot_id
        self.is_terminal = False
        self.phase2_id = restored_snapshot_id
        self.phase2_success = True
        self.staging_dir = staging_dir
        self._writer: "SnapshotWriter | None" = None
        self._tasklets: list["ProcessorTasklet"] = []
        self._phase1: set[int] = set()
        self._phase2: set[int] = set()
        self._ended: set[int] = set()
        # (vertex, processor) -> encoded frames of final state: (frame, count, attachments)
        self._final: dict[tuple[str, int], list[tuple[bytes, int, list[Any]]]] = {}
        self._completed: dict[str, set[int]] = {}  # vertex -> indices that completed
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
            for (vertex, proc), frames in self._final.items():
                for frame, count, attachments in frames:
                    writer.add_encoded(vertex, proc, frame, count, attachments)
            rec = writer.record
            for t in self._tasklets:
                rec.parallelism[t.context.vertex_name] = t.context.total_parallelism
            rec.completed = {v: sorted(ixs) for v, ixs in self._completed.items()}
            self._in_progress = True
            self.requested_id = snapshot_id  # last: tasklets start on seeing it

    def wait_phase1(self, snapshot_id: int, timeout: float,
                    cancelled: Callable[[], bool]) -> bool:
        """True when every live tasklet finished phase 1; False on timeout or cancellation."""
        return self._wait(lambda: self._all(self._phase1), timeout, cancelled)

    def start_phase2(self, snapshot_id: int, success: bool) -> None:
        with self._cond:
            self._in_progress = False
            self._writer = None
            self._phase2 = set()
            self.phase2_success = success
            self.phase2_id = snapshot_id

    def wait_phase2(self, snapshot_id: int, timeout: float,
                    cancelled: Callable[[], bool]) -> bool:
        """True when every live tasklet finished phase 2; False on timeout or cancellation."""
        return self._wait(lambda: self._all(self._phase2), timeout, cancelled)

    def _all(self, done: set[int]) -> bool:
        return all(id(t) in done or id(t) in self._ended for t in self._tasklets)

    def _wait(self, predicate: Callable[[], bool], timeout: float,
              cancelled: Callable[[], bool]) -> bool:
        with self._cond:
            end = time.monotonic() + timeout
            while True:
                # a cancelled execution cannot complete a snapshot, even if all its tasklets
                # have ended: their state was never saved
                if cancelled() or self.error is not None:
                    return False
                if predicate():
                    return True
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.05))

    # --- tasklet side ----------------------------------------------------------------------

    def store(self, tasklet: "ProcessorTasklet", snapshot_id: int,
              entries: list[tuple[Any, Any]]) -> None:
        """Serializes ``entries`` into snapshot ``snapshot_id`` now; raises SnapshotError when
        the state cannot be serialized (restarting would not help)."""
        writer = self._writer
        if writer is None or snapshot_id != self.requested_id:
            return
        try:
            writer.add(tasklet.context.vertex_name, tasklet.context.global_processor_index,
                       entries)
        except SerializationError as e:
            raise SnapshotError(f"snapshot {snapshot_id}: the state of {tasklet.name} cannot be "
                                f"serialized: {e}") from e

    def store_final(self, tasklet: "ProcessorTasklet", entries: list[tuple[Any, Any]]) -> None:
        key = (tasklet.context.vertex_name, tasklet.context.global_processor_index)
        try:
            encoded = self._encode_final(key, entries)
        except SerializationError as e:
            raise SnapshotError(f"the final state of {tasklet.name} cannot be serialized: "
                                f"{e}") from e
        with self._cond:
            self._final.setdefault(key, []).append(encoded)
            if self._in_progress and id(tasklet) not in self._phase1 and self._writer:
                # completed before its barrier: its final state belongs to this snapshot too
                self._writer.add_encoded(key[0], key[1], *encoded)

    def _encode_final(self, key: tuple[str, int], entries: list[tuple[Any, Any]]
                      ) -> tuple[bytes, int, list[tuple[str, str]]]:
        values = [e[1] for e in entries]
        attachments: list[tuple[str, str]] = []
        if any(type(v) is SnapshotFiles for v in values):
            if self.staging_dir is None:
                raise SnapshotError(f"{key[0]}#{key[1]} saves files in its snapshot state, "
                                    "which needs a member with a data directory")
            out = []
            for v in values:
                if type(v) is SnapshotFiles:
                    rel = os.path.join(vertex_dir_name(key[0]), f"{key[1]}.final",
                                       str(len(self._final.get(key, ())) + len(attachments)))
                    src = os.path.join(self.staging_dir, rel)
                    v = SavedFilesRef(rel, save_files(v, src))
                    attachments.append((rel, src))
                out.append(v)
            values = out
        return encode_frame([e[0] for e in entries], values), len(entries), attachments

    def final_state_saved(self, tasklet: "ProcessorTasklet") -> None:
        """``tasklet`` completed and saved its final state: later snapshots record it as
        completed, so that a restore does not run it (and emit its results) again."""
        vertex, index = tasklet.context.vertex_name, tasklet.context.global_processor_index
        with self._cond:
            self._completed.setdefault(vertex, set()).add(index)
            writer = self._writer
            if self._in_progress and id(tasklet) not in self._phase1 and writer is not None:
                writer.record.completed.setdefault(vertex, []).append(index)

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

