"""The partitioned test source (``TestSources.partitioned``): in-memory partitions read as a
Kafka topic's are, so event time per partition can be tried without a broker.

Partition ``p`` belongs to the processor Kafka's source would give it
(``owner_of_partition``); a processor reads each of its partitions in order, and interleaves
them as ``order`` says: ``"round_robin"`` (up to ``batch`` items of each in turn),
``"sequential"`` (one partition to its end, then the next: the worst backlog, where one
partition is read far ahead of the others) or ``"random"`` (a seeded random partition and a
random run length each time). A partition read to its end stops holding the watermark back,
as a processor that has finished stops counting downstream. Each partition's position and
highest timestamp are saved in
snapshots under a broadcast key, so a restored job resumes every partition where it was, on
whichever processor owns it now.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from jetwake.engine.core.partitioning import owner_of_partition
from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext
from jetwake.engine.processors.source_event_time import PartitionedSource, SourceEventTime

__all__ = ["PartitionedItemsSourceProcessor", "READ_ORDERS"]

READ_ORDERS = ("round_robin", "sequential", "random")
_KEY = "partitioned-items"


class PartitionedItemsSourceProcessor(Processor, PartitionedSource):
    """Reads its share of the partitions (see the module docstring)."""

    def __init__(self, partitions: Sequence[Sequence[Any]], batch: int, order: str,
                 seed: int) -> None:
        self.partitions = partitions
        self.batch = batch
        self.order = order
        self.seed = seed
        self.pos: dict[int, int] = {}
        self.et: SourceEventTime | None = None
        self._turn = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        index, total = context.global_processor_index, context.total_parallelism
        mine = [p for p in range(len(self.partitions))
                if owner_of_partition(0, p, 1, total) == index]
        self.pos = {p: 0 for p in mine}
        # an empty partition is finished from the start: it holds nothing back
        self.et = self.make_event_time(context.metrics,
                                       [(p, None) for p in mine if self.partitions[p]])
        self._random = random.Random(self.seed * 7919 + index)
        context.metrics.setdefault("records_in", 0)

    def _next_run(self) -> tuple[int, int] | None:
        """The partition to read next and how many of its items."""
        open_ = [p for p, i in self.pos.items() if i < len(self.partitions[p])]
        if not open_:
            return None
        if self.order == "sequential":
            return open_[0], self.batch
        if self.order == "random":
            return self._random.choice(open_), self._random.randint(1, self.batch)
        self._turn += 1
        return open_[self._turn % len(open_)], self.batch

    def complete(self) -> bool:
        outbox, et = self.outbox, self.et
        if et is not None and not et.flush(outbox):
            return False
        while outbox.has_room():
            run = self._next_run()
            if run is None:  # done: the end of the stream says the rest
                return et is None or et.flush(outbox)
            p, n = run
            start = self.pos[p]
            items = list(self.partitions[p][start:start + n])
            self.pos[p] = start + len(items)
            self.context.metrics["records_in"] += len(items)
            if et is None:
                outbox.offer_chunk(-1, items)
                continue
            et.add_items(p, items)
            if self.pos[p] >= len(self.partitions[p]):
                # a finished partition holds nothing back, as a finished processor's input
                # no longer counts downstream: where it was read does not matter
                et.remove_partition(p)
                if et.partitions:  # the others may now move the watermark on
                    et.poll()
            if not et.flush(outbox):
                return False
        return False

    def save_to_snapshot(self) -> bool:
        if self.et is not None and not self.et.flush(self.outbox):
            return False  # items read before the barrier leave before it
        tops = self.et.tops() if self.et is not None else {}
        return self.outbox.offer_all_to_snapshot(
            [(BroadcastKey((_KEY, p)), [i, tops.get(p)]) for p, i in self.pos.items()])

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        # every processor sees every partition's entry: each keeps those it owns now
        for key, (i, top) in inbox.drain():
            if type(key) is BroadcastKey and type(key.key) is tuple and key.key[0] == _KEY \
                    and key.key[1] in self.pos:
                p = key.key[1]
                self.pos[p] = i
                if self.et is None:
                    continue
                if i >= len(self.partitions[p]):
                    self.et.remove_partition(p)
                elif top is not None:
                    self.et.add_partition(p, top)
