"""How items carry event time between stages, and how functions over items are adapted to it.

After ``with_timestamps`` (or ``with_native_timestamps``) items travel as
``Timestamped`` values, ``(timestamp, item)`` (engine/core/stream_items.py): the
timestamp is read once, by the stage that inserts watermarks, and every event-time stage
downstream reads it from the value. A stage that does not use event time (sinks included)
receives plain items: the planner puts :func:`unwrap` on the edge into it.

User functions only ever see items. A function written for items is adapted here to work on
timestamped values (as Jet's function adapters do): the function of a stateless stage sees the
item and its results keep the item's timestamp, a key function reads the item. The stateless
semantics themselves (``None`` from a map drops the item, and so on) are written once, in
``fusion.py``, and apply unchanged to the adapted function.

A source whose ``Source.timestamp_fn`` is :func:`native_pair_timestamp` emits plain
``(timestamp, item)`` pairs (for example ``TestSources.item_stream``);
``with_native_timestamps`` turns them into timestamped values, every other stage gets the items.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable, Sequence

from jetwake.engine.core.meta_supplier import (
    MetaSupplierContext, ProcessorMetaSupplier, ProcessorSupplier, SupplierContext,
)
from jetwake.engine.core.processor import Processor
from jetwake.engine.operations.window_result import KeyedWindowResult
from jetwake.engine.pipeline.connector import native_pair_timestamp
from jetwake.engine.processors.source_event_time import PartitionedSource

__all__ = ["native_pair_timestamp", "unwrap", "key_on_item", "adapt_to_timestamped",
           "window_join_flattener", "with_event_time_in_source"]

_second = itemgetter(1)


def unwrap(values: list[Any]) -> list[Any]:
    """Timestamped values (or a source's native pairs) -> their items."""
    return list(map(_second, values))


def key_on_item(key_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A key function over timestamped values that reads the item's key."""
    return lambda value: key_fn(value[1])


def _adapt_map(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def on_timestamped(value: Any) -> Any:
        y = fn(value[1])
        # None goes through as None: the map semantics drop it
        return None if y is None else (value[0], y)
    return on_timestamped


def _adapt_filter(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: fn(value[1])


def _adapt_flat_map(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def on_timestamped(value: Any) -> Any:
        ys = fn(value[1])
        if ys is None:
            return None  # the flat-map semantics read None as no items
        t = value[0]
        return [(t, y) for y in ys]
    return on_timestamped


_ADAPTERS = {"map": _adapt_map, "filter": _adapt_filter, "flat_map": _adapt_flat_map}


def adapt_to_timestamped(kind: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``fn``, the function of a stateless stage of ``kind`` ("map", "filter", "flat_map")
    written for items, adapted to timestamped values: it sees the item, and the values it
    produces carry the item's timestamp."""
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        raise ValueError(f"unknown stateless stage kind {kind!r}: expected one of "
                         f"{sorted(_ADAPTERS)}")
    return adapter(fn)


def window_join_flattener(join_fn: Callable[[Any, Any], Any]) -> Callable[[Any], list[Any]]:
    """Turns a co-grouped ``KeyedWindowResult(start, end, key, (lefts, rights))`` into one
    result per pair ``join_fn(left, right)``."""
    def flatten(r: Any) -> list[Any]:
        lefts, rights = r.result
        out = []
        for a in lefts:
            for b in rights:
                v = join_fn(a, b)
                if v is not None:
                    out.append(KeyedWindowResult(r.start, r.end, r.key, v))
        return out
    return flatten


def with_event_time_in_source(meta_supplier: Any, spec: Any, source_name: str) -> Any:
    """``meta_supplier`` of a partitioned source whose processors are given ``spec`` (an
    ``EventTimeSpec``) before they start: the timestamp stage after the source runs inside
    it, per partition (engine/processors/source_event_time.py)."""
    return _EventTimeMetaSupplier(meta_supplier, spec, source_name)


class _EventTimeMetaSupplier(ProcessorMetaSupplier):
    def __init__(self, inner: ProcessorMetaSupplier, spec: Any, source_name: str) -> None:
        self.inner = inner
        self.spec = spec
        self.source_name = source_name

    def preferred_local_parallelism(self) -> int:
        return self.inner.preferred_local_parallelism()

    def init(self, context: MetaSupplierContext) -> None:
        self.inner.init(context)

    def get(self, member_indices: Sequence[int]) -> Callable[[int], ProcessorSupplier]:
        of_member = self.inner.get(member_indices)
        spec, name = self.spec, self.source_name
        return lambda member_index: _EventTimeSupplier(of_member(member_index), spec, name)


class _EventTimeSupplier(ProcessorSupplier):
    def __init__(self, inner: ProcessorSupplier, spec: Any, source_name: str) -> None:
        self.inner = inner
        self.spec = spec
        self.source_name = source_name

    def init(self, context: SupplierContext) -> None:
        self.inner.init(context)

    def get(self, count: int) -> Sequence[Processor]:
        procs = self.inner.get(count)
        for p in procs:
            if not isinstance(p, PartitionedSource):
                raise TypeError(f"source {self.source_name!r} declares partitions, but its "
                                f"processor {type(p).__qualname__} does not implement "
                                "PartitionedSource (engine/processors/source_event_time.py)")
            p.event_time_spec = self.spec
        return procs

    def close(self, error: BaseException | None) -> None:
        self.inner.close(error)
