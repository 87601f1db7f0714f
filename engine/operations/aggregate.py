"""Aggregate operations: the accumulator algebra behind aggregate, windows and rolling stages.

An :class:`AggregateOperation` has six primitives (Jet's AggregateOperation1):
``create() -> acc``, ``accumulate(acc, item) -> acc``, ``combine(acc, other) -> acc``,
``deduct(acc, other) -> acc``, ``export(acc) -> result`` (acc stays usable) and
``finish(acc) -> result`` (the last use). ``accumulate``, ``combine`` and ``deduct`` return the
new accumulator and may mutate and return the one given. Without ``combine`` an aggregation runs
in a single stage; without ``deduct`` sliding windows recombine every frame.

Accumulators are saved in snapshots, so they must be msgpack-able (numbers, strings, lists,
tuples, dicts, sets) or registered with :func:`jetwake.register_type`.
"""

from __future__ import annotations

import copy

from collections import _count_elements  # type: ignore[attr-defined]  # C-accelerated
from typing import Any, Callable, Iterable

from jetwake.engine.core.functions import identity

__all__ = ["AggregateOperation", "AggregateOperations"]

_MISSING = object()


def _require_callable(fn: Any, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} must be a callable, got {type(fn).__qualname__}: {fn!r}")


# accumulators of these types cannot change in place, so a result may be the accumulator itself
_IMMUTABLE_ACCS = frozenset((int, float, complex, bool, str, bytes, tuple, frozenset,
                             type(None)))


class AggregateOperation:
    """A custom aggregation, from its primitives (see the module docstring)."""

    #: what ``repr`` calls the operation; each built-in one names itself
    label = "custom"

    def __init__(self, create: Callable[[], Any], accumulate: Callable[[Any, Any], Any],
                 combine: Callable[[Any, Any], Any] | None = None,
                 deduct: Callable[[Any, Any], Any] | None = None,
                 export: Callable[[Any], Any] | None = None,
                 finish: Callable[[Any], Any] | None = None) -> None:
        _require_callable(create, "AggregateOperation create")
        _require_callable(accumulate, "AggregateOperation accumulate")
        for name, fn in (("combine", combine), ("deduct", deduct), ("export", export),
                         ("finish", finish)):
            if fn is not None:
                _require_callable(fn, f"AggregateOperation {name}")
        self.create = create
        self.accumulate = accumulate
        self.combine = combine
        self.deduct = deduct
        self.export = export or identity
        self.finish = finish or self.export

    def detached_export(self, sample_acc: Any) -> Callable[[Any], Any]:
        """``export``, or, when export is the default (the accumulator itself) and the
        accumulator can change in place, a function that returns a copy. A result emitted while
        the accumulator lives on (rolling and early results, sliding windows) must not change
        when the accumulator does afterwards."""
        if self.export is not identity or type(sample_acc) in _IMMUTABLE_ACCS:
            return self.export
        if self.combine is not None:
            create, combine = self.create, self.combine
            return lambda a: combine(create(), a)
        return copy.deepcopy

    @property
    def can_combine(self) -> bool:
        return self.combine is not None

    @property
    def can_deduct(self) -> bool:
        return self.deduct is not None

    def accumulate_grouped(self, table: dict[Any, Any], keys: Iterable[Any],
                           items: list[Any]) -> None:
        """Accumulates each item into ``table[key]``; built-ins override it with faster loops."""
        create = self.create
        accumulate = self.accumulate
        get = table.get
        for k, x in zip(keys, items):
            acc = get(k, _MISSING)
            if acc is _MISSING:
                acc = create()
            table[k] = accumulate(acc, x)

    def accumulate_all(self, acc: Any, items: list[Any]) -> Any:
        accumulate = self.accumulate
        for x in items:
            acc = accumulate(acc, x)
        return acc

    def combine_grouped(self, table: dict[Any, Any], pairs: list[tuple[Any, Any]]) -> None:
        """Merges (key, acc) pairs into ``table``."""
        combine = self.combine
        if combine is None:
            raise TypeError(f"{self!r} has no combine: it runs in a single stage")
        get = table.get
        for k, acc in pairs:
            mine = get(k, _MISSING)
            table[k] = acc if mine is _MISSING else combine(mine, acc)

    def __repr__(self) -> str:
        return f"AggregateOperation({self.label})"


class _Counting(AggregateOperation):
    label = "counting"

    def __init__(self) -> None:
        super().__init__(create=lambda: 0, accumulate=lambda a, _x: a + 1,
                         combine=lambda a, b: a + b, deduct=lambda a, b: a - b)

    def accumulate_grouped(self, table: dict[Any, Any], keys: Iterable[Any],
                           items: list[Any]) -> None:
        _count_elements(table, keys)

    def accumulate_all(self, acc: Any, items: list[Any]) -> Any:
        return acc + len(items)


class _Summing(AggregateOperation):
    label = "summing"

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        _require_callable(fn, "summing()")
        self.fn = fn
        super().__init__(create=lambda: 0, accumulate=lambda a, x: a + fn(x),
                         combine=lambda a, b: a + b, deduct=lambda a, b: a - b)

    def accumulate_grouped(self, table: dict[Any, Any], keys: Iterable[Any],
                           items: list[Any]) -> None:
        get = table.get
        for k, v in zip(keys, map(self.fn, items)):
            table[k] = get(k, 0) + v

    def accumulate_all(self, acc: Any, items: list[Any]) -> Any:
        return acc + sum(map(self.fn, items))


