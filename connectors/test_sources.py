"""Test sources (Jet's ``TestSources``): generated streams for demos, tests and benchmarks."""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

from ..engine.meta_supplier import ProcessorMetaSupplier
from ..engine.pipeline.connector import Source
from ..engine.pipeline.event_time import native_pair_timestamp
from ..engine.processor import BroadcastKey, Inbox, Processor, ProcessorContext

__all__ = ["TestSources", "SimpleEvent", "ItemStreamProcessor"]

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


class TestSources:
    """Generated sources."""

    __test__ = False  # not a pytest test class

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
                      is_stream=True, timestamp_fn=native_pair_timestamp)
