"""The sink into a member's named list."""

from __future__ import annotations

from ..engine.processor import Inbox, Processor, ProcessorContext

__all__ = ["ListSinkProcessor"]


class ListSinkProcessor(Processor):
    def __init__(self, name: str) -> None:
        self.name = name
        self._list = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._list = context.member.get_list(self.name)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self._list.add_all(inbox.drain())  # type: ignore[union-attr]
