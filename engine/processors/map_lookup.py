"""``Stage.map_using_map``: each item enriched with the value of its key in a named map.

The map is a member's map or, in a cluster, the cluster's map (``context.member.get_map``).
Each inbox chunk is looked up with one ``get_all`` (:class:`MapLookup`): a cluster's map then
asks Kafka for its topic's end once per chunk, not once per item. A cluster's map may wait for
the network, so the processor then runs on a thread of its own (non-cooperative).
"""

from __future__ import annotations

from typing import Any, Callable

from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.core.processor import Inbox, Processor, ProcessorContext

__all__ = ["MapLookupProcessor", "MapLookup"]


class MapLookup:
    """``fn(item, value_or_None)`` for each item, the value of ``key_fn(item)`` read by
    ``get_all`` (keys -> dict of those present) once per chunk; a None result drops the item.
    The member's processor and the Spark backfill both look up with this."""

    def __init__(self, key_fn: Callable[[Any], Any], fn: Callable[[Any, Any], Any]) -> None:
        self.key_fn = key_fn
        self.fn = fn

    def apply(self, items: list[Any], get_all: Callable[[list[Any]], dict[Any, Any]]
              ) -> tuple[list[Any], int]:
        """``(results, misses)`` for ``items``."""
        keys = list(map(self.key_fn, items))
        found = get_all(keys)
        fn = self.fn
        out = []
        misses = 0
        for item, k in zip(items, keys):
            value = found.get(k)
            if value is None:
                misses += 1
            r = fn(item, value)
            if r is not None:
                out.append(r)
        return out, misses


class MapLookupProcessor(Processor):
    """See the module docstring."""

    def __init__(self, stage_name: str, map_name: str, key_fn: Callable[[Any], Any],
                 fn: Callable[[Any, Any], Any]) -> None:
        self.stage_name = stage_name
        self.map_name = map_name
        self.lookup = MapLookup(key_fn, fn)
        self.map: Any = None
        self._cooperative = True

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        if context.member is None:
            raise JetwakeError(
                f"stage {self.stage_name!r}: map_using_map({self.map_name!r}) needs a member "
                "to read the map from; run the job on a Member")
        self.map = context.member.get_map(self.map_name)
        self._cooperative = not getattr(self.map, "remote_reads", False)
        context.metrics.setdefault("map_lookups", 0)
        context.metrics.setdefault("map_misses", 0)

    def is_cooperative(self) -> bool:
        return self._cooperative

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self.outbox.has_room():
            return
        items = inbox.drain()
        out, misses = self.lookup.apply(items, self.map.get_all)
        m = self.context.metrics
        m["map_lookups"] += len(items)
        m["map_misses"] += misses
        self.outbox.offer_chunk(-1, out)
