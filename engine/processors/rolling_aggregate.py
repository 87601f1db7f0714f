"""Rolling aggregation: each item updates its key's accumulator and emits the current result.

Keyed, after a partitioned edge: ``(key, result)`` for every item. Keyless, on one processor:
the result alone. On a stage with timestamps the input and output are ``Timestamped`` values and
each output keeps its input's timestamp.
"""

from __future__ import annotations

from typing import Any, Callable

from jetwake.snapshot.state.state_snapshots import (
    restore_keyed_state, saved_state_files, state_snapshot_entries,
)
from jetwake.engine.operations.aggregate import AggregateOperation
from jetwake.engine.core.processor import Inbox
from jetwake.engine.processors.event_time_base import MISSING, EventTimeProcessor

__all__ = ["RollingAggregateProcessor"]


class RollingAggregateProcessor(EventTimeProcessor):
    def __init__(self, stage_name: str, op: AggregateOperation,
                 key_fn: Callable[[Any], Any] | None, timestamped: bool) -> None:
        self.stage_name = stage_name
        self.op = op
        self.key_fn = key_fn
        self.timestamped = timestamped
        self.accs: dict = {}
        # each result is emitted while its accumulator lives on: never the accumulator itself
        self._export = op.detached_export(op.create())

    def init(self, context) -> None:
        super().init(context)
        if context.state_backend != "memory":  # JobConfig(state_backend="rocksdb")
            self.accs = context.keyed_state("accumulators")

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        items = inbox.drain()
        op = self.op
        create, accumulate, export = op.create, op.accumulate, self._export
        accs = self.accs
        get = accs.get
        key_fn = self.key_fn
        out: list[Any] = []
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

    _restored_files: list | None = None  # saved RocksDB checkpoints, restored at the end

    def _snapshot_entries(self):
        # RocksDB state: one entry referring to a checkpoint's files (see snapshot/state/state_snapshots.py)
        files = state_snapshot_entries(self.context, "accumulators", self.accs)
        if files is not None:
            return files
        if not isinstance(self.accs, dict):
            self.accs.flush()  # phase 1: the write-back cache reaches disk in one batch
        return iter(self.accs.items())

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        combine = self.op.combine
        for k, acc in inbox.drain():
            files = saved_state_files(k, acc, "accumulators")
            if files is not None:
                if self._restored_files is None:
                    self._restored_files = []
                self._restored_files.append(files)
                continue
            old = self.accs.get(k, MISSING)
            if old is MISSING or combine is None:
                self.accs[k] = acc
            else:
                self.accs[k] = combine(old, acc)

    def finish_snapshot_restore(self) -> bool:
        if self._restored_files:
            restore_keyed_state(self.accs, self._restored_files, self.context.owned_partitions)
        self._restored_files = None
        return True
