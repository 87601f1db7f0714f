"""Waiting for a condition in tests, with a deadline instead of a sleep that guesses."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], *, timeout: float = 30.0,
               what: str = "the condition", interval: float = 0.01) -> T:
    """Polls ``condition`` until it returns a true value, and returns that value; fails the
    test naming ``what`` when ``timeout`` seconds pass first.

    The one way a test waits: the deadline only bounds a wait for something that happens on
    its own (a job's status, a process's log line), so it is generous; it is never the thing a
    test measures. ``timeout``, ``what`` and ``interval`` are keywords, so that a call reads
    the same everywhere.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
