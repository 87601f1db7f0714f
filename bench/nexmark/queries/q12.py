"""q12, processing-time windows: per bidder, the bids counted in tumbling windows of 10 s of
processing time (the wall clock when jetwake reads the bid), not of the bids' event time.

jetwake stamps each bid with the wall clock and lets the watermark follow the wall clock
(``with_timestamps(..., policy="limiting_real_time_lag")``), so a window closes when its
10 s have passed on the clock, whether or not bids arrive. Which window a bid falls in depends
on when it was read, so the output cannot be compared record by record: ``check`` verifies
that the counts of each bidder add up to the bids of that bidder that were read, and that every
window is 10 s long and aligned to 10 s.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from jetwake import AggregateOperations as ops
from jetwake import WindowDefinition
from jetwake.engine.pipeline.pipeline import Stage

from bench.nexmark.generator import Event
from bench.nexmark.queries import NexmarkInputs, Query

SIZE_MS = 10_000
# how far behind the clock the watermark stays, so that a bid stamped just before a window's
# end is in the window before the watermark closes it (a latency, never a loss)
CLOCK_LAG_MS = 1_000


def _now_ms(_bid: Any) -> int:
    return time.time_ns() // 1_000_000


def _bidder(bid: Any) -> int:
    return bid["bidder"]


def _record(window: Any) -> dict:
    return {"bidder": window.key, "bid_count": window.result, "starttime": window.start,
            "endtime": window.end}


def build(inputs: NexmarkInputs) -> Stage:
    return (inputs.bids()
            .with_timestamps(_now_ms, CLOCK_LAG_MS, policy="limiting_real_time_lag")
            .window(WindowDefinition.tumbling(SIZE_MS))
            .group_by(_bidder)
            .aggregate(ops.counting())
            .map(_record)
            .set_name("q12-processing-time-windows"))


def comparable(record: Any) -> Hashable:
    return (record["bidder"], record["bid_count"], record["starttime"], record["endtime"])


def reference(events: Sequence[tuple[str, Event]]) -> Counter:
    """The bids per bidder: what the windows of each bidder must add up to."""
    return Counter(e["bidder"] for k, e in events if k == "bid")


def check(events: Sequence[tuple[str, Event]], outputs: list[Any]) -> list[str]:
    """The problems of an output: windows not 10 s long or not aligned to 10 s, a bidder's
    window twice, or counts per bidder that do not add up to the bids read."""
    problems = []
    windows: Counter = Counter()
    counted: Counter = Counter()
    for r in outputs:
        start, end = r["starttime"], r["endtime"]
        if end - start != SIZE_MS or start % SIZE_MS:
            problems.append(f"q12: window [{start}, {end}) is not a 10 s window aligned to 10 s")
        if r["bid_count"] <= 0:
            problems.append(f"q12: an empty window {r}")
        windows[(r["bidder"], start)] += 1
        counted[r["bidder"]] += r["bid_count"]
    twice = [w for w, n in windows.items() if n > 1]
    if twice:
        problems.append(f"q12: {len(twice)} windows of a bidder output more than once, "
                        f"e.g. {twice[:3]}")
    want = reference(events)
    wrong = sorted(b for b in want.keys() | counted.keys() if want[b] != counted[b])
    if wrong:
        problems.append(f"q12: the window counts of {len(wrong)} bidders do not add up to their "
                        f"bids, e.g. " + ", ".join(f"bidder {b}: {counted[b]} counted, "
                                                   f"{want[b]} bids" for b in wrong[:3]))
    return problems


QUERY = Query("q12", "processing-time windows", build, reference, comparable, reads=("bid",),
              exact=False, check=check)
