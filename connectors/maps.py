"""Connectors of a member's named maps: the contents as a batch source, and idempotent sinks."""

from __future__ import annotations

from typing import Any, Callable

from ..engine.chunk_emitter import ChunkEmitter
from ..engine.processor import Inbox, Processor, ProcessorContext

__all__ = ["MapSourceProcessor", "MapSinkProcessor"]


class MapSourceProcessor(Processor):
    """Emits (key, value) for the entries in the partitions this processor owns."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._emitter: ChunkEmitter | None = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        kv_map = context.member.get_map(self.name)
        self._emitter = ChunkEmitter(kv_map.entries(list(context.owned_partitions)))

    def complete(self) -> bool:
        return self._emitter.emit(self.outbox)  # type: ignore[union-attr]


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
