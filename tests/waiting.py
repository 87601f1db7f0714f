"""Waiting for a condition in tests, with a deadline instead of a sleep that guesses."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_until(condition: Callable[[], Any], what: str = "the condition",
               timeout: float = 30.0, interval: float = 0.01) -> Any:
    """Polls ``condition`` until it returns a true value, and returns that value; fails the
    test naming ``what`` when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(interval)
