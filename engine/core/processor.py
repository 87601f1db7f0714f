"""The processor contract (Jet's ``Processor``), shaped for Python: items move in chunks.

A processor receives items through an :class:`Inbox` that holds many items, and emits through
an :class:`Outbox` whose buckets have a bounded capacity and refuse items when full, which is
how backpressure reaches a processor without blocking its thread. Every method is called from
one thread at a time; cooperative processors must return within about a millisecond.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.core.stream_items import Watermark
from jetwake.engine.core.serialization import BROADCAST_KEY_TYPE_ID, register_type

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.snapshot.protocol.snapshot_context import SnapshotContext
    from jetwake.snapshot.state.keyed_state import KeyedStateBackend

__all__ = ["Processor", "Inbox", "Outbox", "ProcessorContext", "BroadcastKey"]


class Inbox:
    """The items received on one ordinal, oldest first.

    A processor removes the items it has handled (``poll``, ``remove``, ``drain``, ``clear``);
    what it leaves is offered again on the next call.
    """

    __slots__ = ("_items", "_pos")

    def __init__(self, items: list[Any] | None = None) -> None:
        self._items: list[Any] = items if items is not None else []
        self._pos = 0

    def __len__(self) -> int:
        return len(self._items) - self._pos

    def __bool__(self) -> bool:
        return len(self._items) > self._pos

    def __iter__(self) -> Iterator[Any]:
        """Iterates the remaining items without removing them."""
        items = self._items
        return iter(items if self._pos == 0 else items[self._pos:])

    def is_empty(self) -> bool:
        return len(self._items) <= self._pos

    def peek(self) -> Any:
        """The oldest item, or None when empty."""
        return self._items[self._pos] if self._pos < len(self._items) else None

    def poll(self) -> Any:
        """Removes and returns the oldest item, or None when empty."""
        if self._pos >= len(self._items):
            return None
        item = self._items[self._pos]
        self._pos += 1
        if self._pos == len(self._items):
            self._items = []
            self._pos = 0
        return item

    def remove(self) -> None:
        """Removes the oldest item."""
        if self._pos >= len(self._items):
            raise IndexError("remove() on an empty inbox")
        self.poll()

    def drain(self) -> list[Any]:
        """Removes and returns every item, as a list the caller may keep."""
        items = self._items if self._pos == 0 else self._items[self._pos:]
        self._items = []
        self._pos = 0
        return items

    def clear(self) -> None:
        self._items = []
        self._pos = 0

    def _fill(self, items: list[Any]) -> None:
        # the engine hands its drained list over without copying
        self._items = items
        self._pos = 0


class Outbox:
    """Per-ordinal buckets of emitted items, bounded by ``capacity`` items each.

    ``offer`` refuses (returns False) when the bucket is full. ``offer_chunk`` accepts a whole
    list when the bucket has room at all, so a bucket may exceed its capacity by one chunk, the
    way a Jet packet may exceed its size limit by one item. Ordinal ``-1`` means every ordinal.
    ``snapshot_capacity`` bounds the snapshot buffer the same way (default: ``capacity``).

    Code that drives a processor without an engine (tests, see docs/testing.md) reads what it
    emitted with :meth:`drain` and what it saved with :meth:`drain_snapshot`.
    """

    __slots__ = ("_entries", "_open", "_counts", "capacity", "ordinal_count", "_snapshot",
                 "_snapshot_capacity", "added")

    def __init__(self, ordinal_count: int, capacity: int = 4096,
                 snapshot_capacity: int | None = None) -> None:
        self.ordinal_count = ordinal_count
        self.capacity = capacity
        # each bucket holds data chunks (lists) and control items in emission order
        self._entries: list[list[Any]] = [[] for _ in range(ordinal_count)]
        self._open: list[list[Any] | None] = [None] * ordinal_count
        self._counts = [0] * ordinal_count
        self._snapshot: list[tuple[Any, Any]] = []
        self._snapshot_capacity = capacity if snapshot_capacity is None else snapshot_capacity
        self.added = 0  # offers accepted so far; the engine reads it to detect progress

    def has_room(self, ordinal: int = -1) -> bool:
        """Whether ``ordinal`` (or every ordinal, for -1) would accept an item now."""
        if ordinal >= 0:
            return self._counts[ordinal] < self.capacity
        cap = self.capacity
        for c in self._counts:
            if c >= cap:
                return False
        return True

    def offer(self, ordinal: int, item: Any) -> bool:
        """Adds one item to ``ordinal``'s bucket (or to all, for -1); False when full."""
        if ordinal < 0:
            if not self.has_room(-1):
                return False
            for o in range(self.ordinal_count):
                self._append(o, item)
            return True
        if self._counts[ordinal] >= self.capacity:
            return False
        self._append(ordinal, item)
        return True

    def _append(self, ordinal: int, item: Any) -> None:
        chunk = self._open[ordinal]
        if chunk is None:
            chunk = []
            self._open[ordinal] = chunk
            self._entries[ordinal].append(chunk)
        chunk.append(item)
        self._counts[ordinal] += 1
        self.added += 1

    def offer_chunk(self, ordinal: int, items: list[Any]) -> bool:
        """Adds a list of items at once; the outbox takes ownership of the list."""
        if not items:
            return True
        if ordinal < 0:
            if not self.has_room(-1):
                return False
            for o in range(self.ordinal_count):
                self._add_chunk(o, items if o == 0 else list(items))
            return True
        if self._counts[ordinal] >= self.capacity:
            return False
        self._add_chunk(ordinal, items)
        return True

    def _add_chunk(self, ordinal: int, items: list[Any]) -> None:
        self._entries[ordinal].append(items)
        self._open[ordinal] = None
        self._counts[ordinal] += len(items)
        self.added += 1

    def offer_control(self, item: Any) -> bool:
        """Adds a control item (watermark, barrier) to every ordinal, after the data so far."""
        for o in range(self.ordinal_count):
            self._entries[o].append(item)
            self._open[o] = None
        self.added += 1
        return True

    def offer_to_snapshot(self, key: Any, value: Any) -> bool:
        """Saves one state entry into the snapshot being taken; False when the buffer is full.

        The key decides which processor receives the entry at restore: a key of type
        :class:`BroadcastKey` goes to every processor, any other key to the owner of its
        partition.
        """
        if len(self._snapshot) >= self._snapshot_capacity:
            return False
        self._snapshot.append((key, value))
        self.added += 1
        return True

    def offer_all_to_snapshot(self, entries: list[tuple[Any, Any]]) -> bool:
        """Saves a list of (key, value) entries at once when the snapshot buffer has room."""
        if len(self._snapshot) >= self._snapshot_capacity:
            return False
        self._snapshot.extend(entries)
        self.added += 1
        return True

    def is_empty(self) -> bool:
        return not any(self._entries) and not self._snapshot

    def drain(self, ordinal: int = 0) -> list[Any]:
        """Removes and returns what ``ordinal``'s bucket holds, as the engine would take it:
        data items and control items (watermarks, barriers) in one list, in emission order.
        For code that runs a processor without an engine, such as tests."""
        out: list[Any] = []
        for entry in self._take(ordinal):
            if type(entry) is list:
                out.extend(entry)
            else:
                out.append(entry)
        return out

    def drain_snapshot(self) -> list[tuple[Any, Any]]:
        """Removes and returns the (key, value) entries offered to the snapshot so far, which
        frees the snapshot buffer. For code that runs a processor without an engine."""
        return self._take_snapshot()

    # used by the engine
    def _take(self, ordinal: int) -> list[Any]:
        entries = self._entries[ordinal]
        if entries:
            self._entries[ordinal] = []
            self._open[ordinal] = None
            self._counts[ordinal] = 0
        return entries

    def _put_back(self, ordinal: int, entries: list[Any]) -> None:
        if entries:
            self._entries[ordinal][:0] = entries
            self._counts[ordinal] += sum(len(e) for e in entries if type(e) is list)

    def _take_snapshot(self) -> list[tuple[Any, Any]]:
        items = self._snapshot
        self._snapshot = []
        return items


