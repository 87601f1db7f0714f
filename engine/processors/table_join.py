"""``Stage.join_table``: each stream item joined to a table's current value for its key.

The table is a changelog of ``(key, value)`` (``Sources.kafka_table``, a compacted topic; a
value of None is a tombstone that deletes the key) kept in keyed state (RocksDB with
``JobConfig(state_backend="rocksdb")``). Ordinal 0 is the stream, ordinal 1 the table.

*Partitioned* (the default) both edges are partitioned by key, so the processor that owns a
key's partition holds its table entry and receives the stream items of that key: each
processor holds its share and saves it under the table's keys. *Broadcast* (``broadcast=True``,
Kafka Streams' GlobalKTable) the table edge goes to every processor, which holds the whole
table; the stream is not shuffled. Processor 0 saves the table under broadcast keys and the
restore gives it to every processor.

**Bootstrap: the "table ready" signal.** Both inputs are unbounded, so an edge priority (which
waits for the end of an input) cannot order them. With ``bootstrap=True`` each table source
processor, on a first start, reads its partitions up to their end offsets as of the job's start
and then emits :class:`TableReady` markers in-band, after the records read, on the same edge:
one marker per partition of the job's partitioning (:func:`route_keys`), so that whatever the
edge (partitioned by key, or broadcast) and however many members, every join processor hears
from every table source processor, after that processor's bootstrap records (an edge keeps
each sender's order). A join processor leaves its stream input queued
(:attr:`Processor.paused_inputs`: the queue fills and backpressures the stream's sources, no
item is buffered here) until it has heard from all ``sources`` table source processors.

A table source processor that is restored from a snapshot sends its markers at once: the
snapshot is a consistent cut, the restored table is the table the stream items after the cut
met in the first run, and catching up with what the table topic received since then happens
while the stream flows, as in the steady state. A table source never lets a snapshot barrier
pass before its markers (it reads on inside ``save_to_snapshot``), so a snapshot never holds a
half-read table, and barrier alignment can never wait on a stream the join holds back.

The join rule (:class:`TableJoinRule`) and the changelog's application
(:func:`apply_changes`) are shared with the Spark backfill, as is the snapshot codec
(:class:`TableEntries`): a backfill's hand-off writes the table exactly as the processor saves
it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from jetwake.engine.core.partitioning import PARTITION_COUNT, partition_of
from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext
from jetwake.engine.core.serialization import register_type
from jetwake.snapshot.protocol.state_saver import StateSaver
from jetwake.snapshot.state.state_snapshots import (
    restore_keyed_state, saved_state_files, state_snapshot_entries,
)

__all__ = ["TableJoinProcessor", "TableReady", "TableJoinRule", "TableEntries",
           "apply_changes", "route_keys", "table_route_key", "drop_table_markers",
           "TABLE_READY_TYPE_ID"]

TABLE_READY_TYPE_ID = 23
"""The serialization id of :class:`TableReady` (markers cross the network in a cluster)."""

_STATE = "table"


class TableReady:
    """In-band marker of a table source processor: "table source processor ``source`` (of
    ``sources``) has emitted the whole table as of the job's start". ``route_key`` makes a
    partitioned edge deliver it to the owner of one partition."""

    __slots__ = ("source", "sources", "route_key")

    def __init__(self, source: int, sources: int, route_key: int) -> None:
        self.source = source
        self.sources = sources
        self.route_key = route_key

    def __repr__(self) -> str:
        return f"TableReady({self.source}/{self.sources})"


register_type(TABLE_READY_TYPE_ID, TableReady,
              lambda m: [m.source, m.sources, m.route_key],
              lambda v: TableReady(v[0], v[1], v[2]))

_ROUTE_KEYS: list[int] = []


def route_keys() -> list[int]:
    """One int key per partition of the job's partitioning (the smallest that falls in it):
    markers keyed by these reach every partition owner of a partitioned edge."""
    if not _ROUTE_KEYS:
        found: dict[int, int] = {}
        k = 0
        while len(found) < PARTITION_COUNT:
            found.setdefault(partition_of(k), k)
            k += 1
        _ROUTE_KEYS.extend(found[p] for p in range(PARTITION_COUNT))
    return _ROUTE_KEYS


def ready_markers(source: int, sources: int) -> list[TableReady]:
    """The markers a table source processor emits once it has read the table."""
    return [TableReady(source, sources, k) for k in route_keys()]


def table_route_key(entry: Any) -> Any:
    """The partitioning key of a table edge's entry: a changelog pair ``(ts, (key, value))``
    goes by its key, a marker by its route key."""
    if type(entry) is TableReady:
        return entry.route_key
    return entry[1][0]


def drop_table_markers(entries: list[Any]) -> list[Any]:
    """A table source's output as plain ``(key, value)`` items, for any consumer but a table
    join: markers dropped, record timestamps taken off."""
    return [e[1] for e in entries if type(e) is not TableReady]


def apply_changes(table: Any, changes: Iterable[tuple[Any, Any]]) -> tuple[int, int]:
    """Applies changelog entries ``(key, value)`` in order to ``table`` (a dict or a keyed
    state store): a value replaces the key's, None (a tombstone) deletes the key. Returns
    ``(updates, deletes)``. The member's processor and the Spark backfill both build the table
    with this."""
    updates = deletes = 0
    for k, v in changes:
        if v is None:
            table.pop(k, None)
            deletes += 1
        else:
            table[k] = v
            updates += 1
    return updates, deletes


class TableJoinRule:
    """The join of stream items to a table: ``fn(item, value)`` for the value of
    ``key_fn(item)``; without a value, nothing ("inner") or ``fn(item, None)`` ("left"); a None
    result is dropped. The member's processor and the Spark backfill both join with this."""

    def __init__(self, key_fn: Callable[[Any], Any], fn: Callable[[Any, Any], Any],
                 how: str) -> None:
        self.key_fn = key_fn
        self.fn = fn
        self.left = how == "left"

    def join(self, items: Iterable[Any], get: Callable[[Any], Any]) -> tuple[list, int, int]:
        """``(results, hits, misses)`` of joining ``items`` to the table read by ``get``."""
        key_fn, fn, left = self.key_fn, self.fn, self.left
        out: list[Any] = []
        append = out.append
        misses = 0
        n = 0
        for item in items:
            n += 1
            value = get(key_fn(item))
            if value is None:
                misses += 1
                if not left:
                    continue
            r = fn(item, value)
            if r is not None:
                append(r)
        return out, n - misses, misses


