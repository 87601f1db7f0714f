"""Connectors of a member's named maps: the contents as a batch source, and idempotent sinks."""

from __future__ import annotations

from typing import Any, Callable

from jetwake.engine.core.chunk_emitter import ChunkEmitter
from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.core.stream_items import IDLE_MESSAGE
from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext
from jetwake.engine.processors.source_event_time import PartitionedSource, SourceEventTime
from jetwake.engine.backfill.connector_forms import SparkReader, SparkWriter
from jetwake.engine.backfill.stage_output import StageOut

__all__ = ["MapSourceProcessor", "MapSinkProcessor", "MapJournalSourceProcessor",
           "JournalOverrunError", "MapSparkReader", "MapSparkWriter", "MapJournalEntries"]

_JOURNAL_BATCH = 4096


class JournalOverrunError(JetwakeError):
    """Events the journal source had not read yet were dropped from the bounded journal."""


class MapJournalEntries:
    """The snapshot entry of a map journal source, one codec for the processor (which saves
    and restores it) and for snapshot inspection (which shows it): under
    ``BroadcastKey(("map-journal", map name))``, ``[next sequence, highest event time or
    None]``."""

    @staticmethod
    def position(name: str, seq: int, top: int | None) -> tuple[BroadcastKey, list]:
        return BroadcastKey(("map-journal", name)), [seq, top]

    @staticmethod
    def is_position(key: Any) -> bool:
        return type(key) is BroadcastKey and type(key.key) is tuple \
            and key.key[:1] == ("map-journal",)

    @staticmethod
    def read(value: Any) -> tuple[int, int | None]:
        """``(next sequence, highest event time)``; a snapshot of an older version holds the
        sequence alone."""
        return (value, None) if isinstance(value, int) else (value[0], value[1])


