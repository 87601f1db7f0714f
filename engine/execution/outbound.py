"""One output ordinal of a processor: routes chunks to the queues of downstream processors.

Routing works on whole chunks: unicast hands a chunk to one queue with room, partitioned splits
a chunk by the owner of each item's key partition (the keys, their partitions and owners each in
one C-level pass over the chunk, the items of each owner picked out with ``compress``),
broadcast copies the chunk reference to every queue. Control items (watermarks, barriers, DONE)
go to every queue. What a full queue refuses stays pending here and is retried before anything
new is taken from the outbox.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import eq
from typing import Any, Callable, Protocol, Sequence

from jetwake.engine.core.dag import RoutingPolicy
from jetwake.engine.core.partitioning import partitions_of

__all__ = ["OutboundEdgeStream", "QueueEnd"]


class QueueEnd(Protocol):
    """Where an edge puts its entries: a local :class:`ChunkQueue`, or the sending end of an
    edge to another member."""

    def offer(self, entry: Any) -> bool:
        """Adds a chunk (list) or a control item; False when there is no room now."""


_COMPRESS_MAX_TARGETS = 4
"""Up to this many owners in a chunk, a pass over the chunk per owner beats a Python loop
that appends each item to its owner's list."""


class OutboundEdgeStream:
    __slots__ = ("ordinal", "targets", "routing", "key_fn", "table", "_pending", "_rr",
                 "_single", "transform")

    def __init__(self, ordinal: int, targets: Sequence[QueueEnd], routing: RoutingPolicy,
                 key_fn: Callable[[Any], Any] | None = None,
                 partition_table: Sequence[int] | None = None,
                 transform: Callable[[list[Any]], list[Any]] | None = None) -> None:
        """``partition_table`` maps a partition to an index into ``targets``; ``transform`` is
        the edge's fused stateless stages, applied to each chunk before routing."""
        self.ordinal = ordinal
        self.targets = list(targets)
        self.routing = routing
        self.key_fn = key_fn
        # empty but for the routings that need it (partitioned, all-to-one)
        self.table: Sequence[int] = () if partition_table is None else partition_table
        self._pending: list[tuple[QueueEnd, Any]] = []
        self._rr = 0
        self._single = len(self.targets) == 1
        self.transform = transform

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def flush_pending(self) -> bool:
        """Retries what queues refused; True when nothing is pending."""
        if self._pending:
            self._pending = [(q, e) for q, e in self._pending if not q.offer(e)]
        return not self._pending

    def send(self, entry: Any) -> bool:
        """Routes one chunk or control item; True when every target queue accepted it."""
        if type(entry) is not list:
            return self._to_all(entry)
        if self.transform is not None:
            entry = self.transform(entry)
            if not entry:
                return True
        if self._single:
            q = self.targets[0]
            if not q.offer(entry):
                self._pending.append((q, entry))
                return False
            return True
        routing = self.routing
        if routing is RoutingPolicy.UNICAST or routing is RoutingPolicy.ISOLATED:
            return self._unicast(entry)
        if routing is RoutingPolicy.PARTITIONED:
            return self._partitioned(entry)
        if routing is RoutingPolicy.BROADCAST:
            return self._to_all(entry)
        # ALL_TO_ONE: the table has one entry, the chosen target
        q = self.targets[self.table[0]]
        if not q.offer(entry):
            self._pending.append((q, entry))
            return False
        return True

    def _unicast(self, chunk: list[Any]) -> bool:
        targets = self.targets
        n = len(targets)
        start = self._rr
        for k in range(n):
            q = targets[(start + k) % n]
            if q.offer(chunk):
                self._rr = (start + k + 1) % n
                return True
        self._pending.append((targets[start], chunk))
        self._rr = (start + 1) % n
        return False

    def _partitioned(self, chunk: list[Any]) -> bool:
        key_fn = self.key_fn
        assert key_fn is not None, "a partitioned edge has a key function"
        owners = list(map(self.table.__getitem__, partitions_of(list(map(key_fn, chunk)))))
        present = set(owners)
        parts: list[tuple[int, list[Any]]]
        if len(present) == 1:
            parts = [(owners[0], chunk)]
        elif len(present) <= _COMPRESS_MAX_TARGETS:
            # one C-level pass per owner, each keeping the chunk's order
            parts = [(t, list(compress(chunk, map(eq, owners, repeat(t)))))
                     for t in sorted(present)]
        else:
            buckets: dict[int, list[Any]] = {}
            for t, item in zip(owners, chunk):
                bucket = buckets.get(t)
                if bucket is None:
                    buckets[t] = [item]
                else:
                    bucket.append(item)
            parts = list(buckets.items())
        ok = True
        targets = self.targets
        for t, items in parts:
            q = targets[t]
            if not q.offer(items):
                self._pending.append((q, items))
                ok = False
        return ok

    def _to_all(self, entry: Any) -> bool:
        ok = True
        for q in self.targets:
            if not q.offer(entry):
                self._pending.append((q, entry))
                ok = False
        return ok
