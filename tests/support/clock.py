"""A clock a test moves by hand, for code that reads the wall clock or the monotonic clock
(real-time watermarks, idle timeouts): the test states how much time passes instead of
sleeping and hoping that enough, and not too much, did.

It stands in for the ``time`` module of the module under test::

    clock = ControlledClock()
    monkeypatch.setattr(insert_watermarks, "time", clock)
    clock.advance(ms=30)
"""

from __future__ import annotations


class ControlledClock:
    """``time()``, ``time_ns()`` and ``monotonic()`` of one instant, which moves only by
    :meth:`advance`. Kept in whole nanoseconds, so that milliseconds add up exactly."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._ns = start_ms * 1_000_000

    def advance(self, *, ms: int) -> None:
        """Moves the clock ``ms`` milliseconds on."""
        self._ns += ms * 1_000_000

    @property
    def ms(self) -> int:
        """The instant in whole milliseconds since the epoch."""
        return self._ns // 1_000_000

    def time(self) -> float:
        return self._ns / 1e9

    def time_ns(self) -> int:
        return self._ns

    def monotonic(self) -> float:
        return self._ns / 1e9