class MapSourceProcessor(Processor):
    """Emits (key, value) for the entries in the partitions this processor owns.

    Its snapshot state is the set of partitions already emitted completely; a restored job
    re-reads only the others (and the one that was in progress, from its start: the map is
    read as it is then, so the output is at-least-once for that partition).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._partitions: list[int] = []
        self._done: list[int] = []
        self._emitter: ChunkEmitter | None = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._map = context.member.get_map(self.name)
        self._partitions = list(context.owned_partitions)

    def complete(self) -> bool:
        while True:
            if self._emitter is None:
                if not self._partitions:
                    return True
                self._emitter = ChunkEmitter(self._map.entries([self._partitions[0]]))
            if not self._emitter.emit(self.outbox):
                return False
            self._done.append(self._partitions.pop(0))
            self._emitter = None

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(BroadcastKey(("map-source", self.name)),
                                             list(self._done))

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        done: set[int] = set()
        for _, partitions in inbox.drain():
            done.update(partitions)
        self._done = [p for p in self._partitions if p in done]
        self._partitions = [p for p in self._partitions if p not in done]


class MapJournalSourceProcessor(Processor, PartitionedSource):
    """Streams ``(key, new_value)`` for every put into a map, from its event journal.

    The map has one journal, so one processor of the job reads it (global index 0); the others
    report themselves idle. The next sequence to read is saved in snapshots, so a restored job
    replays exactly the events after the snapshot. Events dropped from the bounded journal
    before they were read fail the job (``on_overrun="fail"``) or are counted in the
    ``journal_lost`` metric and skipped (``"skip"``), never skipped silently.

    The journal is one partition: a ``with_timestamps`` stage right after the source runs in
    it (``PartitionedSource``), and its highest timestamp is saved with the sequence.
    """

    def __init__(self, name: str, start: str, on_overrun: str) -> None:
        self.name = name
        self.start = start
        self.on_overrun = on_overrun
        self.seq: int | None = None
        self._map: Any = None
        self._reader = False
        self._idle_sent = False
        self.et: SourceEventTime | None = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._reader = context.global_processor_index == 0
        self._map = context.member.get_map(self.name)
        context.metrics.setdefault("journal_lost", 0)
        self.et = self.make_event_time(context.metrics, [(0, None)] if self._reader else [])
        if self._reader and self.start == "current":
            # "current" is the journal's end when the job starts, not when the source first
            # runs; a restore replaces it with the saved position
            self.seq = self._map.journal_next_seq()

    def _first_seq(self) -> int:
        if self.start == "current":
            return self._map.journal_next_seq()
        return self._map.journal_oldest_seq()

    def complete(self) -> bool:
        et = self.et
        if not self._reader:
            if not self._idle_sent:
                self._idle_sent = self.outbox.offer_control(IDLE_MESSAGE)
            return False
        if self.seq is None:
            self.seq = self._first_seq()
        outbox = self.outbox
        if et is not None and not et.flush(outbox):
            return False
        while outbox.has_room():
            batch = self._map.journal_read(self.seq, _JOURNAL_BATCH)
            if batch.lost:
                if self.on_overrun == "fail":
                    raise JournalOverrunError(
                        f"the event journal of map '{self.name}' dropped {batch.lost} events "
                        f"this job had not read yet (from sequence {self.seq}); raise the "
                        "member's journal_capacity, or pass on_overrun='skip' to count and "
                        "skip such gaps")
                self.context.metrics["journal_lost"] += batch.lost
            self.seq = batch.next_seq
            if not batch.events:
                if et is not None:
                    et.poll()
                    et.flush(outbox)
                return False
            out = [(e.key, e.new_value) for e in batch.events if e.kind == "put"]
            if not out:
                continue
            if et is None:
                outbox.offer_chunk(-1, out)
            else:
                et.add_items(0, out)
                if not et.flush(outbox):
                    return False
        return False

    def save_to_snapshot(self) -> bool:
        if not self._reader:
            return True
        if self.et is not None and not self.et.flush(self.outbox):
            return False  # events read before the barrier leave before it
        if self.seq is None:
            self.seq = self._first_seq()
        top = self.et.tops().get(0) if self.et is not None else None
        return self.outbox.offer_to_snapshot(*MapJournalEntries.position(self.name, self.seq,
                                                                          top))

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for _, saved in inbox.drain():
            self.seq, top = MapJournalEntries.read(saved)
            if self.et is not None and self._reader and top is not None:
                self.et.add_partition(0, top)


class MapSinkProcessor(Processor):
    """Puts (key, value) entries into a map; with ``merge_fn``, merges into existing values.

    A put is idempotent, so replaying items after a restart leaves the same map.
    """

    def __init__(self, name: str, key_fn: Callable[[Any], Any] | None,
                 value_fn: Callable[[Any], Any] | None,
                 merge_fn: Callable[[Any, Any], Any] | None = None) -> None:
        self.name = name
        self.key_fn = key_fn
        self.value_fn = value_fn
        self.merge_fn = merge_fn
        self._map: Any = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._map = context.member.get_map(self.name)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        items = inbox.drain()
        if self.key_fn is not None:
            entries = [(self.key_fn(x), self.value_fn(x)) for x in items]  # type: ignore[misc]
        else:
            entries = items
            for x in items:
                if type(x) is not tuple or len(x) != 2:
                    raise TypeError(
                        f"Sinks.map({self.name!r}) received {_short(x)}, not a (key, value) "
                        "tuple: emit 2-tuples, or pass key_fn and value_fn to Sinks.map")
        if self.merge_fn is None:
            self._map.put_all(entries)
        else:
            merge, fn = self._map.merge, self.merge_fn
            for k, v in entries:
                merge(k, v, fn)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


class MapSparkReader(SparkReader):
    """``Sources.map`` on the Spark backfill: the map's entries, read through the member (or
    Client) given to run(), sliced over the tasks."""

    needs_member = True

    def __init__(self, name: str) -> None:
        self.name = name

    def read(self, backfill: Any, t: Any, bounds: Any) -> StageOut:
        return backfill.local_items(list(backfill.member.get_map(self.name).items()))


class MapSparkWriter(SparkWriter):
    """``Sinks.map`` and ``map_with_merging`` on the Spark backfill: the entries put (or
    merged) through the member's API on the driver, chunk by chunk, in partition order."""

    needs_member = True

    def __init__(self, name: str, key_fn: Callable[[Any], Any] | None,
                 value_fn: Callable[[Any], Any] | None,
                 merge_fn: Callable[[Any, Any], Any] | None = None) -> None:
        self.name, self.key_fn, self.value_fn, self.merge_fn = name, key_fn, value_fn, merge_fn

    def write(self, backfill: Any, t: Any, chunks: Any) -> int:
        target = backfill.member.get_map(self.name)
        kf, vf, merge = self.key_fn, self.value_fn, self.merge_fn
        if kf is not None and vf is not None:
            entries = chunks.map(lambda chunk: [(kf(x), vf(x)) for x in chunk])
        else:
            entries = chunks.map(lambda chunk: [tuple(x) for x in chunk])
        n = 0
        for chunk in entries.toLocalIterator(prefetchPartitions=True):
            if not chunk:
                continue
            if merge is not None:
                for k, v in chunk:
                    target.merge(k, v, merge)
            else:
                target.put_all(chunk)
            n += len(chunk)
        return n
