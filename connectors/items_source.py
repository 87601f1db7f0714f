"""A source over the items of an in-memory collection, given when the pipeline is built."""

from __future__ import annotations

from typing import Any, Sequence

from jetwake.engine.core.chunk_emitter import CHUNK_SIZE
from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext
from jetwake.engine.backfill.connector_forms import SparkReader
from jetwake.engine.backfill.stage_output import StageOut

__all__ = ["ItemsSourceProcessor", "ItemsSparkReader"]


class ItemsSourceProcessor(Processor):
    """Emits its share of ``items`` in chunks; its position is saved in snapshots.

    With several processors (across members), processor ``i`` of ``n`` emits the ``i``-th of
    ``n`` contiguous slices, so one member's processor emits everything in order.
    """

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = items
        self.pos = 0
        self.end = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        n = context.total_parallelism
        i = context.global_processor_index
        size = len(self.items)
        self.pos = size * i // n
        self.end = size * (i + 1) // n

    def complete(self) -> bool:
        outbox = self.outbox
        items = self.items
        while self.pos < self.end and outbox.has_room():
            nxt = min(self.pos + CHUNK_SIZE, self.end)
            outbox.offer_chunk(-1, list(items[self.pos:nxt]))
            self.pos = nxt
        return self.pos >= self.end

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(
            BroadcastKey(("items", self.context.global_processor_index)), self.pos)

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        mine = ("items", self.context.global_processor_index)
        for key, pos in inbox.drain():
            if key.key == mine:
                self.pos = pos


class ItemsSparkReader(SparkReader):
    """``Sources.items`` on the Spark backfill: the items, sliced over the tasks in order."""

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = items

    def read(self, backfill: Any, t: Any, bounds: Any) -> StageOut:
        return backfill.local_items(list(self.items))