def _avg_acc(fn: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    def accumulate(acc: list[Any], x: Any) -> list[Any]:
        acc[0] += fn(x)
        acc[1] += 1
        return acc
    return accumulate


def _avg_combine(a: list[Any], b: list[Any]) -> list[Any]:
    return [a[0] + b[0], a[1] + b[1]]


def _avg_deduct(a: list[Any], b: list[Any]) -> list[Any]:
    return [a[0] - b[0], a[1] - b[1]]


def _avg_export(a: list[Any]) -> float | None:
    return a[0] / a[1] if a[1] else None


def _extreme_by(fn: Callable[[Any], Any], better: Callable[[Any, Any], bool]) -> AggregateOperation:
    # acc: None or [value, item], so fn runs once per item
    def accumulate(acc: Any, x: Any) -> Any:
        v = fn(x)
        if acc is None or better(v, acc[0]):
            return [v, x]
        return acc

    def combine(a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        return b if better(b[0], a[0]) else a

    return AggregateOperation(lambda: None, accumulate, combine,
                              export=lambda a: None if a is None else a[1])


def _list_combine(a: list[Any], b: list[Any]) -> list[Any]:
    a.extend(b)
    return a


def _set_combine(a: set[Any], b: set[Any]) -> set[Any]:
    a |= b
    return a


class AggregateOperations:
    """Factories of the built-in aggregate operations (Jet's ``AggregateOperations``)."""

    @staticmethod
    def counting() -> AggregateOperation:
        """Number of items."""
        return _Counting()

    @staticmethod
    def summing(fn: Callable[[Any], Any]) -> AggregateOperation:
        """Sum of ``fn(item)``."""
        return _Summing(fn)

    @staticmethod
    def averaging(fn: Callable[[Any], Any]) -> AggregateOperation:
        """Mean of ``fn(item)`` (None for no items)."""
        _require_callable(fn, "averaging()")
        return AggregateOperation(lambda: [0, 0], _avg_acc(fn), _avg_combine, _avg_deduct,
                                  _avg_export)

    @staticmethod
    def min_by(fn: Callable[[Any], Any]) -> AggregateOperation:
        """The item with the smallest ``fn(item)`` (the first of equals)."""
        _require_callable(fn, "min_by()")
        return _extreme_by(fn, lambda v, best: v < best)

    @staticmethod
    def max_by(fn: Callable[[Any], Any]) -> AggregateOperation:
        """The item with the largest ``fn(item)`` (the first of equals)."""
        _require_callable(fn, "max_by()")
        return _extreme_by(fn, lambda v, best: v > best)

    @staticmethod
    def to_list() -> AggregateOperation:
        """Every item, in arrival order per processor."""
        def accumulate(a: list[Any], x: Any) -> list[Any]:
            a.append(x)
            return a
        return AggregateOperation(list, accumulate, _list_combine, export=list)

    @staticmethod
    def to_set() -> AggregateOperation:
        """The distinct items."""
        def accumulate(a: set[Any], x: Any) -> set[Any]:
            a.add(x)
            return a
        return AggregateOperation(set, accumulate, _set_combine, export=set)

    @staticmethod
    def to_dict(key_fn: Callable[[Any], Any], value_fn: Callable[[Any], Any],
                merge_fn: Callable[[Any, Any], Any] | None = None) -> AggregateOperation:
        """A dict of ``key_fn(item) -> value_fn(item)``.

        Two items with the same key are an error unless ``merge_fn(old, new)`` is given.
        """
        _require_callable(key_fn, "to_dict() key_fn")
        _require_callable(value_fn, "to_dict() value_fn")
        if merge_fn is not None:
            _require_callable(merge_fn, "to_dict() merge_fn")

        def put(d: dict[Any, Any], k: Any, v: Any) -> None:
            if k in d:
                if merge_fn is None:
                    raise ValueError(
                        f"to_dict(): duplicate key {k!r} (values {d[k]!r} and {v!r}); pass "
                        "merge_fn to combine values of equal keys")
                v = merge_fn(d[k], v)
            d[k] = v

        def accumulate(d: dict[Any, Any], x: Any) -> dict[Any, Any]:
            put(d, key_fn(x), value_fn(x))
            return d

        def combine(a: dict[Any, Any], b: dict[Any, Any]) -> dict[Any, Any]:
            for k, v in b.items():
                put(a, k, v)
            return a

        return AggregateOperation(dict, accumulate, combine, export=dict)

    @staticmethod
    def all_of(*ops: AggregateOperation) -> AggregateOperation:
        """Several operations over the same items; the result is a tuple of their results."""
        if not ops:
            raise ValueError("all_of() needs at least one AggregateOperation")
        for i, op in enumerate(ops):
            if not isinstance(op, AggregateOperation):
                raise TypeError(f"all_of(): argument {i} is {type(op).__qualname__}, "
                                "not an AggregateOperation")
        n = len(ops)

        def accumulate(accs: list[Any], x: Any) -> list[Any]:
            for i in range(n):
                accs[i] = ops[i].accumulate(accs[i], x)
            return accs

        # combine and deduct when every operation has them
        combines = [op.combine for op in ops if op.combine is not None]
        deducts = [op.deduct for op in ops if op.deduct is not None]

        def combine(a: list[Any], b: list[Any]) -> list[Any]:
            return [f(x, y) for f, x, y in zip(combines, a, b)]

        def deduct(a: list[Any], b: list[Any]) -> list[Any]:
            return [f(x, y) for f, x, y in zip(deducts, a, b)]

        return AggregateOperation(
            lambda: [op.create() for op in ops], accumulate,
            combine if len(combines) == n else None, deduct if len(deducts) == n else None,
            export=lambda a: tuple(ops[i].export(a[i]) for i in range(n)),
            finish=lambda a: tuple(ops[i].finish(a[i]) for i in range(n)))
