"""What the engine can tell about a user's function without calling it."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["identity", "is_identity"]

_IDENTITY_CODE = (lambda x: x).__code__.co_code


def identity(x: Any) -> Any:
    """The item itself: the default key, export or flat-map step where none is given."""
    return x


def is_identity(fn: Callable[[Any], Any]) -> bool:
    """Whether ``fn`` is a plain ``lambda x: x`` (by its bytecode), so that a stage keyed by
    it can use the items themselves as keys without a Python call per item."""
    code = getattr(fn, "__code__", None)
    return (code is not None and code.co_code == _IDENTITY_CODE and code.co_argcount == 1
            and not getattr(fn, "__defaults__", None) and not getattr(fn, "__closure__", None))
