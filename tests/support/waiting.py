"""Waiting for a condition in tests, with a deadline instead of a sleep that guesses."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], *, timeout: float = 30.0,
               what: str | Callable[[], str] = "the condition", interval: float = 0.01) -> T:
    """Polls ``condition`` until it returns a true value, and returns that value; fails the
    test naming ``what`` when ``timeout`` seconds pass first.

    The one way a test waits: the deadline only bounds a wait for something that happens on
    its own (a job's status, a process's log line), so it is generous; it is never the thing a
    test measures. ``timeout``, ``what`` and ``interval`` are keywords, so that a call reads
    the same everywhere. ``what`` may be a function, called only on a timeout, for a message
    that says what was there instead (a process's log, the records read so far).
    """
    value = poll_until(condition, timeout=timeout, interval=interval)
    if not value:
        described = what() if callable(what) else what
        raise AssertionError(f"timed out after {timeout} s waiting for {described}")
    return value


def poll_until(condition: Callable[[], T], *, timeout: float, interval: float = 0.01) -> T:
    """Polls ``condition`` like ``wait_until``, but on a timeout returns its last (false) value
    instead of failing: for a script that a test runs as a process and that reports what it
    has when the wait runs out (the test then says what is missing), and for a clean-up that
    goes on anyway.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def stays_true(condition: Callable[[], object], *, seconds: float, what: str,
               interval: float = 0.05) -> None:
    """Polls ``condition`` for ``seconds`` and fails the test naming ``what`` the first time it
    is false: a check that something does not happen (a retry after a shutdown), which only a
    while of watching can show.

    Unlike ``wait_until``'s deadline, ``seconds`` is the measure of the check: long enough for
    what must not happen to have happened if it were going to.
    """
    deadline = time.monotonic() + seconds
    while True:
        assert condition(), f"{what} did not hold for {seconds} s"
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)
