"""Test sources (Jet's ``TestSources``): generated streams for demos, tests and benchmarks,
and a replayable items source whose sentinels fail a job at a chosen item (Bytewax's ABORT).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Sequence
from typing import Any, Callable, NamedTuple

from jetwake.engine.core.chunk_emitter import CHUNK_SIZE
from jetwake.engine.core.errors import RestartableError
from jetwake.engine.core.meta_supplier import ProcessorMetaSupplier
from jetwake.engine.pipeline.connector import Source
from jetwake.engine.pipeline.event_time import native_pair_timestamp
from jetwake.engine.pipeline.spark_form import NotOnSpark
from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext
from jetwake.connectors.items_source import ItemsSourceProcessor
from jetwake.connectors.partitioned_items import READ_ORDERS, PartitionedItemsSourceProcessor

__all__ = ["TestSources", "SimpleEvent", "ItemStreamProcessor", "TestItemsSourceProcessor",
           "TestAbort", "Abort", "WaitForSnapshot"]

MAX_BATCH = 4096  # items per call at most, to stay cooperative when catching up


class SimpleEvent(NamedTuple):
    """The default item of ``TestSources.item_stream``."""
    timestamp: int
    sequence: int


def _simple_event(timestamp: int, sequence: int) -> SimpleEvent:
    return SimpleEvent(timestamp, sequence)


class ItemStreamProcessor(Processor):
    """Emits ``generator_fn(timestamp_ms, sequence)`` at a fixed rate, for ever.

    Item ``n`` is due ``n / rate`` seconds after the start and its timestamp is that nominal
    time (wall clock, ms), so the timestamps stay regular even when the job falls behind. With
    several processors, processor ``i`` of ``p`` emits sequences ``i, i + p, ...``.
    """

    def __init__(self, items_per_second: float, generator_fn: Callable[[int, int], Any]) -> None:
        self.rate = items_per_second
        self.generator_fn = generator_fn
        self.count = 0  # items this processor emitted

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.index = context.global_processor_index
        self.total = context.total_parallelism
        self.my_rate = self.rate / self.total
        self._start_mono = time.monotonic()
        self._start_ms = time.time_ns() // 1_000_000
        self._base = self.count

    def complete(self) -> bool:
        outbox = self.outbox
        if not outbox.has_room():
            return False
        elapsed = time.monotonic() - self._start_mono
        due = self._base + int(elapsed * self.my_rate) + 1
        n = min(due - self.count, MAX_BATCH)
        if n <= 0:
            return False
        gen = self.generator_fn
        start_ms, base, rate = self._start_ms, self._base, self.my_rate
        idx, total = self.index, self.total
        chunk = []
        for c in range(self.count, self.count + n):
            ts = start_ms + int((c - base) * 1000 / rate)
            chunk.append((ts, gen(ts, idx + c * total)))
        self.count += n
        outbox.offer_chunk(-1, chunk)
        return False

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(BroadcastKey(("item-stream", self.index)),
                                             self.count)

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for key, count in inbox.drain():
            if key.key == ("item-stream", self.index):
                self.count = self._base = count


class TestAbort(RestartableError):
    """The failure a :meth:`TestSources.ABORT` sentinel causes: a job with a processing
    guarantee restarts from its last snapshot, as after any recoverable failure."""

    __test__ = False  # not a pytest test class


class _Sentinel:
    """A marker among the items of :meth:`TestSources.items`; never emitted."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        # kept in the object, which the job reuses when it restarts in this process
        self.done = False


class Abort(_Sentinel):
    """``TestSources.ABORT()``: fails the execution the first time the source reaches it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"ABORT(){' (fired)' if self.done else ''}"


class WaitForSnapshot(_Sentinel):
    """``TestSources.WAIT_FOR_SNAPSHOT()``: holds the source until a snapshot that includes
    every item before it has committed."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"WAIT_FOR_SNAPSHOT(){' (passed)' if self.done else ''}"


