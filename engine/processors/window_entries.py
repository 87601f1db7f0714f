"""The snapshot entries of the window processors, one codec for the processors (which save and
restore them) and for the Spark backfill's hand-off (which writes them for a streaming job to
restore): a window stage's watermark, broadcast to every processor of its vertex, and per key
what the processor holds of its open windows."""

from __future__ import annotations

from typing import Any, Iterable

from jetwake.engine.core.processor import BroadcastKey

__all__ = ["WindowEntries"]


class WindowEntries:
    """``(key, value)`` snapshot entries of the window processors, by processor:

    every one: :meth:`watermark` (the lowest is restored);
    ``FrameAccumulateProcessor``: :meth:`frame_partial` ``(frame, input index, acc)``;
    ``WindowCombineProcessor``: :meth:`frame` ``(frame, acc)`` and :meth:`next_end`;
    ``SlidingWindowProcessor``: :meth:`window` ``(window end, acc)``;
    ``SessionWindowProcessor``: :meth:`sessions` ``[[start, end, acc], ...]``.
    """

    WATERMARK = "window-watermark"
    NEXT_END = "window-next-end"

    @staticmethod
    def watermark(wm: int) -> tuple[BroadcastKey, int]:
        return BroadcastKey(WindowEntries.WATERMARK), wm

    @staticmethod
    def next_end(end: int) -> tuple[BroadcastKey, int]:
        """The end of the next window the combining processor emits."""
        return BroadcastKey(WindowEntries.NEXT_END), end

    @staticmethod
    def frame_partial(key: Any, frame: int, input_index: int, acc: Any) -> tuple[Any, tuple]:
        """A key's accumulator of one frame and input, not yet sent to be combined."""
        return key, (frame, input_index, acc)

    @staticmethod
    def frame(key: Any, frame: int, acc: Any) -> tuple[Any, tuple]:
        """A key's combined accumulator of one frame."""
        return key, (frame, acc)

    @staticmethod
    def window(key: Any, end: int, acc: Any) -> tuple[Any, tuple]:
        """A key's accumulator of the window ending at ``end`` (operations without combine)."""
        return key, (end, acc)

    @staticmethod
    def sessions(key: Any, sessions: Iterable[list]) -> tuple[Any, list]:
        """A key's open sessions, each ``[start, end, acc]``."""
        return key, [list(s) for s in sessions]

    @staticmethod
    def read_sessions(value: list) -> list[list]:
        """A key's sessions as the processor keeps them: sorted by start."""
        return sorted((list(s) for s in value), key=lambda s: s[0])