class TableEntries:
    """The snapshot entries of a table join, one codec for its processor (which saves and
    restores them) and the Spark backfill's hand-off (which writes them): partitioned, one
    entry per table key under the key itself (restored to the key's owner); broadcast, under
    ``BroadcastKey(("table", key))`` (restored to every processor)."""

    @staticmethod
    def entry(key: Any, value: Any, broadcast: bool) -> tuple[Any, Any]:
        return (BroadcastKey(("table", key)), value) if broadcast else (key, value)

    @staticmethod
    def key(saved_key: Any) -> Any:
        """The table key of a saved entry's key."""
        return saved_key.key[1] if type(saved_key) is BroadcastKey else saved_key


class TableJoinProcessor(Processor):
    """See the module docstring."""

    def __init__(self, stage_name: str, key_fn: Callable[[Any], Any],
                 fn: Callable[[Any, Any], Any], how: str, broadcast: bool,
                 bootstrap: bool) -> None:
        self.stage_name = stage_name
        self.rule = TableJoinRule(key_fn, fn, how)
        self.broadcast = broadcast
        self.bootstrap = bootstrap
        self.table: Any = {}
        self.heard: set[int] = set()
        self.waiting = bootstrap
        self._saver: StateSaver | None = None
        self._restored_files: list | None = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        if context.state_backend != "memory":  # JobConfig(state_backend="rocksdb")
            self.table = context.keyed_state(_STATE)
        m = context.metrics
        for name in ("table_entries", "table_hits", "table_misses", "table_updates",
                     "table_deletes"):
            m.setdefault(name, 0)
        # broadcast: every processor holds the whole table; the table's size counts once per
        # member and its changes once in the job
        self._counts_entries = not self.broadcast or context.local_processor_index == 0
        self._counts_changes = not self.broadcast or context.global_processor_index == 0
        if self.waiting:
            self.paused_inputs = frozenset((0,))

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if ordinal == 1:
            self._apply(inbox.drain())
            return
        if self.waiting or not self.outbox.has_room():
            return  # left in the inbox: the stream waits for the table
        out, hits, misses = self.rule.join(inbox.drain(), self.table.get)
        m = self.context.metrics
        m["table_hits"] += hits
        m["table_misses"] += misses
        self.outbox.offer_chunk(-1, out)

    def _apply(self, entries: list[Any]) -> None:
        changes = []
        for e in entries:
            if type(e) is TableReady:
                self._heard(e)
            else:
                changes.append(e[1])
        if not changes:
            return
        updates, deletes = apply_changes(self.table, changes)
        m = self.context.metrics
        if self._counts_changes:
            m["table_updates"] += updates
            m["table_deletes"] += deletes
        if self._counts_entries:
            m["table_entries"] = len(self.table)

    def _heard(self, marker: TableReady) -> None:
        self.heard.add(marker.source)
        if self.waiting and len(self.heard) >= marker.sources:
            self.waiting = False
            self.paused_inputs = frozenset()
            self.context.logger.debug("%s#%d: table read (%d sources); joining the stream",
                                      self.stage_name, self.context.global_processor_index,
                                      marker.sources)

    # --- snapshots -------------------------------------------------------------------------

    def _entries(self) -> Iterator[tuple[Any, Any]]:
        files = state_snapshot_entries(self.context, _STATE, self.table)
        if files is not None:
            yield from files
            return
        table = self.table
        if isinstance(table, dict):
            items: Iterable[tuple[Any, Any]] = list(table.items())
        else:
            table.flush()
            items = table.items()
        broadcast = self.broadcast
        for k, v in items:
            yield TableEntries.entry(k, v, broadcast)

    def save_to_snapshot(self) -> bool:
        if self.broadcast and self.context.global_processor_index != 0:
            return True  # every processor holds the same table: one saves it
        if self._saver is None:
            self._saver = StateSaver(self._entries())
        if self._saver.save(self.outbox):
            self._saver = None
            return True
        return False

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        table = self.table
        for k, v in inbox.drain():
            files = saved_state_files(k, v, _STATE)
            if files is not None:
                if self._restored_files is None:
                    self._restored_files = []
                self._restored_files.append(files)
                continue
            table[TableEntries.key(k)] = v

    def finish_snapshot_restore(self) -> bool:
        if self._restored_files:
            parts: Iterable[int] = range(PARTITION_COUNT) if self.broadcast \
                else self.context.owned_partitions
            restore_keyed_state(self.table, self._restored_files, parts)
        self._restored_files = None
        if self._counts_entries:
            self.context.metrics["table_entries"] = len(self.table)
        return True
