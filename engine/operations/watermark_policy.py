"""Watermark policies: how a stage with timestamps decides how far event time has advanced.

A policy sees the timestamps of the events (``report_event``) and answers the current
watermark (``current``): the time below which no more events are expected.

- :meth:`WatermarkPolicy.limiting_lag` (the default): the highest timestamp seen minus the
  allowed lag, so events may arrive up to ``lag`` behind the newest one.
- :meth:`WatermarkPolicy.limiting_real_time_lag`: the wall clock (ms since the epoch) minus
  the lag, for sources whose timestamps follow the wall clock; the watermark advances even
  when no events arrive.

:func:`throttle` rounds a watermark down to a multiple of a step: the stage that inserts
watermarks emits one only when the rounded value advances, and the planner makes the step the
frame size of the windows downstream, so a watermark is sent once per frame, not per event.
"""

from __future__ import annotations

import time
from typing import Callable

from jetwake.engine.core.stream_items import NO_WATERMARK

__all__ = ["WatermarkPolicy", "NO_WATERMARK", "throttle"]


def throttle(wm: int, step: int) -> int:
    """``wm`` rounded down to a multiple of ``step`` (``step`` 1 leaves it unchanged)."""
    if wm == NO_WATERMARK or step <= 1:
        return wm
    return wm - wm % step


class WatermarkPolicy:
    """A policy instance; one per processor, made by a factory from the static methods."""

    #: whether ``current`` changes with wall-clock time alone
    is_real_time = False

    def report_event(self, timestamp: int) -> None:
        raise NotImplementedError

    def report_max(self, timestamp: int) -> None:
        """Reports the highest timestamp of a batch (the same as reporting each)."""
        self.report_event(timestamp)

    def current(self) -> int:
        raise NotImplementedError

    @property
    def lag(self) -> int:
        raise NotImplementedError

    @staticmethod
    def limiting_lag(lag: int) -> "Callable[[], WatermarkPolicy]":
        """Watermark = highest timestamp seen - ``lag``."""
        _check_lag(lag)
        return _Factory("limiting_lag", lag, lambda: _LimitingLag(lag))

    @staticmethod
    def limiting_real_time_lag(lag: int) -> "Callable[[], WatermarkPolicy]":
        """Watermark = now (wall clock, ms) - ``lag``, whatever the events say."""
        _check_lag(lag)
        return _Factory("limiting_real_time_lag", lag, lambda: _LimitingRealTimeLag(lag))


def _check_lag(lag: int) -> None:
    if isinstance(lag, bool) or not isinstance(lag, int):
        raise TypeError(f"allowed lag must be an int (milliseconds), got "
                        f"{type(lag).__qualname__}: {lag!r}")
    if lag < 0:
        raise ValueError(f"allowed lag must not be negative, got {lag}")


class _Factory:
    """Callable making policy instances; carries the name and lag for messages and plans."""

    def __init__(self, name: str, lag: int, make: Callable[[], WatermarkPolicy]) -> None:
        self.name = name
        self.lag = lag
        self._make = make

    def __call__(self) -> WatermarkPolicy:
        return self._make()

    def __repr__(self) -> str:
        return f"WatermarkPolicy.{self.name}({self.lag})"


class _LimitingLag(WatermarkPolicy):
    __slots__ = ("_lag", "_top")

    def __init__(self, lag: int) -> None:
        self._lag = lag
        self._top = NO_WATERMARK

    @property
    def lag(self) -> int:
        return self._lag

    def report_event(self, timestamp: int) -> None:
        if timestamp > self._top:
            self._top = timestamp

    def current(self) -> int:
        top = self._top
        return NO_WATERMARK if top == NO_WATERMARK else top - self._lag


class _LimitingRealTimeLag(WatermarkPolicy):
    __slots__ = ("_lag",)
    is_real_time = True

    def __init__(self, lag: int) -> None:
        self._lag = lag

    @property
    def lag(self) -> int:
        return self._lag

    def report_event(self, timestamp: int) -> None:
        pass

    def current(self) -> int:
        return time.time_ns() // 1_000_000 - self._lag
