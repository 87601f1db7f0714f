"""The items a window stage emits: :class:`WindowResult` and :class:`KeyedWindowResult`.

Both are tuples (``start, end, [key,] result``) with named fields, so they compare, sort and
unpack like tuples; ``is_early`` is true for a partial result emitted before the window closed
(see ``WindowDefinition.set_early_results_period``). ``end`` is exclusive: a window holds the
events with ``start <= timestamp < end``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Self

from jetwake.engine.core import serialization

__all__ = ["WindowResult", "KeyedWindowResult"]


class _WindowResultFields(NamedTuple):
    start: int
    end: int
    result: Any


class _KeyedWindowResultFields(NamedTuple):
    start: int
    end: int
    key: Any
    result: Any


class WindowResult(_WindowResultFields):
    """The result of a keyless window: ``(start, end, result)``."""

    is_early = False

    def __new__(cls, start: int, end: int, result: Any, is_early: bool = False) -> Self:
        self = tuple.__new__(cls, (start, end, result))
        if is_early:
            self.is_early = True
        return self


class KeyedWindowResult(_KeyedWindowResultFields):
    """The result of one key's window: ``(start, end, key, result)``."""

    is_early = False

    def __new__(cls, start: int, end: int, key: Any, result: Any,
                is_early: bool = False) -> Self:
        self = tuple.__new__(cls, (start, end, key, result))
        if is_early:
            self.is_early = True
        return self


serialization.register_type(
    serialization.WINDOW_RESULT_TYPE_ID, WindowResult,
    lambda r: [r.start, r.end, r.result, r.is_early],
    lambda v: WindowResult(v[0], v[1], v[2], v[3]))
serialization.register_type(
    serialization.KEYED_WINDOW_RESULT_TYPE_ID, KeyedWindowResult,
    lambda r: [r.start, r.end, r.key, r.result, r.is_early],
    lambda v: KeyedWindowResult(v[0], v[1], v[2], v[3], v[4]))
