"""The execution service, as in Jet: worker threads that juggle cooperative tasklets.

Every cooperative worker cycles through its tasklets; after a cycle in which none made
progress it backs off (yield, then short sleeps, then waits for new work when it has none).
When a worker drops a finished tasklet it looks for the worker with the most tasklets and, if
that one has at least two more, marks one of them to be handed over: the owner moves it at its
next turn (work stealing). Non-cooperative tasklets get a thread each.

When its workers start, the service raises the cyclic garbage collector's first threshold
unless the process chose its own (:func:`collect_less_often`).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from typing import Callable

from jetwake.engine.execution.execution_metrics import Counts, member_counts
from jetwake.engine.execution.tasklet import DONE_STATE, NO_PROGRESS, ProcessorTasklet
from jetwake.snapshot.protocol.snapshot_context import SnapshotContext

__all__ = ["ExecutionService", "Execution", "CooperativeWorker", "collect_less_often",
           "CPYTHON_GC_THRESHOLDS", "GC_FIRST_THRESHOLD"]

log = logging.getLogger("jetwake.execution")

CPYTHON_GC_THRESHOLDS = (700, 10, 10)
GC_FIRST_THRESHOLD = 10_000


def collect_less_often() -> None:
    """Raises the cyclic GC's first threshold from CPython's 700 to 10,000 container
    allocations, unless the process set its own thresholds (then they are left alone).

    Items travel as tuples (pairs, timestamped values), which the GC tracks: a chunk of a few
    thousand records crossing a stage allocates thousands at once, so with 700 a first-generation
    collection ran every few hundred records and a full one, which visits every tracked object
    of the process including the items waiting in queues, every ~70,000 allocations. On a
    Kafka -> JSON map -> Kafka job that was 35-40% of the run; 2,000 or 10,000 gave it back
    (docs/performance.md). Garbage cycles are still collected, after more allocations."""
    if gc.get_threshold() == CPYTHON_GC_THRESHOLDS:
        gc.set_threshold(GC_FIRST_THRESHOLD, *CPYTHON_GC_THRESHOLDS[1:])


class Execution:
    """The tasklets of one job on this member, and how their run ended."""

    def __init__(self, name: str, tasklets: list[ProcessorTasklet],
                 on_end: Callable[["Execution"], None],
                 snapshot: SnapshotContext | None = None) -> None:
        self.name = name
        self.snapshot = snapshot
        self.tasklets = tasklets
        self._on_end = on_end
        self._remaining = len(tasklets)
        self._lock = threading.Lock()
        self.cancelled = False
        self.error: BaseException | None = None
        self.error_tasklet: str | None = None
        self.finished = threading.Event()

    def fail(self, tasklet: ProcessorTasklet, error: BaseException) -> None:
        with self._lock:
            if self.error is None and not self.cancelled:
                self.error = error
                self.error_tasklet = tasklet.name
            self.cancelled = True

    def cancel(self) -> None:
        self.cancelled = True

    def metrics(self) -> Counts:
        """What its processors counted (one member: all of them)."""
        return member_counts(self.tasklets)

    def tasklet_ended(self, tasklet: ProcessorTasklet) -> None:
        try:
            tasklet.close()
        except Exception as e:  # a failing close() must not hide the job's outcome
            log.warning("processor %s failed in close(): %r", tasklet.name, e)
            if self.error is None and not self.cancelled:
                self.fail(tasklet, e)
        if self.snapshot is not None:
            self.snapshot.tasklet_ended(tasklet)
        with self._lock:
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self.finished.set()
            self._on_end(self)


class CooperativeWorker(threading.Thread):
    """One of the service's threads for cooperative tasklets: calls each of its tasklets in
    turn, hands a tasklet over when another worker steals it, and backs off when idle."""

    def __init__(self, service: "ExecutionService", index: int) -> None:
        super().__init__(name=f"jetwake-cooperative-{index}", daemon=True)
        self.service = service
        self.tasklets: list[ProcessorTasklet] = []
        # handed over by other threads (submission, work stealing); deque ops are atomic
        self.incoming: deque[ProcessorTasklet] = deque()
        self.wakeup = threading.Event()

    def run(self) -> None:
        idle = 0
        service = self.service
        while not service.shut_down:
            while self.incoming:
                self.tasklets.append(self.incoming.popleft())
            if not self.tasklets:
                self.wakeup.wait(0.05)
                self.wakeup.clear()
                continue
            progress = False
            removed = False
            for t in list(self.tasklets):
                thief = t.steal_to
                if thief is not None:
                    t.steal_to = None
                    self.tasklets.remove(t)
                    thief.give(t)
                    continue
                ex = t.execution
                assert ex is not None  # set by submit()
                if ex.cancelled:
                    self.tasklets.remove(t)
                    removed = True
                    ex.tasklet_ended(t)
                    continue
                try:
                    result = t.call()
                except BaseException as e:  # noqa: BLE001 - any error fails the job
                    ex.fail(t, e)
                    self.tasklets.remove(t)
                    removed = True
                    ex.tasklet_ended(t)
                    continue
                if result == DONE_STATE:
                    self.tasklets.remove(t)
                    removed = True
                    ex.tasklet_ended(t)
                elif result != NO_PROGRESS:
                    progress = True
            if removed:
                service.try_steal_for(self)
            if progress or removed:
                idle = 0
            else:
                idle += 1
                _back_off(idle)

    def give(self, tasklet: ProcessorTasklet) -> None:
        self.incoming.append(tasklet)
        self.wakeup.set()


def _back_off(idle: int) -> None:
    if idle < 16:
        time.sleep(0)  # let other threads take the GIL
    elif idle < 64:
        time.sleep(0.0001)
    else:
        time.sleep(0.001)


class ExecutionService:
    def __init__(self, cooperative_threads: int = 2) -> None:
        if cooperative_threads < 1:
            raise ValueError(f"cooperative_threads must be >= 1, got {cooperative_threads}")
        self.shut_down = False
        self._workers = [CooperativeWorker(self, i) for i in range(cooperative_threads)]
        self._lock = threading.Lock()
        self._started = False
        self._next_worker = 0

    def _start(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                collect_less_often()
                for w in self._workers:
                    w.start()

    def submit(self, execution: Execution) -> None:
        """Starts the tasklets of ``execution``; they must have been ``init()``-ed."""
        self._start()
        for t in execution.tasklets:
            t.execution = execution
            if t.is_cooperative:
                w = self._workers[self._next_worker % len(self._workers)]
                self._next_worker += 1
                w.give(t)
            else:
                threading.Thread(target=self._run_blocking, args=(t,), daemon=True,
                                 name=f"jetwake-blocking-{t.name}").start()

    @staticmethod
    def _run_blocking(t: ProcessorTasklet) -> None:
        ex = t.execution
        assert ex is not None  # set by submit()
        idle = 0
        while True:
            if ex.cancelled:
                break
            try:
                result = t.call()
            except BaseException as e:  # noqa: BLE001
                ex.fail(t, e)
                break
            if result == DONE_STATE:
                break
            if result == NO_PROGRESS:
                idle += 1
                _back_off(idle)
            else:
                idle = 0
        ex.tasklet_ended(t)

    def try_steal_for(self, thief: CooperativeWorker) -> None:
        target = max(self._workers, key=lambda w: len(w.tasklets))
        if target is thief or len(target.tasklets) - len(thief.tasklets) < 2:
            return
        for t in reversed(target.tasklets):
            if t.steal_to is None:
                t.steal_to = thief
                return

    def worker_loads(self) -> list[int]:
        return [len(w.tasklets) for w in self._workers]

    def shutdown(self) -> None:
        self.shut_down = True
        for w in self._workers:
            w.wakeup.set()
