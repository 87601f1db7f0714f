"""Inputs and checks for the window tests. The windows computed from the raw events are
``jetwake.engine.verification.window_reference`` (the NEXMark benchmark compares with them
too); they are re-exported here for the tests."""

from __future__ import annotations

import random
from collections import defaultdict
from math import gcd

from jetwake.engine.verification.window_reference import session_reference, sliding_reference

__all__ = ["NO_WM", "make_events", "watermarks_before", "sliding_reference", "session_reference",
           "check_late", "step_of", "multiset_minus"]

NO_WM = -(2**63)


def make_events(n: int, keys: int, disorder: int, seed: int, spacing: int = 1,
                start: int = 0) -> list[tuple[int, str, int, int]]:
    """``(ts, key, value, sequence)`` in arrival order: time advances by ``spacing`` per
    event and each event is up to ``disorder`` behind its nominal time."""
    rnd = random.Random(seed)
    return [(start + i * spacing - rnd.randint(0, disorder), f"k{rnd.randrange(keys)}",
             rnd.randint(1, 100), i) for i in range(n)]


def watermarks_before(tss: list[int], lag: int, step: int) -> list[int]:
    """The watermark the insert-watermarks stage had emitted before each event."""
    out = []
    top = NO_WM
    for t in tss:
        if top == NO_WM:
            out.append(NO_WM)
        else:
            wm = top - lag
            out.append(wm - wm % step if step > 1 else wm)
        top = max(top, t)
    return out


def check_late(events, late, lag: int, step: int) -> None:
    """Every late event really was behind a watermark emitted before it arrived."""
    wms = watermarks_before([e[0] for e in events], lag, step)
    limit = {}
    for e, w in zip(events, wms):
        limit.setdefault(e, w)
    for e in late:
        assert e[0] < limit[e], f"{e} reported late but the watermark before it was {limit[e]}"


def step_of(*sizes: int) -> int:
    g = 0
    for s in sizes:
        g = gcd(g, s)
    return g


def multiset_minus(events, removed) -> list:
    counts: dict = defaultdict(int)
    for e in removed:
        counts[e] += 1
    out = []
    for e in events:
        if counts[e]:
            counts[e] -= 1
        else:
            out.append(e)
    return out