class TestItemsSourceProcessor(ItemsSourceProcessor):
    """The items source of :meth:`TestSources.items`: like ``Sources.items``, and it acts on
    the sentinels among the items instead of emitting them.

    At an ``ABORT`` that has not fired, it waits until the items before it have left its
    outbox, marks it fired and raises :class:`TestAbort`. At a ``WAIT_FOR_SNAPSHOT`` that has
    not passed, it emits nothing more until a snapshot that saved its position there (so every
    item before it is in that snapshot) completes phase 2 successfully.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, items: Sequence[Any]) -> None:
        super().__init__(items)
        self._sentinels: list[int] = []     # indexes of sentinels in this processor's slice
        self._armed: WaitForSnapshot | None = None  # saved at its position, not committed yet

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        items = self.items
        self._sentinels = [i for i in range(self.pos, self.end) if isinstance(items[i], _Sentinel)]
        if self._sentinels and context.processing_guarantee == "none":
            kinds = sorted({"ABORT()" if isinstance(items[i], Abort) else "WAIT_FOR_SNAPSHOT()"
                            for i in self._sentinels})
            raise ValueError(
                f"TestSources.items(): {' and '.join(kinds)} needs a job that takes snapshots, "
                "but this one runs with processing_guarantee='none' (ABORT would fail it "
                "instead of restarting it, WAIT_FOR_SNAPSHOT would wait for ever). Submit it "
                "with JobConfig(processing_guarantee='exactly_once') or 'at_least_once'")

    def complete(self) -> bool:
        outbox = self.outbox
        items = self.items
        sentinels = self._sentinels
        while self.pos < self.end and outbox.has_room():
            k = bisect.bisect_left(sentinels, self.pos)
            stop = sentinels[k] if k < len(sentinels) else self.end
            if stop > self.pos:
                stop = min(stop, self.pos + CHUNK_SIZE)
                outbox.offer_chunk(-1, list(items[self.pos:stop]))
                self.pos = stop
                continue
            sentinel = items[self.pos]
            if sentinel.done:
                self.pos += 1
            elif isinstance(sentinel, Abort):
                if not outbox.is_empty():
                    return False  # the items before it leave first
                sentinel.done = True
                raise TestAbort(f"TestSources.ABORT() at item {self.pos} of {len(items)}: the "
                                "test fails this execution on purpose; the job restarts from "
                                "its last snapshot")
            else:
                return False  # waiting for a snapshot: see save_to_snapshot
        return self.pos >= self.end

    def save_to_snapshot(self) -> bool:
        if self.pos < self.end:
            here = self.items[self.pos]
            if isinstance(here, WaitForSnapshot) and not here.done:
                self._armed = here  # this snapshot holds every item before the sentinel
        return super().save_to_snapshot()

    def snapshot_commit_finish(self, success: bool) -> bool:
        if self._armed is not None:
            if success:
                self._armed.done = True
            self._armed = None  # a failed snapshot: wait for the next one
        return True


# the test sources act on a member's execution (sentinels, snapshots, partitions spread over
# processors): they have no Spark form
_MEMBER_ONLY = NotOnSpark("a test source of member jobs; a backfill reads Sources.items, "
                          "files, parquet, json_lines, map and kafka")


class TestSources:
    """Generated sources, and the replayable items source with failure sentinels."""

    __test__ = False  # not a pytest test class

    @staticmethod
    def items(items: Iterable[Any]) -> Source:
        """The given items, in order, like ``Sources.items`` (a batch, replayed from its saved
        position after a restore), where the sentinels :meth:`ABORT` and
        :meth:`WAIT_FOR_SNAPSHOT` act instead of being emitted. The job needs a processing
        guarantee when there are sentinels. See docs/testing.md."""
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            raise TypeError(f"TestSources.items() expects an iterable of items (a list, "
                            f"tuple, range...), got {type(items).__qualname__}")
        data = items if isinstance(items, Sequence) else list(items)
        return Source("test-items", ProcessorMetaSupplier.of(
            lambda: TestItemsSourceProcessor(data), 1), spark=_MEMBER_ONLY)

    @staticmethod
    def partitioned(partitions: Sequence[Sequence[Any]], *, batch: int = 64,
                    order: str = "round_robin", seed: int = 0) -> Source:
        """A bounded source of ``len(partitions)`` partitions, each read in the given order
        and spread over the source's processors as a Kafka topic's partitions are; a
        ``with_timestamps`` stage right after it keeps a watermark per partition.

        ``order``: how a processor interleaves its partitions: "round_robin" (up to ``batch``
        items of each in turn), "sequential" (one partition to its end, then the next) or
        "random" (seeded by ``seed``). Replayable: positions are saved in snapshots."""
        if isinstance(partitions, (str, bytes)) or not isinstance(partitions, Sequence) \
                or not all(isinstance(p, Sequence) and not isinstance(p, (str, bytes))
                           for p in partitions):
            raise TypeError("TestSources.partitioned() expects a list of partitions, each a "
                            f"list of items, got {type(partitions).__qualname__}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"TestSources.partitioned(): batch must be a positive int, got "
                             f"{batch!r}")
        if order not in READ_ORDERS:
            raise ValueError(f"TestSources.partitioned(): order must be one of {READ_ORDERS}, "
                             f"got {order!r}")
        data = [list(p) for p in partitions]
        return Source("test-partitions", ProcessorMetaSupplier.of(
            lambda: PartitionedItemsSourceProcessor(data, batch, order, seed)),
            partitioned=True, spark=_MEMBER_ONLY)

    @staticmethod
    def ABORT() -> Abort:  # noqa: N802 - a sentinel, named like Bytewax's
        """A sentinel for :meth:`items`: the first time the source reaches it (once the items
        before it have left the source), the execution fails with :class:`TestAbort`, and the
        job restarts from its last snapshot. Each sentinel fires once; it is never emitted."""
        return Abort()

    @staticmethod
    def WAIT_FOR_SNAPSHOT() -> WaitForSnapshot:  # noqa: N802
        """A sentinel for :meth:`items`: the source emits nothing past it until a snapshot
        that includes every item before it has committed (phase 2 succeeded). It is never
        emitted, and after a restore from that snapshot it does not wait again."""
        return WaitForSnapshot()

    @staticmethod
    def item_stream(items_per_second: float,
                    generator_fn: Callable[[int, int], Any] | None = None) -> Source:
        """An infinite stream of ``items_per_second`` items a second; each is
        ``generator_fn(timestamp_ms, sequence)`` (default: ``SimpleEvent(timestamp,
        sequence)``). Its native timestamps are the ``timestamp_ms`` values
        (``with_native_timestamps(lag)``)."""
        if isinstance(items_per_second, bool) or not isinstance(items_per_second, (int, float)) \
                or items_per_second <= 0:
            raise ValueError(f"TestSources.item_stream(): items_per_second must be a positive "
                             f"number, got {items_per_second!r}")
        gen = generator_fn if generator_fn is not None else _simple_event
        if not callable(gen):
            raise TypeError(f"TestSources.item_stream(): generator_fn must be a callable "
                            f"(timestamp_ms, sequence) -> item, got {type(gen).__qualname__}")
        return Source("item-stream",
                      ProcessorMetaSupplier.of(lambda: ItemStreamProcessor(items_per_second,
                                                                           gen), 1),
                      is_stream=True, timestamp_fn=native_pair_timestamp,
                      spark=NotOnSpark("an endless generated stream; a backfill reads bounded "
                                       "sources and Kafka up to until"))
