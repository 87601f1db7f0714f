"""A sink that logs every item: for demos and debugging."""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

from jetwake.engine.core.processor import Inbox, Processor
from jetwake.engine.backfill.connector_forms import SparkWriter

__all__ = ["LoggerSinkProcessor", "LoggerSparkWriter"]


class LoggerSinkProcessor(Processor):
    def __init__(self, to_string: Callable[[Any], str], level: int) -> None:
        self.to_string = to_string
        self.level = level
        self.log = logging.getLogger("jetwake.sink.logger")

    def process(self, ordinal: int, inbox: Inbox) -> None:
        for item in inbox.drain():
            self.log.log(self.level, "%s", self.to_string(item))


class LoggerSparkWriter(SparkWriter):
    """``Sinks.logger`` on the Spark backfill: each task logs its items in its worker."""

    def __init__(self, to_string: Callable[[Any], str], level: int) -> None:
        self.to_string, self.level = to_string, level

    def write(self, backfill: Any, t: Any, chunks: Any) -> int:
        to_string, level = self.to_string, self.level

        def log_all(it: Iterator) -> Iterator:
            logger = logging.getLogger("jetwake.sink.logger")
            n = 0
            for chunk in it:
                for x in chunk:
                    logger.log(level, to_string(x))
                n += len(chunk)
            yield n
        return chunks.mapPartitions(log_all).sum()
