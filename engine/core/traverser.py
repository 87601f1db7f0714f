"""Traverser: a pull-style sequence whose ``next()`` returns None at the end (as in Jet)."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

__all__ = ["Traverser"]


class Traverser:
    """Wraps an iterator; ``next()`` returns the next item or None when exhausted.

    Items must not be None: None is the end marker, as in Jet.
    """

    __slots__ = ("_it", "pending")

    def __init__(self, it: Iterator[Any]) -> None:
        self._it = it
        # an item taken but refused by a full outbox, emitted first next time
        self.pending: Any = None

    @classmethod
    def over(cls, iterable: Iterable[Any]) -> "Traverser":
        return cls(iter(iterable))

    @classmethod
    def empty(cls) -> "Traverser":
        return cls(iter(()))

    @classmethod
    def singleton(cls, item: Any) -> "Traverser":
        return cls(iter(() if item is None else (item,)))

    def next(self) -> Any:
        return next(self._it, None)

    def map(self, fn: Callable[[Any], Any]) -> "Traverser":
        return Traverser(x for x in (fn(i) for i in self._it) if x is not None)

    def filter(self, fn: Callable[[Any], bool]) -> "Traverser":
        return Traverser(x for x in self._it if fn(x))

    def flat_map(self, fn: Callable[[Any], "Traverser | Iterable[Any]"]) -> "Traverser":
        def gen() -> Iterator[Any]:
            for item in self._it:
                inner = fn(item)
                if isinstance(inner, Traverser):
                    while (x := inner.next()) is not None:
                        yield x
                else:
                    yield from inner
        return Traverser(gen())

    def append(self, item: Any) -> "Traverser":
        def gen() -> Iterator[Any]:
            yield from self._it
            yield item
        return Traverser(gen())

    def __iter__(self) -> Iterator[Any]:
        return self._it
