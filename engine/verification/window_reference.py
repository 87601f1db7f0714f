"""Windows computed the obvious way, from the raw events: the reference the window tests and
the NEXMark benchmark compare every runtime's windows with.

Each event is a tuple ``(timestamp, key, ...)``. The rule written here is the one the window
processors must follow: an event at ``ts`` belongs to every sliding window ``[end - size,
end)`` whose ``end`` is a multiple of ``slide`` with ``end - size <= ts < end``, and a session
of a key holds events closer than ``gap`` to the session so far (its end is the last event
plus ``gap``). It works event by event with no cleverness, so a wrong engine cannot share its
mistake.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Sequence

__all__ = ["sliding_reference", "session_reference"]

Event = Sequence[Any]


def _one(_event: Event) -> Any:
    return 1


def _add(a: Any, b: Any) -> Any:
    return a + b


def sliding_reference(events: Sequence[Event], size: int, slide: int, keyed: bool = True,
                      value: Callable[[Event], Any] = _one,
                      combine: Callable[[Any, Any], Any] = _add) -> list[tuple[Any, ...]]:
    """Sorted ``(start, end, key, result)`` (``(start, end, result)`` when not ``keyed``) of
    every sliding window of ``size`` every ``slide`` that holds an event; ``result`` combines
    ``value(event)`` of its events (by default their count)."""
    acc: dict[tuple[Any, ...], Any] = {}
    for e in events:
        ts = e[0]
        frame = ts - ts % slide
        for end in range(frame + slide, frame + size + 1, slide):
            k = (end - size, end, e[1]) if keyed else (end - size, end)
            v = value(e)
            acc[k] = v if k not in acc else combine(acc[k], v)
    return sorted(k + (v,) for k, v in acc.items())


def session_reference(events: Sequence[Event], gap: int, keyed: bool = True,
                      value: Callable[[Event], Any] = _one,
                      combine: Callable[[Any, Any], Any] = _add) -> list[tuple[Any, ...]]:
    """Sorted ``(start, end, key, result)`` (``(start, end, result)`` when not ``keyed``) of
    every session: a key's events in time order, a new session where an event is ``gap`` or
    more after the session's last event; ``end`` is that last event plus ``gap``."""
    by_key: dict[Any, list[Event]] = defaultdict(list)
    for e in events:
        by_key[e[1] if keyed else None].append(e)
    out: list[tuple[Any, ...]] = []
    for key, evs in by_key.items():
        evs = sorted(evs, key=lambda e: e[0])
        start, end, acc = evs[0][0], evs[0][0] + gap, value(evs[0])
        for e in evs[1:]:
            if e[0] < end:
                end = max(end, e[0] + gap)
                acc = combine(acc, value(e))
            else:
                out.append((start, end, key, acc) if keyed else (start, end, acc))
                start, end, acc = e[0], e[0] + gap, value(e)
        out.append((start, end, key, acc) if keyed else (start, end, acc))
    return sorted(out)