@dataclass
class ProcessorContext:
    """What a processor knows about where it runs."""

    job_id: str
    job_name: str
    vertex_name: str
    global_processor_index: int
    local_processor_index: int
    local_parallelism: int
    total_parallelism: int
    member_index: int
    member_count: int
    processing_guarantee: str = "none"
    # the job's snapshot interval (ms), for processors whose settings depend on it (a Kafka
    # transaction must outlive the interval); 0 when the job takes no snapshots
    snapshot_interval_ms: int = 0
    #: the id of the snapshot whose hook runs now, set by the engine before each call:
    #: in ``save_to_snapshot`` and ``snapshot_commit_prepare`` the snapshot being taken, in
    #: ``snapshot_commit_finish`` the snapshot being committed or rolled back
    snapshot_id: int = -1
    owned_partitions: Sequence[int] = ()
    member: Any = None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("jetwake"))
    metrics: dict[str, Any] = field(default_factory=dict)
    snapshot: "SnapshotContext | None" = None
    # (vertex, processor index, name) -> a keyed state backend; the engine sets it from
    # JobConfig.state_backend, which ``state_backend`` names ("memory", "rocksdb")
    state_factory: Callable[[str, int, str], KeyedStateBackend] | None = None
    state_backend: str = "memory"
    #: True while the processor restores a snapshot that another job wrote (the exported
    #: snapshot a job starts from, JobConfig.initial_snapshot_name, or a backfill's
    #: hand-off): a stage that converts saved state of an older shape (``migrate=``) does it
    #: then, not when its job restores its own snapshots
    restoring_other_job: bool = False
    _states: list[KeyedStateBackend] = field(default_factory=list)

    def keyed_state(self, name: str = "state") -> KeyedStateBackend:
        """A keyed state store for this processor: in memory, or RocksDB with a write-back
        cache when the job's ``JobConfig.state_backend`` is "rocksdb". Its content is the
        processor's to save in snapshots; it is deleted when the execution ends."""
        if self.state_factory is None:
            raise JetwakeError(
                f"{self.vertex_name}#{self.global_processor_index}: this ProcessorContext has no "
                "state_factory; the engine gives every processor one (to test a processor on "
                "its own, use jetwake.testing.verify_processor)")
        backend = self.state_factory(self.vertex_name, self.global_processor_index, name)
        self._states.append(backend)
        return backend

    def release_state(self) -> None:
        for backend in self._states:
            backend.destroy()
        self._states.clear()


