"""Joins of two streams in event time on one member, beside a plain-Python dict join of the
same data in the same run.

Run ``python -m bench joins`` or ``python -m bench.bench_joins [records per side]``. Each side
has ``n`` records ``(time, key, value)`` over 1 000 keys, one every 10 µs of event time on
average (100 per ms), a little out of order (within the lag). The member job reads both sides
from ``Sources.items``, assigns timestamps and watermarks (lag 20 ms), joins and writes to
``Sinks.noop()``: input records (both sides) per second, job start included. The baseline is
the join itself in plain Python over the same lists, no event time: a dict of each key's
right records sorted by time, probed with ``bisect`` per left record.

- interval: ``join_interval(..., -5, 5)``, about 1.1 pairs per left record.
- as-of: ``join_asof(...)`` (no tolerance), one result per left record.
"""

from __future__ import annotations

import random
import sys
from bisect import bisect_left, bisect_right
from typing import Any, Callable

from jetwake import Member, Pipeline, Sinks, Sources

from .report import figure, line, timer

RECORDS = 200_000
KEYS = 1_000
LAG = 20


def records(n: int, seed: int) -> list[tuple[int, str, int]]:
    rng = random.Random(seed)
    return [(i // 100 - rng.randint(0, 3), f"k{rng.randrange(KEYS)}", i) for i in range(n)]


def _key(e: tuple) -> str:
    return e[1]


def _time(e: tuple) -> int:
    return e[0]


def run_member(lefts: list, rights: list, join: Callable[[Any, Any], Any]) -> tuple[float, dict]:
    """Records/s of a member job joining ``lefts`` and ``rights`` with ``join(left, right)``,
    and the join stage's metrics."""
    p = Pipeline()
    left = p.read_from(Sources.items(lefts)).with_timestamps(_time, LAG)
    right = p.read_from(Sources.items(rights)).with_timestamps(_time, LAG)
    join(left, right).set_name("join").write_to(Sinks.noop())
    with Member() as m:
        with timer() as t:
            job = m.new_job(p)
            job.join(timeout=600)
        return (len(lefts) + len(rights)) / t[0], job.metrics()["join"]


def _by_key(rights: list) -> dict[str, tuple[list[int], list[tuple]]]:
    table: dict[str, tuple[list[int], list[tuple]]] = {}
    for r in sorted(rights, key=_time):
        e = table.get(r[1])
        if e is None:
            e = table[r[1]] = ([], [])
        e[0].append(r[0])
        e[1].append(r)
    return table


def dict_interval(lefts: list, rights: list, lower: int, upper: int) -> tuple[float, int]:
    with timer() as t:
        table = _by_key(rights)
        pairs = []
        for a in lefts:
            e = table.get(a[1])
            if e is None:
                continue
            times, items = e
            for b in items[bisect_left(times, a[0] + lower):bisect_right(times, a[0] + upper)]:
                pairs.append((a, b))
    return (len(lefts) + len(rights)) / t[0], len(pairs)


def dict_asof(lefts: list, rights: list) -> tuple[float, int]:
    with timer() as t:
        table = _by_key(rights)
        out = []
        for a in lefts:
            e = table.get(a[1])
            i = bisect_right(e[0], a[0]) - 1 if e is not None else -1
            out.append((a, e[1][i] if i >= 0 else None))  # type: ignore[index]
    return (len(lefts) + len(rights)) / t[0], len(out)


def main(n: int = RECORDS) -> None:
    lefts, rights = records(n, 1), records(n, 2)
    print(f"{n:,} records a side, {KEYS:,} keys, 100 records per ms, lag {LAG} ms")
    base, pairs = dict_interval(lefts, rights, -5, 5)
    rate, m = run_member(lefts, rights, lambda a, b: a.join_interval(b, _key, _key, -5, 5))
    assert m["join_pairs"] == pairs, (m["join_pairs"], pairs)
    line("interval join [-5, 5] (records in)", rate, base, "records", "dict join")
    figure("  pairs per left record", pairs / n, "")
    figure("  state held at the end (entries)", m["join_state_entries"], "")
    base, results = dict_asof(lefts, rights)
    rate, m = run_member(lefts, rights, lambda a, b: a.join_asof(b, _key, _key))
    assert m["join_pairs"] == results, (m["join_pairs"], results)
    line("as-of join (records in)", rate, base, "records", "dict join")
    figure("  state held at the end (entries)", m["join_state_entries"], "")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else RECORDS)
