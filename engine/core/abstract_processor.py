"""AbstractProcessor: per-item convenience on top of the chunked contract, as in Jet.

Write ``try_process_item(ordinal, item) -> bool`` and emit with ``try_emit``; when the outbox
is full return False and the same item is offered again. ``emit_from_traverser`` and
:class:`FlatMapper` carry the emit-or-suspend pattern for outputs of several items.
Processors on hot paths should override ``process`` and work on whole chunks instead.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from jetwake.engine.core.processor import Inbox, Processor
from jetwake.engine.core.traverser import Traverser

__all__ = ["AbstractProcessor", "FlatMapper"]


class AbstractProcessor(Processor):
    """A processor that handles one item at a time and emits cooperatively."""

    def process(self, ordinal: int, inbox: Inbox) -> None:
        handler = self.try_process_item
        while inbox:
            if not handler(ordinal, inbox.peek()):
                return
            inbox.poll()

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        """Handles one item; False to be offered the same item again later."""
        raise NotImplementedError(
            f"{type(self).__qualname__} must implement try_process_item(ordinal, item)")

    def try_emit(self, item: Any, ordinal: int = -1) -> bool:
        return self.outbox.offer(ordinal, item)

    def emit_from_traverser(self, traverser: Traverser, ordinal: int = -1) -> bool:
        """Emits items until the traverser ends (True) or the outbox is full (False).

        An item refused by the outbox is kept and emitted first on the next call.
        """
        offer = self.outbox.offer
        if traverser.pending is not None:
            if not offer(ordinal, traverser.pending):
                return False
            traverser.pending = None
        while (item := traverser.next()) is not None:
            if not offer(ordinal, item):
                traverser.pending = item
                return False
        return True

    def flat_mapper(self, fn: Callable[[Any], Iterable[Any]], ordinal: int = -1) -> "FlatMapper":
        return FlatMapper(self, fn, ordinal)


class FlatMapper:
    """Maps an item to many and emits them cooperatively (Jet's ``FlatMapper``).

    ``try_process(item)`` returns True once every output of ``item`` has been emitted.
    """

    __slots__ = ("_proc", "_fn", "_ordinal", "_current")

    def __init__(self, processor: AbstractProcessor, fn: Callable[[Any], Iterable[Any]],
                 ordinal: int = -1) -> None:
        self._proc = processor
        self._fn = fn
        self._ordinal = ordinal
        self._current: Traverser | None = None

    def try_process(self, item: Any) -> bool:
        if self._current is None:
            result = self._fn(item)
            self._current = result if isinstance(result, Traverser) else Traverser.over(result)
        if self._proc.emit_from_traverser(self._current, self._ordinal):
            self._current = None
            return True
        return False
