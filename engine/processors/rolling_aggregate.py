"""Rolling aggregation: each item updates its key's accumulator and emits the current result.

Keyed, after a partitioned edge: ``(key, result)`` for every item. Keyless, on one processor:
the result alone. On a stage with timestamps the input and output are ``(ts, item)`` pairs and
each output keeps its input's timestamp.
"""

from __future__ import annotations

from typing import Any, Callable

from ..pipeline.aggregate import AggregateOperation
from ..processor import Inbox
from .event_time_base import MISSING, EventTimeProcessor

__all__ = ["RollingAggregateProcessor"]


class RollingAggregateProcessor(EventTimeProcessor):
    def __init__(self, stage_name: str, op: AggregateOperation,
                 key_fn: Callable[[Any], Any] | None, timestamped: bool) -> None:
        self.stage_name = stage_name
        self.op = op
        self.key_fn = key_fn
        self.timestamped = timestamped
        self.accs: dict = {}

    def init(self, context) -> None:
        super().init(context)
        if context.state_factory is not None:  # JobConfig(state_backend="rocksdb")
            self.accs = context.keyed_state("accumulators")

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        items = inbox.drain()
        op = self.op
        create, accumulate, export = op.create, op.accumulate, op.export
        accs = self.accs
        get = accs.get
        key_fn = self.key_fn
        out = []
        append = out.append
        if self.timestamped:
            for t, x in items:
                k = key_fn(x) if key_fn is not None else None
                acc = get(k, MISSING)
                acc = accumulate(create() if acc is MISSING else acc, x)
                accs[k] = acc
                append((t, (k, export(acc)) if key_fn is not None else export(acc)))
        else:
            for x in items:
                k = key_fn(x) if key_fn is not None else None
                acc = get(k, MISSING)
                acc = accumulate(create() if acc is MISSING else acc, x)
                accs[k] = acc
                append((k, export(acc)) if key_fn is not None else export(acc))
        self._emit(out)
        self._flush()

    def try_process(self) -> bool:
        return self._flush()

    def complete(self) -> bool:
        return self._flush()

    def _snapshot_entries(self):
        if not isinstance(self.accs, dict):
            self.accs.flush()  # phase 1: the write-back cache reaches disk in one batch
        return iter(self.accs.items())

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        combine = self.op.combine
        for k, acc in inbox.drain():
            old = self.accs.get(k, MISSING)
            if old is MISSING or combine is None:
                self.accs[k] = acc
            else:
                self.accs[k] = combine(old, acc)
