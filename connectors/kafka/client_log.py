"""librdkafka's own log, through the member's logging, rate-limited.

Left alone, librdkafka writes its log to stderr in a format of its own; a member pointed at a
broker that is down writes about 20 lines a second that way, one per failed connection. Every
Kafka client jetwake creates passes its log to the logger ``jetwake.kafka.client`` instead
(:func:`with_client_log`), where a filter lets through the first few lines of each kind per
period and then one line saying how many were held back.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Callable

__all__ = ["CLIENT_LOGGER", "RateLimitFilter", "with_client_log"]

CLIENT_LOGGER = "jetwake.kafka.client"

_NUMBERS = re.compile(r"\d+")


class RateLimitFilter(logging.Filter):
    """Lets ``burst`` records of each kind through per ``period`` seconds; the first record of
    a kind after a period that held some back says how many.

    The kind of a record is its level and its text with the numbers taken out, so "connect to
    127.0.0.1:1 failed (after 0ms)" and "(after 3ms)" are the same kind.
    """

    def __init__(self, burst: int = 3, period: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        if burst < 1 or period <= 0:
            raise ValueError("RateLimitFilter needs burst >= 1 and period > 0")
        self.burst = burst
        self.period = period
        self._clock = clock
        self._kinds: dict[tuple[int, str], list] = {}  # kind -> [window start, passed, held]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.levelno, _NUMBERS.sub("#", record.getMessage()))
        now = self._clock()
        with self._lock:
            state = self._kinds.get(kind)
            if state is None or now - state[0] >= self.period:
                held = state[2] if state is not None else 0
                self._kinds[kind] = [now, 1, 0]
                if held:
                    record.msg = f"{record.getMessage()} ({held} more like it in the last " \
                                 f"{self.period:.0f} s not logged)"
                    record.args = None
                return True
            if state[1] < self.burst:
                state[1] += 1
                return True
            state[2] += 1
            return False


def _client_logger() -> logging.Logger:
    logger = logging.getLogger(CLIENT_LOGGER)
    if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
        logger.addFilter(RateLimitFilter())
    return logger


def with_client_log(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` with librdkafka's log going to the ``jetwake.kafka.client`` logger (unless the
    user set a ``logger`` of their own)."""
    if "logger" in conf:
        return conf
    return {**conf, "logger": _client_logger()}
