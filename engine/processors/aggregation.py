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
from ..processor import Inbox, Processor

__all__ = ["AccumulateProcessor", "CombineProcessor", "AggregateProcessor"]

_NO_ACC = object()


class AccumulateProcessor(Processor):
    """Stage 1: items -> one accumulator per key; emits (key, acc), or acc when keyless."""

    def __init__(self, op: AggregateOperation, key_fn: Callable[[Any], Any] | None) -> None:
        self.op = op
        self.key_fn = key_fn
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
            self.op.accumulate_grouped(self.table, map(self.key_fn, items), items)

    def complete(self) -> bool:
        if self._emitter is None:
            if self.key_fn is None:
                out = [] if self.acc is _NO_ACC else [self.acc]
            else:
                out = self.table.items()
            self._emitter = ChunkEmitter(out)
        return self._emitter.emit(self.outbox)


class CombineProcessor(Processor):
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


class AggregateProcessor(Processor):
    """Single-stage aggregation of raw items, for operations that cannot combine."""

    def __init__(self, op: AggregateOperation, key_fn: Callable[[Any], Any] | None) -> None:
        self.accumulate = AccumulateProcessor(op, key_fn)
        self.op = op
        self.key_fn = key_fn
        self._emitter: ChunkEmitter | None = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self.accumulate.process(ordinal, inbox)

    def complete(self) -> bool:
        if self._emitter is None:
            finish = self.op.finish
            acc = self.accumulate
            if self.key_fn is None:
                out: Any = [finish(self.op.create() if acc.acc is _NO_ACC else acc.acc)]
            else:
                out = ((k, finish(a)) for k, a in acc.table.items())
            self._emitter = ChunkEmitter(out)
        return self._emitter.emit(self.outbox)
