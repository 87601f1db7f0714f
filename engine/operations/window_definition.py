"""Window definitions: tumbling, sliding and session windows over event time.

Timestamps are integers (milliseconds by convention) and window sizes use the same unit. A
sliding window of ``size`` advances by ``slide``; the time axis is cut into *frames* of length
``slide`` aligned to 0, and each window is the union of ``size // slide`` consecutive frames, so
``size`` must be a multiple of ``slide``. A tumbling window is a sliding window with one frame.
A session window groups the events of a key that are less than ``gap`` apart.
"""

from __future__ import annotations

from typing import Any, Iterable

from jetwake.engine.core.errors import PipelineError

__all__ = ["WindowDefinition", "items_by_frame"]


def items_by_frame(pairs: Iterable[tuple[int, Any]], slide: int) -> dict[int, list[Any]]:
    """The items of ``(time, item)`` pairs by the start of their frame (frames of ``slide``,
    aligned to 0), each frame's in arrival order: a window stage accumulates a frame's items
    in one call rather than an item at a time."""
    by_frame: dict[int, list[Any]] = {}
    for t, x in pairs:
        f = t - t % slide
        bucket = by_frame.get(f)
        if bucket is None:
            by_frame[f] = [x]
        else:
            bucket.append(x)
    return by_frame


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int (milliseconds, the unit of the timestamps), "
                        f"got {type(value).__qualname__}: {value!r}")
    if value <= 0:
        raise PipelineError(f"{what} must be positive, got {value}")
    return value


class WindowDefinition:
    """Build with :meth:`tumbling`, :meth:`sliding` or :meth:`session`."""

    __slots__ = ("kind", "size", "slide", "gap", "early_results_period")

    def __init__(self, kind: str, size: int = 0, slide: int = 0, gap: int = 0,
                 early_results_period: int = 0) -> None:
        self.kind = kind
        self.size = size
        self.slide = slide
        self.gap = gap
        self.early_results_period = 0
        if early_results_period:
            self.set_early_results_period(early_results_period)

    # --- factories ---------------------------------------------------------------------------

    @staticmethod
    def tumbling(size: int, *, early_results_period: int = 0) -> "WindowDefinition":
        """Adjacent windows of ``size``: [0, size), [size, 2 size), ..."""
        _positive_int(size, "tumbling window size")
        return WindowDefinition("sliding", size, size, 0, early_results_period)

    @staticmethod
    def sliding(size: int, slide: int, *, early_results_period: int = 0) -> "WindowDefinition":
        """Windows of ``size`` starting every ``slide``; ``size`` a multiple of ``slide``."""
        _positive_int(size, "sliding window size")
        _positive_int(slide, "sliding window slide")
        if size % slide:
            raise PipelineError(
                f"sliding window size {size} is not a multiple of its slide {slide}: a window "
                f"is made of whole frames of one slide each; use for example size "
                f"{size - size % slide or slide} or {size + slide - size % slide}")
        return WindowDefinition("sliding", size, slide, 0, early_results_period)

    @staticmethod
    def session(gap: int, *, early_results_period: int = 0) -> "WindowDefinition":
        """Bursts of events of a key: a session closes after ``gap`` without events."""
        _positive_int(gap, "session window gap")
        return WindowDefinition("session", 0, 0, gap, early_results_period)

    # --- options -----------------------------------------------------------------------------

    def set_early_results_period(self, period: int) -> "WindowDefinition":
        """Also emit the partial results of windows still open every ``period`` ms of wall-clock
        time (results with ``is_early`` true); 0 turns early results off."""
        if period != 0:
            _positive_int(period, "early_results_period")
        self.early_results_period = period
        return self

    # --- properties --------------------------------------------------------------------------

    @property
    def is_session(self) -> bool:
        return self.kind == "session"

    @property
    def is_tumbling(self) -> bool:
        return self.kind == "sliding" and self.size == self.slide

    @property
    def frame_size(self) -> int:
        """The length of a frame (the slide); 0 for session windows."""
        return self.slide

    def floor_frame(self, ts: int) -> int:
        """The start of the frame holding ``ts``."""
        return ts - ts % self.slide

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WindowDefinition) and (
            self.kind, self.size, self.slide, self.gap, self.early_results_period) == (
            other.kind, other.size, other.slide, other.gap, other.early_results_period)

    def __hash__(self) -> int:
        return hash((self.kind, self.size, self.slide, self.gap))

    def __repr__(self) -> str:
        early = (f", early_results_period={self.early_results_period}"
                 if self.early_results_period else "")
        if self.is_session:
            return f"WindowDefinition.session({self.gap}{early})"
        if self.is_tumbling:
            return f"WindowDefinition.tumbling({self.size}{early})"
        return f"WindowDefinition.sliding({self.size}, {self.slide}{early})"
