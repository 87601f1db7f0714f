"""Batch aggregation in two stages (seed 003): accumulate locally, combine after the shuffle.

The accumulating processor folds its items into one accumulator per key and, when its input
ends, emits ``(key, acc)`` pairs over a partitioned edge; the combining processor merges the
accumulators of each key and emits ``(key, result)``. Without a key, one accumulator travels to
a single combining processor. An operation that cannot combine runs in one stage: raw items go
over the partitioned edge to :class:`AggregateProcessor`.
"""

from __future__ import annotations

from typing import Any, Callable

from ..chunk_emitter import ChunkEmitter
from ..pipeline.aggregate import AggregateOperation
from ..pipeline.fusion import is_identity
from ..processor import Inbox, Processor
from ..state_saver import StateSaver

__all__ = ["AccumulateProcessor", "CombineProcessor", "AggregateProcessor"]

_NO_ACC = object()


class _SavesAccumulators(Processor):
    """Snapshot support shared by the aggregating processors: the accumulator table keyed by
    the grouping key (restored to the key's owner), or the single keyless accumulator."""

    table: dict
    acc: Any
    keyed: bool
    _saver: StateSaver | None = None

    def save_to_snapshot(self) -> bool:
        if self._saver is None:
            if self.keyed:
                entries: Any = list(self.table.items())
            else:
                # a key unique to this processor, so exactly one processor restores it
                entries = [] if self.acc is _NO_ACC else [
                    (("keyless-acc", self.context.vertex_name,
                      self.context.global_processor_index), self.acc)]
            self._saver = StateSaver(entries)
        if self._saver.save(self.outbox):
            self._saver = None
            return True
        return False

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        combine = self.op.combine  # type: ignore[attr-defined]
        for key, acc in inbox.drain():
            if self.keyed:
                mine = self.table.get(key, _NO_ACC)
                self.table[key] = acc if mine is _NO_ACC else combine(mine, acc)
            else:
                self.acc = acc if self.acc is _NO_ACC else combine(self.acc, acc)


class AccumulateProcessor(_SavesAccumulators):
    """Stage 1: items -> one accumulator per key; emits (key, acc), or acc when keyless."""

    def __init__(self, op: AggregateOperation, key_fn: Callable[[Any], Any] | None) -> None:
        self.op = op
        self.key_fn = key_fn
        self.keyed = key_fn is not None
        self._identity_key = key_fn is not None and is_identity(key_fn)
        self.table: dict = {}
        self.acc: Any = _NO_ACC
        self._emitter: ChunkEmitter | None = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        items = inbox.drain()
        if self.key_fn is None:
            if self.acc is _NO_ACC:
                self.acc = self.op.create()
            self.acc = self.op.accumulate_all(self.acc, items)
        else:
            keys = items if self._identity_key else map(self.key_fn, items)
            self.op.accumulate_grouped(self.table, keys, items)

    def complete(self) -> bool:
        if self._emitter is None:
            if self.key_fn is None:
                out = [] if self.acc is _NO_ACC else [self.acc]
            else:
                out = self.table.items()
            self._emitter = ChunkEmitter(out)
        return self._emitter.emit(self.outbox)


class CombineProcessor(_SavesAccumulators):
    """Stage 2: merges accumulators per key; emits (key, finish(acc)), or finish(acc)."""

    def __init__(self, op: AggregateOperation, keyed: bool) -> None:
        self.op = op
        self.keyed = keyed
        self.table: dict = {}
        self.acc: Any = _NO_ACC
        self._emitter: ChunkEmitter | None = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        items = inbox.drain()
        if self.keyed:
            self.op.combine_grouped(self.table, items)
            return
        combine = self.op.combine
        for acc in items:
            self.acc = acc if self.acc is _NO_ACC else combine(self.acc, acc)  # type: ignore[misc]

    def complete(self) -> bool:
        if self._emitter is None:
            finish = self.op.finish
            if self.keyed:
                out: Any = ((k, finish(a)) for k, a in self.table.items())
            else:
                # a keyless aggregation of no items still has a result: that of create()
                acc = self.op.create() if self.acc is _NO_ACC else self.acc
                out = [finish(acc)]
            self._emitter = ChunkEmitter(out)
        return self._emitter.emit(self.outbox)


class AggregateProcessor(AccumulateProcessor):
    """Single-stage aggregation of raw items, for operations that cannot combine.

    Each key's items all reach this processor, so a restore never needs to combine: a
    snapshot entry is the key's whole accumulator.
    """

    def complete(self) -> bool:
        if self._emitter is None:
            finish = self.op.finish
            if self.key_fn is None:
                out: Any = [finish(self.op.create() if self.acc is _NO_ACC else self.acc)]
            else:
                out = ((k, finish(a)) for k, a in self.table.items())
            self._emitter = ChunkEmitter(out)
        return self._emitter.emit(self.outbox)

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for key, acc in inbox.drain():
            if self.keyed:
                self.table[key] = acc
            else:
                self.acc = acc
