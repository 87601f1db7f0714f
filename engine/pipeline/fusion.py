"""Fusing consecutive stateless stages (map, filter, flat_map) into one function over a chunk.

The fused function runs on the edge that leaves the upstream processor, before routing, so a
chain of stateless stages costs one list comprehension per stage per chunk and no extra
processor or queue hop: in CPython a call or a queue hop per item costs more than the work
of a typical stage (docs/architecture.md, "Execution").
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

__all__ = ["StatelessOp", "compile_chain"]

# ("map" | "filter" | "flat_map", fn), or ("chunk", fn) for a step that maps lists already
StatelessOp = tuple[str, Callable[[Any], Any]]


def _map(fn: Callable[[Any], Any]) -> Callable[[list], list]:
    # as in Jet, a map function returning None drops the item
    return lambda items: [y for y in map(fn, items) if y is not None]


def _filter(fn: Callable[[Any], Any]) -> Callable[[list], list]:
    return lambda items: [x for x in items if fn(x)]


def _flat_map(fn: Callable[[Any], Any]) -> Callable[[list], list]:
    return lambda items: [y for x in items for y in (fn(x) or ())]


def _chunk(fn: Callable[[list], list]) -> Callable[[list], list]:
    return fn


_STEP = {"map": _map, "filter": _filter, "flat_map": _flat_map, "chunk": _chunk}


def compile_chain(ops: Sequence[StatelessOp]) -> Callable[[list], list] | None:
    """One function applying every op in order to a list of items; None for no ops."""
    if not ops:
        return None
    steps = [_STEP[kind](fn) for kind, fn in ops]
    if len(steps) == 1:
        return steps[0]

    def fused(items: list) -> list:
        for step in steps:
            if not items:
                break
            items = step(items)
        return items

    return fused
