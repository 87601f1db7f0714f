"""Batch aggregation in two stages, as in Jet: accumulate locally, combine after the shuffle.

The accumulating processor folds its items into one accumulator per key and, when its input
ends, emits ``(key, acc)`` pairs over a partitioned edge; the combining processor merges the
accumulators of each key and emits ``(key, result)``. Without a key, one accumulator travels to
a single combining processor. An operation that cannot combine runs in one stage: raw items go
over the partitioned edge to :class:`AggregateProcessor`.
"""

from __future__ import annotations

from typing import Any, Callable

from jetwake.engine.core.chunk_emitter import ChunkEmitter
from jetwake.engine.operations.aggregate import AggregateOperation
from jetwake.engine.core.functions import is_identity
from jetwake.engine.core.partitioning import all_to_one_target
from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext
from jetwake.snapshot.protocol.state_saver import StateSaver

__all__ = ["AccumulateProcessor", "CombineProcessor", "AggregateProcessor", "NO_ACC",
           "accumulate_chunk"]

class _NoAccumulator:
    """A keyless aggregation's accumulator before its first item."""

    def __reduce__(self) -> str:
        # pickled by name, so that it stays the one object in a Spark worker too (a function
        # the backfill ships by value would otherwise carry a copy that is not NO_ACC)
        return "NO_ACC"

    def __repr__(self) -> str:
        return "NO_ACC"


NO_ACC = _NoAccumulator()


def accumulate_chunk(op: AggregateOperation, key_fn: Callable[[Any], Any] | None, items: list,
                     table: dict, acc: Any = NO_ACC, identity_key: bool = False) -> Any:
    """Accumulates a chunk of items in their order: keyed, into ``table`` (key -> acc, one
    ``accumulate_grouped`` call; ``identity_key``: the items are their own keys); keyless,
    into ``acc`` (``NO_ACC`` before the first item, one ``accumulate_all`` call). Returns the
    keyless accumulator (``acc`` unchanged when keyed). The accumulating processors and the
    Spark backfill's aggregation of an operation without combine both accumulate with this,
    so the operation sees the same calls in the same order."""
    if key_fn is None:
        return op.accumulate_all(op.create() if acc is NO_ACC else acc, items)
    op.accumulate_grouped(table, items if identity_key else map(key_fn, items), items)
    return acc


class _SavesAccumulators(Processor):
    """Snapshot support shared by the aggregating processors: the accumulator table keyed by
    the grouping key (restored to the key's owner), or the single keyless accumulator.

    Once complete() has returned True the result is downstream; the state the engine saves
    then (and keeps in every later snapshot) is only a marker saying so, and a processor
    restored from it emits nothing: emitting the result again would count it twice."""

    table: dict
    acc: Any
    keyed: bool
    _emitter: ChunkEmitter | None
    _saver: StateSaver | None = None
    _completed = False  # complete() returned True (or the restored state says it had)

    def _completed_key(self) -> BroadcastKey:
        return BroadcastKey(("aggregation-completed", self.context.vertex_name,
                             self.context.global_processor_index))

    def save_to_snapshot(self) -> bool:
        if self._completed:
            return self.outbox.offer_to_snapshot(self._completed_key(), True)
        if self._saver is None:
            if self.keyed:
                entries: Any = list(self.table.items())
            else:
                # a key unique to this processor, so exactly one processor restores it
                entries = [] if self.acc is NO_ACC else [
                    (("keyless-acc", self.context.vertex_name,
                      self.context.global_processor_index), self.acc)]
            self._saver = StateSaver(entries)
        if self._saver.save(self.outbox):
            self._saver = None
            return True
        return False

    def _restored_marker(self, key: Any) -> bool:
        """Whether ``key`` is a completion marker (of this processor or of another one)."""
        if type(key) is not BroadcastKey:
            return False
        if key == self._completed_key():
            self._completed = True
        return True

    def _emit_result(self, make_output: Any) -> bool:
        """complete(): emits ``make_output()`` across calls, once."""
        if self._completed:
            return True
        if self._emitter is None:
            self._emitter = ChunkEmitter(make_output())
        self._completed = self._emitter.emit(self.outbox)
        return self._completed

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        combine = self.op.combine  # type: ignore[attr-defined]
        for key, acc in inbox.drain():
            if self._restored_marker(key):
                continue
            if self.keyed:
                mine = self.table.get(key, NO_ACC)
                self.table[key] = acc if mine is NO_ACC else combine(mine, acc)
            else:
                self.acc = acc if self.acc is NO_ACC else combine(self.acc, acc)


class AccumulateProcessor(_SavesAccumulators):
    """Stage 1: items -> one accumulator per key; emits (key, acc), or acc when keyless."""

    def __init__(self, op: AggregateOperation, key_fn: Callable[[Any], Any] | None) -> None:
        self.op = op
        self.key_fn = key_fn
        self.keyed = key_fn is not None
        self._identity_key = key_fn is not None and is_identity(key_fn)
        self.table: dict = {}
        self.acc: Any = NO_ACC
        self._emitter: ChunkEmitter | None = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self.acc = accumulate_chunk(self.op, self.key_fn, inbox.drain(), self.table, self.acc,
                                    self._identity_key)

    def complete(self) -> bool:
        if self.key_fn is None:
            return self._emit_result(lambda: [] if self.acc is NO_ACC else [self.acc])
        return self._emit_result(self.table.items)


class CombineProcessor(_SavesAccumulators):
    """Stage 2: merges accumulators per key; emits (key, finish(acc)), or finish(acc)."""

    def __init__(self, op: AggregateOperation, keyed: bool) -> None:
        self.op = op
        self.keyed = keyed
        self.table: dict = {}
        self.acc: Any = NO_ACC
        self._emitter: ChunkEmitter | None = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        items = inbox.drain()
        if self.keyed:
            self.op.combine_grouped(self.table, items)
            return
        combine = self.op.combine
        for acc in items:
            self.acc = acc if self.acc is NO_ACC else combine(self.acc, acc)  # type: ignore[misc]

    def complete(self) -> bool:
        def output() -> Any:
            finish = self.op.finish
            if self.keyed:
                return ((k, finish(a)) for k, a in self.table.items())
            return _keyless_result(self.context, self.op, self.acc)
        return self._emit_result(output)


class AggregateProcessor(AccumulateProcessor):
    """Single-stage aggregation of raw items, for operations that cannot combine.

    Each key's items all reach this processor, so a restore never needs to combine: a
    snapshot entry is the key's whole accumulator.
    """

    def complete(self) -> bool:
        def output() -> Any:
            finish = self.op.finish
            if self.key_fn is None:
                return _keyless_result(self.context, self.op, self.acc)
            return ((k, finish(a)) for k, a in self.table.items())
        return self._emit_result(output)

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for key, acc in inbox.drain():
            if self._restored_marker(key):
                continue
            if self.keyed:
                self.table[key] = acc
            else:
                self.acc = acc


def _keyless_result(context: ProcessorContext, op: AggregateOperation, acc: Any) -> list:
    """The result of a keyless aggregation, from the processor the all-to-one edge feeds. A
    keyless aggregation of no items still has a result (that of ``create()``), but only that
    processor gives it: the vertex's processors on the other members of a cluster get nothing,
    and must not add a result of their own."""
    if acc is NO_ACC:
        if context.global_processor_index != all_to_one_target(
                context.vertex_name, context.member_count, context.local_parallelism):
            return []
        acc = op.create()
    return [op.finish(acc)]
