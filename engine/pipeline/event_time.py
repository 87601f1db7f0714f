"""How items carry event time between stages.

After ``with_timestamps`` (or on a source with native timestamps) items travel as
``(timestamp, item)`` pairs: the timestamp is read once, by the stage that inserts watermarks,
and every event-time stage downstream reads it from the pair. Stateless stages on such a stream
run on the item and keep its timestamp; the planner unwraps the pairs on the edge into any
stage that does not use event time (sinks included), so user functions only ever see items.

A source whose ``Source.timestamp_fn`` is :func:`native_pair_timestamp` emits the pairs itself
(for example ``TestSources.item_stream``); without ``with_native_timestamps`` they are unwrapped
like any other.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable

from jetwake.engine.operations.window_result import KeyedWindowResult

__all__ = ["native_pair_timestamp", "unwrap", "wrapped_step", "window_join_flattener"]

_second = itemgetter(1)


def native_pair_timestamp(pair: Any) -> int:
    """The ``timestamp_fn`` of a source that emits ``(timestamp, item)`` pairs."""
    return pair[0]


def unwrap(pairs: list) -> list:
    """``(ts, item)`` pairs -> items."""
    return list(map(_second, pairs))


def wrapped_step(kind: str, fn: Callable[[Any], Any]) -> Callable[[list], list]:
    """A stateless stage over a chunk of ``(ts, item)`` pairs that keeps the timestamps."""
    if kind == "map":
        return lambda pairs: [(t, y) for t, x in pairs if (y := fn(x)) is not None]
    if kind == "filter":
        return lambda pairs: [p for p in pairs if fn(p[1])]
    if kind == "flat_map":
        return lambda pairs: [(t, y) for t, x in pairs for y in (fn(x) or ())]
    raise ValueError(f"unknown stateless stage kind {kind!r}")


def window_join_flattener(join_fn: Callable[[Any, Any], Any]) -> Callable[[Any], list]:
    """Turns a co-grouped ``KeyedWindowResult(start, end, key, (lefts, rights))`` into one
    result per pair ``join_fn(left, right)``."""
    def flatten(r: Any) -> list:
        lefts, rights = r.result
        out = []
        for a in lefts:
            for b in rights:
                v = join_fn(a, b)
                if v is not None:
                    out.append(KeyedWindowResult(r.start, r.end, r.key, v))
        return out
    return flatten
