"""A sink that discards every item: for benchmarks and for pipelines run for their effects."""

from __future__ import annotations

from jetwake.engine.core.processor import Inbox, Processor

__all__ = ["NoopSinkProcessor"]


class NoopSinkProcessor(Processor):
    def process(self, ordinal: int, inbox: Inbox) -> None:
        inbox.clear()