class Processor:
    """Base class of every processor: override what you need, every method has a default.

    The engine sets ``self.outbox`` before calling :meth:`init`.
    """

    outbox: Outbox
    context: ProcessorContext

    #: True for a sink whose phase 2 makes output visible outside the job (a transaction it
    #: commits). The engine then refuses to restore past a damaged snapshot, whose phase 2 may
    #: already be visible, unless the job accepts at-least-once for that restore.
    transactional_sink: bool = False

    #: the input ordinals whose items the processor does not take now: the engine leaves them
    #: queued (their queues fill and backpressure upstream) and drains the other inputs. A
    #: processor that must first read another input to a signal sets it (a table join waits
    #: for its table); the engine reads it before each drain.
    paused_inputs: frozenset[int] = frozenset()

    def init(self, context: ProcessorContext) -> None:
        """Called once before any other method."""
        self.context = context

    def partition_lag(self) -> list[dict[str, Any]] | None:
        """For a processor that reads partitions of a log (a Kafka source): per partition,
        ``{"topic", "partition", "position", "end", "lag"}``, records behind the end of the
        log, read without a call to the log's servers (the metrics and the dashboard show
        it). None for every other processor."""
        return None

    def is_cooperative(self) -> bool:
        """False for processors that block (I/O): they get a thread of their own."""
        return True

    def process(self, ordinal: int, inbox: Inbox) -> None:
        """Handles items from ``inbox`` received on ``ordinal``; leave what you cannot emit."""
        raise NotImplementedError(
            f"{type(self).__qualname__} receives items but does not implement process()")

    def try_process(self) -> bool:
        """Called when the inbox is empty, for time-driven work; True when done for now."""
        return True

    def try_process_watermark(self, watermark: Watermark) -> bool:
        """Handles a watermark; the default forwards it. False to be called again."""
        if not self.outbox.has_room(-1):
            return False
        return self.outbox.offer_control(watermark)

    def complete_edge(self, ordinal: int) -> bool:
        """The input ``ordinal`` has ended; True when done, False to be called again."""
        return True

    def complete(self) -> bool:
        """Every input has ended (or this is a source); True when this processor is done."""
        return True

    def close(self) -> None:
        """Releases resources; called once, also after a failure or a cancellation."""

    # snapshot hooks: see docs/fault-tolerance.md
    def save_to_snapshot(self) -> bool:
        """Saves state through ``outbox.offer_to_snapshot``; True when everything is saved."""
        return True

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        """Restores (key, value) entries saved by ``save_to_snapshot`` of any processor."""
        if inbox:
            raise NotImplementedError(
                f"{type(self).__qualname__} has snapshot state but no restore_from_snapshot()")

    def finish_snapshot_restore(self) -> bool:
        """Called after the last restored entry; True when done."""
        return True

    def snapshot_commit_prepare(self) -> bool:
        """Phase 1 for sinks with external transactions; True when prepared."""
        return True

    def snapshot_commit_finish(self, success: bool) -> bool:
        """Phase 2: commit (``success``) or roll back what phase 1 prepared."""
        return True


class BroadcastKey:
    """A snapshot key restored to every processor of the vertex, not to a partition owner."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BroadcastKey) and other.key == self.key

    def __hash__(self) -> int:
        return hash(("broadcast", self.key))

    def __repr__(self) -> str:
        return f"BroadcastKey({self.key!r})"


register_type(BROADCAST_KEY_TYPE_ID, BroadcastKey, lambda b: b.key, BroadcastKey)
