"""What a run of a spec produced, in a shape every runtime and the model share."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["RunResult", "canonical", "multiset", "difference"]


def canonical(x: Any) -> Any:
    """``x`` as a hashable value that compares equal across runtimes: lists and tuples become
    tuples, sets frozensets, a window result the tuple of its type name and fields (the
    engine's result types are tuples with named fields; the model builds the same tuples)."""
    fields = getattr(type(x), "_fields", None)
    if fields is not None and "result" in fields and "start" in fields:
        name = "KeyedWindowResult" if "key" in fields else "WindowResult"
        values = tuple(canonical(getattr(x, f)) for f in fields)
        if getattr(x, "is_early", False):
            name += "(early)"
        return (name,) + values
    if isinstance(x, (list, tuple)):
        return tuple(canonical(y) for y in x)
    if isinstance(x, (set, frozenset)):
        return frozenset(canonical(y) for y in x)
    if isinstance(x, dict):
        return ("dict", frozenset((canonical(k), canonical(v)) for k, v in x.items()))
    return x


def multiset(items: Iterable[Any]) -> Counter:
    """The canonical items as a multiset (arrival order across processors is not fixed)."""
    return Counter(canonical(x) for x in items)


@dataclass
class RunResult:
    """What one run emitted: every node's output, the late events a window routed to its late
    sink, and the late events each window or ttl stage counted (its ``late_events`` metric,
    summed over the stage's vertices)."""

    outputs: dict[str, Counter] = field(default_factory=dict)
    late_items: dict[str, Counter] = field(default_factory=dict)
    late_counts: dict[str, int] = field(default_factory=dict)

    @property
    def total_late(self) -> int:
        return sum(self.late_counts.values())


def _counter_diff(name: str, expected: Counter, actual: Counter, limit: int = 8) -> list[str]:
    if expected == actual:
        return []
    missing = expected - actual
    extra = actual - expected
    lines = [f"{name}: expected {sum(expected.values())} items, got {sum(actual.values())}"]
    for label, c in (("missing", missing), ("unexpected", extra)):
        shown = list(c.elements())
        if shown:
            lines.append(f"  {label} ({len(shown)}): " + ", ".join(
                repr(x) for x in sorted(shown, key=repr)[:limit]) +
                (" ..." if len(shown) > limit else ""))
    return lines


def difference(expected: RunResult, actual: RunResult) -> str:
    """A readable account of how ``actual`` differs from ``expected``; empty when equal."""
    lines: list[str] = []
    for node in sorted(set(expected.outputs) | set(actual.outputs)):
        lines += _counter_diff(f"output of {node!r}", expected.outputs.get(node, Counter()),
                               actual.outputs.get(node, Counter()))
    for node in sorted(set(expected.late_items) | set(actual.late_items)):
        lines += _counter_diff(f"late events of {node!r}",
                               expected.late_items.get(node, Counter()),
                               actual.late_items.get(node, Counter()))
    for node in sorted(set(expected.late_counts) | set(actual.late_counts)):
        e, a = expected.late_counts.get(node, 0), actual.late_counts.get(node, 0)
        if e != a:
            lines.append(f"late_events of {node!r}: expected {e}, got {a}")
    return "\n".join(lines)
