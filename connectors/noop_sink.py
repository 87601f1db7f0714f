"""A sink that discards every item: for benchmarks and for pipelines run for their effects."""

from __future__ import annotations

from typing import Any

from jetwake.engine.core.processor import Inbox, Processor
from jetwake.engine.backfill.connector_forms import SparkWriter

__all__ = ["NoopSinkProcessor", "NoopSparkWriter"]


class NoopSinkProcessor(Processor):
    def process(self, ordinal: int, inbox: Inbox) -> None:
        inbox.clear()


class NoopSparkWriter(SparkWriter):
    """``Sinks.noop`` on the Spark backfill: the items counted, nothing written."""

    def write(self, backfill: Any, t: Any, chunks: Any) -> int:
        return chunks.map(len).sum()
