"""Rolling aggregation: each item updates its key's accumulator and emits the current result.

Keyed, after a partitioned edge: ``(key, result)`` for every item. Keyless, on one processor:
the result alone. On a stage with timestamps the input and output are ``Timestamped`` values and
each output keeps its input's timestamp.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from jetwake.snapshot.state.state_snapshots import (
    restore_keyed_state, saved_state_files, state_snapshot_entries,
)
from jetwake.engine.operations.aggregate import AggregateOperation
from jetwake.engine.core.processor import Inbox
from jetwake.engine.processors.event_time_base import (
    MISSING, EventTimeProcessor, first, second,
)
from jetwake.engine.processors.state_migration import DROPPED, migrate_all, migrate_one

__all__ = ["RollingAggregateProcessor", "RollingEntries", "roll"]


def roll(accs: Any, items: Iterable[Any], key_fn: Callable[[Any], Any] | None,
         create: Callable[[], Any], accumulate: Callable[[Any, Any], Any],
         export: Callable[[Any], Any]) -> list:
    """The per-key step of a rolling aggregate over a run of items: each item updates its
    key's accumulator in ``accs`` (a dict, or a keyed state store), and its result is
    ``(key, export(acc))`` (keyless: ``export(acc)``), in the items' order. The member's
    processor and the Spark backfill both aggregate with this."""
    get = accs.get
    out: list[Any] = []
    append = out.append
    for x in items:
        k = key_fn(x) if key_fn is not None else None
        acc = get(k, MISSING)
        acc = accumulate(create() if acc is MISSING else acc, x)
        accs[k] = acc
        append((k, export(acc)) if key_fn is not None else export(acc))
    return out


class RollingEntries:
    """The snapshot entries of a rolling aggregate, one codec for its processor (which saves
    and restores them) and for the Spark backfill's hand-off (which writes them): per key its
    accumulator (restored accumulators of one key are combined)."""

    @staticmethod
    def accumulator(key: Any, acc: Any) -> tuple[Any, Any]:
        return key, acc


class RollingAggregateProcessor(EventTimeProcessor):
    def __init__(self, stage_name: str, op: AggregateOperation,
                 key_fn: Callable[[Any], Any] | None, timestamped: bool,
                 migrate: Callable[[Any], Any] | None = None) -> None:
        self.stage_name = stage_name
        self.migrate = migrate  # converts accumulators of an older shape (state_migration.py)
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
        if self.timestamped:
            out = list(zip(map(first, items), roll(self.accs, list(map(second, items)),
                                                   self.key_fn, op.create, op.accumulate,
                                                   self._export)))
        else:
            out = roll(self.accs, items, self.key_fn, op.create, op.accumulate, self._export)
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
        return (RollingEntries.accumulator(k, acc) for k, acc in self.accs.items())

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        combine = self.op.combine
        for k, acc in inbox.drain():
            files = saved_state_files(k, acc, "accumulators")
            if files is not None:
                if self._restored_files is None:
                    self._restored_files = []
                self._restored_files.append(files)
                continue
            if self.migrate is not None and self.context.restoring_other_job:
                acc = migrate_one(self.migrate, self.stage_name, k, acc, self.context.metrics)
                if acc is DROPPED:
                    continue
            old = self.accs.get(k, MISSING)
            if old is MISSING or combine is None:
                self.accs[k] = acc
            else:
                self.accs[k] = combine(old, acc)

    def finish_snapshot_restore(self) -> bool:
        if self._restored_files:
            restore_keyed_state(self.accs, self._restored_files, self.context.owned_partitions)
            if self.migrate is not None and self.context.restoring_other_job:
                migrate_all(self.accs, self.migrate, self.stage_name,
                            self.context.owned_partitions, self.context.metrics)
        self._restored_files = None
        return True
