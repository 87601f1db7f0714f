"""A test harness for processors, after Jet's TestSupport: ``jetwake.testing.verify_processor``.

It runs one processor through its contract the way the engine would, without an engine, and
checks the output. Every run is done several ways, and each must give the expected output:

1. plainly: the input of an ordinal in one inbox (up to the next watermark);
2. with the outbox capacity 1, so the outbox refuses and the processor must resume;
3. with a snapshot after every inbox chunk (one item each) that is saved, serialized and
   committed (phases 1 and 2) while the processor goes on with its own state;
4. with a snapshot+restore after every chunk: the saved entries are serialized at once with
   jetwake's msgpack serialization (so no live reference survives), the processor is closed,
   and a fresh one is initialized, restored (entries routed by key partition, broadcast keys
   to all, as a job restore does) and carries on with the rest of the input. Once complete()
   has returned True, a last fresh processor is restored from the final state and must emit
   nothing more (the engine keeps that state in every later snapshot).

Modes 3 and 4 are where state that a processor forgets to save, restores twice or shares with
what it emitted shows up: their output then differs from the expected one. See
docs/testing.md.
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from jetwake.engine.core.stream_items import Watermark
from jetwake.engine.core.meta_supplier import (
    MetaSupplierContext, ProcessorMetaSupplier, ProcessorSupplier, SupplierContext,
)
from jetwake.engine.core.partitioning import (
    partition_of, partitions_of_processor, processor_partition_table,
)
from jetwake.snapshot.state.keyed_state import in_memory_state_factory
from jetwake.snapshot.store.snapshot_files import SnapshotFiles, load_files, save_files
from jetwake.snapshot.store.snapshot_store import SavedFilesRef
from jetwake.engine.core.processor import BroadcastKey, Inbox, Outbox, Processor, ProcessorContext
from jetwake.engine.core.serialization import SerializationError, dumps, loads
from jetwake.engine.pipeline.connector import Sink, Source

__all__ = ["verify_processor", "ProcessorVerifier", "wm"]

DEFAULT_OUTBOX_CAPACITY = 4096
DEFAULT_COOPERATIVE_TIMEOUT = 1.0  # seconds, Jet's default budget of one cooperative call
DEFAULT_RUN_TIMEOUT = 30.0         # seconds a run may take before it counts as stalled

# fields of ProcessorContext that .context() may set; the others follow from the parallelism
_CONTEXT_FIELDS = ("job_id", "job_name", "vertex_name", "processing_guarantee", "member",
                   "logger", "state_factory", "state_backend", "snapshot_interval_ms")
_GUARANTEES = ("none", "at_least_once", "exactly_once")
_verify_runs = itertools.count(1)  # makes each run's job id unique, like a new job


def wm(timestamp: int) -> Watermark:
    """A watermark to put in an input (it goes to ``try_process_watermark``) or an expected
    output (where the processor forwards or emits it)."""
    return Watermark(timestamp)


def verify_processor(supplier: Any) -> "ProcessorVerifier":
    """Starts describing a test of the processors ``supplier()`` makes (a new one per call).

    ``supplier`` may also be a ``ProcessorSupplier``, a ``ProcessorMetaSupplier`` or a
    pipeline ``Source``/``Sink`` (``Sinks.list("out")``): they are initialized for each run
    with the run's context, as a job would, and asked for one processor at a time.

    ``verify_processor(Supplier).input([...]).expect_output([...])`` runs the processor in every
    mode and raises AssertionError naming the mode whose output differs.
    """
    return ProcessorVerifier(supplier)


@dataclass(frozen=True)
class _Mode:
    description: str
    outbox_capacity: int
    snapshot_capacity: int
    one_item_chunks: bool
    snapshots: str  # "none", "save" (not restored) or "restore"


class _SnapshotIds:
    """What ``context.snapshot`` tells a processor in a harness run: the ids of the snapshot
    being saved (``requested_id``) and committed (``phase2_id``), as the engine's snapshot
    context does."""

    def __init__(self, restored_snapshot_id: int = -1) -> None:
        self.restored_snapshot_id = restored_snapshot_id
        self.requested_id = restored_snapshot_id
        self.phase2_id = restored_snapshot_id
        self.phase2_success = True
        self.is_terminal = False


class ProcessorVerifier:
    """The builder ``verify_processor`` returns; every option returns the verifier, and
    ``expect_output``/``expect_outputs`` run the test."""

    __test__ = False  # not a pytest test class

    def __init__(self, supplier: Any) -> None:
        if isinstance(supplier, Processor):
            raise TypeError(f"verify_processor() needs a zero-argument callable that returns a "
                            f"new Processor (a class or a lambda), got the instance "
                            f"{supplier!r:.100}")
        if not (callable(supplier) or isinstance(supplier, (ProcessorSupplier,
                                                             ProcessorMetaSupplier))
                or isinstance(supplier, (Source, Sink))):
            raise TypeError(f"verify_processor() needs a zero-argument callable that returns a "
                            f"new Processor (a class or a lambda), a ProcessorSupplier, a "
                            f"ProcessorMetaSupplier, a Source or a Sink, got {supplier!r:.100}")
        self._supplier = supplier
        self._inputs: list[list] = []
        self._priorities: list[int] = []
        self._snapshots = True
        self._assert_progress = True
        self._call_complete = True
        self._outbox_capacity = DEFAULT_OUTBOX_CAPACITY
        self._checker: Callable[[list, list], bool] | None = None
        self._local_parallelism = 1
        self._global_index = 0
        self._total_parallelism = 1
        self._cooperative_timeout: float | None = DEFAULT_COOPERATIVE_TIMEOUT
        self._timeout = DEFAULT_RUN_TIMEOUT
        self._context: dict[str, Any] = {"processing_guarantee": "exactly_once"}
        self._before_each_run: Callable[[], Any] | None = None
        self._after_each_run: Callable[[], Any] | None = None
        self._until_match: tuple[float, float] | None = None

    # --- input ------------------------------------------------------------------------------

    def input(self, items: Sequence[Any]) -> "ProcessorVerifier":
        """The items of input ordinal 0, in order; a :class:`Watermark` (``wm(ts)``) among them
        goes to ``try_process_watermark`` at its place."""
        return self.inputs([items])

    def inputs(self, inputs: Sequence[Sequence[Any]],
               priorities: Sequence[int] | None = None) -> "ProcessorVerifier":
        """One list of items per input ordinal. ``priorities`` (one int per ordinal, lower
        first, as ``Edge.priority``): the inputs of a lower number are delivered completely
        before those of a higher one; inputs of equal priority take turns, a chunk each."""
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence) or not all(
                isinstance(i, Sequence) and not isinstance(i, (str, bytes)) for i in inputs):
            raise TypeError("inputs() needs a list of lists of items, one list per input "
                            f"ordinal, got {inputs!r:.100}")
        if priorities is None:
            priorities = [0] * len(inputs)
        if len(priorities) != len(inputs) or not all(
                isinstance(p, int) and not isinstance(p, bool) for p in priorities):
            raise ValueError(f"inputs(): priorities must be one int per input ordinal "
                             f"({len(inputs)}), got {priorities!r}")
        self._inputs = [list(i) for i in inputs]
        self._priorities = list(priorities)
        return self

    # --- options ----------------------------------------------------------------------------

    def disable_snapshots(self) -> "ProcessorVerifier":
        """Skips the modes with snapshots (for a processor that saves no state by design)."""
        self._snapshots = False
        return self

    def disable_progress_assertion(self) -> "ProcessorVerifier":
        """Allows calls that neither consume input nor emit (a processor waiting on time or on
        an external system); the run then fails only when it outlasts ``timeout``."""
        self._assert_progress = False
        return self

    def disable_complete_call(self) -> "ProcessorVerifier":
        """Does not call ``complete()`` after the input: checks the output before the end."""
        self._call_complete = False
        return self

    def outbox_capacity(self, capacity: int) -> "ProcessorVerifier":
        """The outbox capacity of the modes that do not force it to 1 (default 4096)."""
        _check_positive(capacity, "outbox_capacity()")
        self._outbox_capacity = capacity
        return self

    def output_checker(self, checker: Callable[[list, list], bool]) -> "ProcessorVerifier":
        """``checker(expected, actual) -> bool`` replaces equality, per output ordinal (for
        example ``lambda e, a: sorted(e) == sorted(a)`` when the order does not matter)."""
        if not callable(checker):
            raise TypeError(f"output_checker() needs a callable (expected, actual) -> bool, "
                            f"got {checker!r}")
        self._checker = checker
        return self

    def local_parallelism(self, n: int) -> "ProcessorVerifier":
        """Processors of the vertex on each member (default 1)."""
        _check_positive(n, "local_parallelism()")
        self._local_parallelism = n
        return self

    def global_processor_index(self, index: int) -> "ProcessorVerifier":
        """The index of the tested processor among ``total_parallelism`` (default 0)."""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"global_processor_index() needs an int >= 0, got {index!r}")
        self._global_index = index
        return self

    def total_parallelism(self, n: int) -> "ProcessorVerifier":
        """Processors of the vertex in the whole job (default 1). Restored entries reach the
        tested processor only when their key's partition is its own, as in a job."""
        _check_positive(n, "total_parallelism()")
        self._total_parallelism = n
        return self

    def cooperative_timeout(self, seconds: float | None) -> "ProcessorVerifier":
        """The longest a call of a cooperative processor may take (default 1 s); None turns
        the check off. Non-cooperative processors are never checked."""
        if seconds is not None and (isinstance(seconds, bool) or
                                    not isinstance(seconds, (int, float)) or seconds <= 0):
            raise ValueError(f"cooperative_timeout() needs a positive number of seconds or "
                             f"None, got {seconds!r}")
        self._cooperative_timeout = seconds
        return self

    def timeout(self, seconds: float) -> "ProcessorVerifier":
        """The longest one run may take before it counts as stalled (default 30 s)."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise ValueError(f"timeout() needs a positive number of seconds, got {seconds!r}")
        self._timeout = float(seconds)
        return self

    def context(self, **settings: Any) -> "ProcessorVerifier":
        """Job-level settings of the processor's context: ``processing_guarantee`` (default
        "exactly_once"; with "none" the snapshot modes are skipped, as such a job takes
        none), ``state_factory``, ``member`` (for connectors of maps and lists), ``job_id``,
        ``job_name``, ``vertex_name``, ``logger``."""
        unknown = sorted(set(settings) - set(_CONTEXT_FIELDS))
        if unknown:
            raise TypeError(f"context() does not take {unknown}; it takes "
                            f"{list(_CONTEXT_FIELDS)} (parallelism has its own methods)")
        g = settings.get("processing_guarantee", "exactly_once")
        if g not in _GUARANTEES:
            raise ValueError(f"context(processing_guarantee=...) must be one of {_GUARANTEES}, "
                             f"got {g!r}")
        self._context.update(settings)
        return self

    def before_each_run(self, action: Callable[[], Any]) -> "ProcessorVerifier":
        """Calls ``action()`` before each run (to reset what a source reads or a sink wrote)."""
        if not callable(action):
            raise TypeError(f"before_each_run() needs a callable, got {action!r}")
        self._before_each_run = action
        return self

    def after_each_run(self, check: Callable[[], Any]) -> "ProcessorVerifier":
        """Calls ``check()`` after each run, for what the processor did outside its outbox (a
        sink's writes); an AssertionError it raises is reported with the mode."""
        if not callable(check):
            raise TypeError(f"after_each_run() needs a callable, got {check!r}")
        self._after_each_run = check
        return self

    def run_until_output_matches(self, timeout: float,
                                 extra_time: float = 0.0) -> "ProcessorVerifier":
        """For a processor that never completes (a streaming source): calls ``complete()``
        until the output matches, failing after ``timeout`` seconds, then ``extra_time``
        seconds more, after which it must still match (nothing unexpected came later).
        ``complete()`` calls that emit nothing are allowed then, as a source polls."""
        for value, what in ((timeout, "timeout"), (extra_time, "extra_time")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"run_until_output_matches(): {what} must be a number of "
                                 f"seconds >= 0, got {value!r}")
        self._until_match = (float(timeout), float(extra_time))
        return self

    # --- running ----------------------------------------------------------------------------

    def expect_output(self, expected: Sequence[Any]) -> None:
        """Runs every mode with one output ordinal and asserts its output equals ``expected``."""
        self.expect_outputs([expected])

    def expect_outputs(self, expected: Sequence[Sequence[Any]]) -> None:
        """Runs every mode with one output ordinal per list of ``expected`` and asserts each
        ordinal's output; ``expect_outputs([])`` runs a sink (no output ordinals)."""
        if isinstance(expected, (str, bytes)) or not isinstance(expected, Sequence) or not all(
                isinstance(e, Sequence) and not isinstance(e, (str, bytes)) for e in expected):
            raise TypeError("expect_outputs() needs a list of lists, one per output ordinal, "
                            f"got {expected!r:.100}")
        if self._global_index >= self._total_parallelism:
            raise ValueError(f"global_processor_index({self._global_index}) must be below "
                             f"total_parallelism({self._total_parallelism})")
        if self._total_parallelism % self._local_parallelism:
            raise ValueError(f"total_parallelism({self._total_parallelism}) must be a multiple "
                             f"of local_parallelism({self._local_parallelism}): each member "
                             "runs local_parallelism processors")
        expected_lists = [list(e) for e in expected]
        for mode in self._modes():
            if self._before_each_run is not None:
                self._before_each_run()
            run = _Run(self, mode, len(expected_lists))
            actual = run.execute(expected_lists)
            for ordinal, (exp, act) in enumerate(zip(expected_lists, actual)):
                if not self._matches(exp, act):
                    raise AssertionError(run.describe_mismatch(ordinal, exp, act))
            if self._after_each_run is not None:
                try:
                    self._after_each_run()
                except AssertionError as e:
                    raise AssertionError(f"{run.name} {mode.description}: the after_each_run "
                                         f"check failed: {e}") from e

    def _matches(self, expected: list, actual: list) -> bool:
        if self._checker is not None:
            return bool(self._checker(expected, actual))
        return expected == actual

    def _modes(self) -> list[_Mode]:
        cap = self._outbox_capacity
        modes = [_Mode("plainly", cap, cap, False, "none"),
                 _Mode("with the outbox capacity 1 (the outbox refusing)", 1, 1, False, "none")]
        if self._snapshots and self._context.get("processing_guarantee") != "none":
            modes.append(_Mode("with a snapshot (saved, committed, not restored) after every "
                               "chunk", cap, 1, True, "save"))
            modes.append(_Mode("with a snapshot+restore after every chunk", cap, 1, True,
                               "restore"))
        return modes


class _Stalled(Exception):
    pass


class _TooMuchOutput(Exception):
    """More output than expected: the run cannot match any more (equality only)."""


class _Run:
    """One run of the processor in one mode."""

    def __init__(self, v: ProcessorVerifier, mode: _Mode, ordinal_count: int) -> None:
        self.v = v
        self.mode = mode
        self.ordinal_count = ordinal_count
        self.outputs: list[list] = [[] for _ in range(ordinal_count)]
        self.job_id = f"{v._context.get('job_id', 'verify-processor')}-{next(_verify_runs)}"
        self.snap = _SnapshotIds()
        self.next_snapshot_id = 0
        self.snapshots_taken = 0
        self.restores = 0
        self.dropped_on_restore = 0
        self.name = "processor"
        self.proc: Processor | None = None
        self.deadline = 0.0
        self.cooperative = True
        self.limits: list[int] | None = None  # expected output lengths, when compared by ==
        self.supplier: ProcessorSupplier | None = None
        self.factory: Callable[[], Any] = self._factory()
        self._files_dir: str | None = None  # saved SnapshotFiles (RocksDB checkpoints)

    # --- set-up -----------------------------------------------------------------------------

    def _context(self) -> ProcessorContext:
        v = self.v
        lp, total, index = v._local_parallelism, v._total_parallelism, v._global_index
        member_count = total // lp
        member_index, local_index = divmod(index, lp)
        settings = dict(v._context)
        settings.pop("job_id", None)
        return ProcessorContext(
            job_id=self.job_id, job_name=settings.pop("job_name", self.job_id),
            vertex_name=settings.pop("vertex_name", "verified"),
            global_processor_index=index, local_processor_index=local_index,
            local_parallelism=lp, total_parallelism=total, member_index=member_index,
            member_count=member_count,
            owned_partitions=partitions_of_processor(member_index, member_count, local_index, lp),
            # _SnapshotIds stands in for the engine's SnapshotContext: the ids a processor reads
            snapshot=(self.snap  # type: ignore[arg-type]
                      if settings.get("processing_guarantee") != "none" else None),
            logger=settings.pop("logger", logging.getLogger("jetwake.testing")),
            state_factory=settings.pop("state_factory", in_memory_state_factory),
            # a state factory given by the test stands for a backend other than memory
            state_backend=settings.pop("state_backend",
                                       "custom" if "state_factory" in v._context else "memory"),
            **settings)

    def _factory(self) -> Callable[[], Any]:
        """One processor per call: the user's callable, or the supplier a job would get."""
        v = self.v
        given = v._supplier
        meta = given.meta_supplier if isinstance(given, (Source, Sink)) else given
        if not isinstance(meta, (ProcessorMetaSupplier, ProcessorSupplier)):
            return given
        lp, total = v._local_parallelism, v._total_parallelism
        member_count = total // lp
        member_index = v._global_index // lp
        guarantee = v._context.get("processing_guarantee", "exactly_once")
        name = v._context.get("job_name", self.job_id)
        vertex = v._context.get("vertex_name", "verified")
        if isinstance(meta, ProcessorMetaSupplier):
            meta.init(MetaSupplierContext(self.job_id, name, vertex, lp, total, member_count,
                                          guarantee))
            supplier = meta.get(list(range(member_count)))(member_index)
        else:
            supplier = meta
        supplier.init(SupplierContext(self.job_id, name, vertex, lp, total, member_index,
                                      member_count, guarantee, v._context.get("member")))
        self.supplier = supplier
        return lambda: supplier.get(1)[0]

    def _new_processor(self, restored: list | None = None) -> None:
        proc = self.factory()
        if not isinstance(proc, Processor):
            raise TypeError(f"verify_processor(): the supplier returned {proc!r:.100}, not a "
                            "jetwake Processor; pass a callable that returns a new processor")
        if proc is self.proc:
            raise TypeError("verify_processor(): the supplier returned the same processor "
                            "twice; it must create a new one on every call")
        self.name = type(proc).__qualname__
        proc.outbox = Outbox(self.ordinal_count, self.mode.outbox_capacity,
                             self.mode.snapshot_capacity)
        self.proc = proc
        self.context = self._context()
        proc.init(self.context)  # not timed: the engine runs init() before any tasklet
        self.cooperative = bool(proc.is_cooperative())
        if restored is not None:
            self._restore(restored)

    def _close(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            proc.close()
        finally:
            self.context.release_state()

    # --- calls ------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        result = fn(*args)
        took = time.perf_counter() - start
        budget = self.v._cooperative_timeout
        if budget is not None and self.cooperative and took > budget:
            raise AssertionError(
                f"{self.name} {self.mode.description}: {what}() took {took:.3f} s, more than "
                f"the cooperative budget of {budget} s. A cooperative processor must return "
                "quickly (do a bounded part of the work per call and resume on the next), or "
                "return False from is_cooperative(); cooperative_timeout(None) turns the check "
                "off")
        return result

    def _collect(self) -> int:
        """Moves what the processor emitted into the outputs; returns how many entries."""
        n = 0
        outbox = self.proc.outbox  # type: ignore[union-attr]
        for o in range(self.ordinal_count):
            got = outbox.drain(o)
            n += len(got)
            self.outputs[o].extend(got)
            if self.limits is not None and len(self.outputs[o]) > self.limits[o]:
                raise _TooMuchOutput()
        return n

    def _no_progress(self, what: str) -> None:
        """A call that neither consumed nor emitted anything."""
        if self.v._assert_progress:
            raise AssertionError(
                f"{self.name} {self.mode.description}: {what} made no progress: it neither "
                "consumed input nor emitted anything, with an empty outbox. A processor that "
                "waits for time or an external system needs disable_progress_assertion()")
        if time.monotonic() > self.deadline:
            raise _Stalled(what)
        time.sleep(0.0005)  # a poll loop: let time pass before the next call

    def _until_true(self, method: str, *args: Any, snapshot_between: bool = False) -> None:
        """Calls the processor's ``method`` until it returns True, emptying the outbox after
        each call; with ``snapshot_between``, a snapshot point follows each False."""
        while True:
            proc = self.proc  # a snapshot point may have replaced it with a restored one
            added = proc.outbox.added  # type: ignore[union-attr]
            done = self._call(method, getattr(proc, method), *args)
            self._collect()
            if done:
                return
            if proc.outbox.added == added:  # type: ignore[union-attr]
                self._no_progress(f"{method}() returning False")
            elif time.monotonic() > self.deadline:
                raise _Stalled(f"{method}()")
            elif snapshot_between:
                self._snapshot_point()

    # --- the run ----------------------------------------------------------------------------

    def execute(self, expected: list[list]) -> list[list]:
        """Runs the processor; returns its output per ordinal. Stops early when the output
        has grown past the expected one, which no later output can mend."""
        self.deadline = time.monotonic() + self.v._timeout
        if self.v._checker is None:
            self.limits = [len(e) for e in expected]
        self._new_processor()
        try:
            try:
                self._feed()
                completed = False
                if self.v._until_match is not None:
                    completed = self._complete_until_match(expected)
                elif self.v._call_complete:
                    # the engine snapshots a processor between complete() calls only when it
                    # is a source: one with inputs takes none once they have all ended
                    self._until_true("complete", snapshot_between=not self.v._inputs)
                    completed = True
                if completed and self.mode.snapshots == "restore":
                    self._restore_final_state()
            except _TooMuchOutput:
                pass
            except _Stalled as e:
                raise AssertionError(
                    f"{self.name} {self.mode.description}: stalled: {e} kept going without "
                    f"finishing for {self.v._timeout} s (timeout()); output so far: "
                    f"{_short(self.outputs)}") from None
        finally:
            try:
                self._close()
            finally:
                if self.supplier is not None:
                    self.supplier.close(None)
                if self._files_dir is not None:
                    shutil.rmtree(self._files_dir, ignore_errors=True)
        return self.outputs

    def _feed(self) -> None:
        inputs = self.v._inputs
        try:
            # a processor owns the items it receives and may change them in place (a combining
            # stage extends the accumulators it gets): each run gets its own copy
            inputs = copy.deepcopy(inputs)
        except Exception:  # noqa: BLE001 - items that cannot be copied are shared, as given
            pass
        inputs_left = len(inputs)
        for step in _schedule(inputs, self.v._priorities, self.mode.one_item_chunks):
            kind, ordinal, arg = step
            if kind == "items":
                self._until_true("try_process")
                inbox = Inbox(list(arg))
                while inbox:
                    before = len(inbox)
                    added = self.proc.outbox.added  # type: ignore[union-attr]
                    self._call("process", self.proc.process, ordinal, inbox)  # type: ignore
                    self._collect()
                    if len(inbox) == before and \
                            self.proc.outbox.added == added:  # type: ignore[union-attr]
                        self._no_progress(f"process() of {_short(list(inbox), 60)}")
            elif kind == "wm":
                self._until_true("try_process_watermark", arg)
            else:
                self._until_true("complete_edge", ordinal)
                inputs_left -= 1
            if inputs_left:  # no barrier reaches a processor whose inputs have all ended
                self._snapshot_point()

    def _complete_until_match(self, expected: list[list]) -> bool:
        """Calls complete() until the output matches (see run_until_output_matches); True
        when complete() returned True."""
        timeout, extra = self.v._until_match  # type: ignore[misc]
        end = time.monotonic() + timeout
        matched_at: float | None = None
        while True:
            added = self.proc.outbox.added  # type: ignore[union-attr]
            done = self._call("complete", self.proc.complete)  # type: ignore[union-attr]
            self._collect()
            if done:
                return True
            progress = self.proc.outbox.added != added  # type: ignore[union-attr]
            if progress and not self.v._inputs:
                self._snapshot_point()
            now = time.monotonic()
            if matched_at is None:
                if all(self.v._matches(e, a) for e, a in zip(expected, self.outputs)):
                    matched_at = now
                elif now > end:
                    return False  # the caller reports the difference
            elif now - matched_at >= extra:
                return False
            if not progress:
                time.sleep(0.0005)

    # --- snapshots --------------------------------------------------------------------------

    def _snapshot_point(self) -> None:
        if self.mode.snapshots == "none":
            return
        saved = self._take_snapshot()
        if self.mode.snapshots == "restore":
            self._close()
            # the new execution starts from the snapshot just committed
            self.snap = _SnapshotIds(restored_snapshot_id=self.snap.phase2_id)
            self._new_processor(saved)
            self.restores += 1

    def _take_snapshot(self, final: bool = False) -> list[tuple[Any, Any]]:
        """Phase 1 (save, prepare) and phase 2 (commit) of one snapshot, or with ``final``
        only the save a processor makes once complete() returned True; returns the saved
        entries after a round trip through the snapshot serialization."""
        proc = self.proc
        sid = self.next_snapshot_id
        self.next_snapshot_id += 1
        self.snap.requested_id = sid
        self.context.snapshot_id = sid
        blobs: list[bytes] = []
        count = 0
        while True:
            added = proc.outbox.added  # type: ignore[union-attr]
            done = self._call("save_to_snapshot", proc.save_to_snapshot)  # type: ignore
            entries = proc.outbox.drain_snapshot()  # type: ignore[union-attr]
            if entries:
                blobs.append(self._serialize(entries, count))
                count += len(entries)
            self._collect()
            if done:
                break
            if proc.outbox.added == added:  # type: ignore[union-attr]
                self._no_progress("save_to_snapshot() returning False")
        if not final:
            self._until_true("snapshot_commit_prepare")
            self.snap.phase2_id = sid
            self.snap.phase2_success = True
            self._until_true("snapshot_commit_finish", True)
        self.snapshots_taken += 1
        saved: list[tuple[Any, Any]] = []
        for blob in blobs:
            keys, values = loads(blob)
            if any(type(v) is SavedFilesRef for v in values):
                values = [load_files(v.manifest, v.path) if type(v) is SavedFilesRef else v
                          for v in values]
            saved.extend(zip(keys, values))
        return saved

    def _restore_final_state(self) -> None:
        """After complete() returned True the engine saves the processor's final state once,
        and every later snapshot holds it; a job restored from one of those restores it, and
        then the processor's inputs end at once (its upstream finished too). Everything it
        emitted had reached downstream before that snapshot, so it must emit nothing now."""
        saved = self._take_snapshot(final=True)
        self.limits = None  # what comes now is reported below, not as a longer output
        self._close()
        self.snap = _SnapshotIds(restored_snapshot_id=self.snap.requested_id)
        self._new_processor(saved)
        self.restores += 1
        before = [len(o) for o in self.outputs]
        for ordinal in range(len(self.v._inputs)):
            self._until_true("complete_edge", ordinal)
        self._until_true("complete")
        extra = [o[n:] for o, n in zip(self.outputs, before)]
        if any(extra):
            again = extra if len(extra) > 1 else extra[0]
            raise AssertionError(
                f"{self.name} {self.mode.description}: restored from the state it saved after "
                f"complete() returned True, it emitted {_short(again)}. A job restored from "
                "a snapshot taken after the processor finished gets this too, although all it "
                "emitted had reached downstream before: save (or clear) what complete() has "
                "emitted, so that the restored processor has nothing left to emit")

    def _serialize(self, entries: list, first: int) -> bytes:
        """The entries one save_to_snapshot() call offered, serialized at once, as the snapshot
        is written: nothing the processor changes later can reach the saved state, and a
        restore gets no object the processor still holds."""
        for i, entry in enumerate(entries, first):
            if type(entry) is not tuple or len(entry) != 2:
                raise AssertionError(f"{self.name} {self.mode.description}: snapshot entry {i} "
                                     f"is {_short(entry)}, not a (key, value) tuple")
        values = [self._save_files(v) if type(v) is SnapshotFiles else v for _, v in entries]
        try:
            return dumps([[k for k, _ in entries], values])
        except SerializationError as e:
            raise AssertionError(f"{self.name} {self.mode.description}: the state saved by "
                                 f"save_to_snapshot() cannot be serialized: {e}") from e

    def _save_files(self, value: SnapshotFiles) -> SavedFilesRef:
        """Files saved as state (a RocksDB checkpoint) are linked away at once, as the snapshot
        store does: a restore gets them from there, read-only."""
        if self._files_dir is None:
            self._files_dir = tempfile.mkdtemp(prefix="jetwake-verify-")
        path = os.path.join(self._files_dir, str(len(os.listdir(self._files_dir))))
        return SavedFilesRef(path, save_files(value, path))

    def _restore(self, entries: list[tuple[Any, Any]]) -> None:
        """Gives a fresh processor the entries a job restore would route to it."""
        v = self.v
        lp, total, index = v._local_parallelism, v._total_parallelism, v._global_index
        table = processor_partition_table(total // lp, lp) if total > 1 else None
        mine = []
        for key, value in entries:
            if table is None or type(key) is BroadcastKey or table[partition_of(key)] == index:
                mine.append((key, value))
            else:
                self.dropped_on_restore += 1
        proc = self.proc
        inbox = Inbox(mine)
        while inbox:
            before = len(inbox)
            self._call("restore_from_snapshot", proc.restore_from_snapshot,  # type: ignore
                       inbox)
            if len(inbox) == before:
                raise AssertionError(
                    f"{self.name} {self.mode.description}: restore_from_snapshot() consumed "
                    f"none of {before} entries; it must remove what it restores from the inbox")
        for _ in range(1_000_000):
            if self._call("finish_snapshot_restore",
                          proc.finish_snapshot_restore):  # type: ignore[union-attr]
                break
        else:
            raise AssertionError(f"{self.name}: finish_snapshot_restore() never returned True")
        self._collect()

    # --- reporting --------------------------------------------------------------------------

    def describe_mismatch(self, ordinal: int, expected: list, actual: list) -> str:
        where = f" on output ordinal {ordinal}" if self.ordinal_count > 1 else ""
        lines = [f"{self.name} {self.mode.description}: the output{where} differs from the "
                 "expected one",
                 f"  expected ({len(expected)} items): {_short(expected, 600)}",
                 f"  actual   ({len(actual)} items): {_short(actual, 600)}"]
        if self.v._checker is None:
            n = min(len(expected), len(actual))
            i = next((i for i in range(n) if expected[i] != actual[i]), n)
            if i < n:
                lines.append(f"  first difference at index {i}: expected {_short(expected[i])},"
                             f" got {_short(actual[i])}")
            elif len(actual) > len(expected):
                lines.append(f"  first difference at index {i}: an unexpected "
                             f"{_short(actual[i])}")
            else:
                lines.append(f"  first difference at index {i}: {_short(expected[i])} is "
                             "missing")
        else:
            lines.append("  (compared with the output_checker)")
        if self.mode.snapshots != "none":
            lines.append(f"  snapshots taken: {self.snapshots_taken}, restores: {self.restores}")
        if self.dropped_on_restore:
            lines.append(f"  {self.dropped_on_restore} saved entries went to other processors "
                         f"on restore: their keys' partitions are not those of processor "
                         f"{self.v._global_index} of {self.v._total_parallelism}")
        return "\n".join(lines)


def _schedule(inputs: list[list], priorities: list[int], one_item_chunks: bool):
    """The engine's order of delivery: ("items", ordinal, chunk), ("wm", ordinal, watermark)
    and ("edge", ordinal, None) when an input ends. Inputs of a lower priority number first;
    those of one priority take turns, one chunk (or watermark) each."""
    for priority in sorted(set(priorities)):
        ordinals = [o for o, p in enumerate(priorities) if p == priority]
        steps = {o: _steps(o, inputs[o], one_item_chunks) for o in ordinals}
        active = list(ordinals)
        while active:
            for o in list(active):
                pending = steps[o]
                if pending:
                    yield pending.pop(0)
                if not pending:
                    active.remove(o)
                    yield ("edge", o, None)


def _steps(ordinal: int, items: list, one_item_chunks: bool) -> list[tuple[str, int, Any]]:
    """One input cut into chunks of items (all the items up to the next watermark, or one
    each) and watermarks."""
    out: list = []
    run: list = []
    for x in items:
        if isinstance(x, Watermark):
            if run:
                out.append(("items", ordinal, run))
                run = []
            out.append(("wm", ordinal, x))
        elif one_item_chunks:
            out.append(("items", ordinal, [x]))
        else:
            run.append(x)
    if run:
        out.append(("items", ordinal, run))
    return out


def _check_positive(n: Any, where: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{where} needs a positive int, got {n!r}")


def _short(obj: Any, limit: int = 200) -> str:
    try:
        text = repr(obj)
    except Exception as e:  # noqa: BLE001 - a broken __repr__ must not hide the failure
        text = f"<{type(obj).__qualname__} with a failing repr: {e!r}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
