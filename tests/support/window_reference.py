"""Brute-force references for the window tests: every window computed from the raw events."""

from __future__ import annotations

import random
from collections import defaultdict
from math import gcd

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


def sliding_reference(events, size: int, slide: int, keyed: bool = True,
                      value=lambda e: 1, combine=lambda a, b: a + b) -> list[tuple]:
    acc: dict = {}
    for e in events:
        ts = e[0]
        f = ts - ts % slide
        for end in range(f + slide, f + size + 1, slide):
            k = (end - size, end, e[1]) if keyed else (end - size, end)
            v = value(e)
            acc[k] = v if k not in acc else combine(acc[k], v)
    return sorted(k + (v,) for k, v in acc.items())


def session_reference(events, gap: int, keyed: bool = True, value=lambda e: 1,
                      combine=lambda a, b: a + b) -> list[tuple]:
    by_key = defaultdict(list)
    for e in events:
        by_key[e[1] if keyed else None].append(e)
    out = []
    for k, evs in by_key.items():
        evs.sort(key=lambda e: e[0])
        cur = None
        for e in evs:
            if cur is not None and e[0] < cur[1]:
                cur[1] = max(cur[1], e[0] + gap)
                cur[2] = combine(cur[2], value(e))
            else:
                if cur is not None:
                    out.append(cur)
                cur = [e[0], e[0] + gap, value(e)]
        out.append(cur)
        for s in out:
            if len(s) == 3:
                s.append(k)
    return sorted(((s[0], s[1], s[3], s[2]) if keyed else (s[0], s[1], s[2])) for s in out)


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
