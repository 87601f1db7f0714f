"""A sink that logs every item: for demos and debugging."""

from __future__ import annotations

import logging
from typing import Any, Callable

from jetwake.engine.core.processor import Inbox, Processor

__all__ = ["LoggerSinkProcessor"]


class LoggerSinkProcessor(Processor):
    def __init__(self, to_string: Callable[[Any], str], level: int) -> None:
        self.to_string = to_string
        self.level = level
        self.log = logging.getLogger("jetwake.sink.logger")

    def process(self, ordinal: int, inbox: Inbox) -> None:
        for item in inbox.drain():
            self.log.log(self.level, "%s", self.to_string(item))
