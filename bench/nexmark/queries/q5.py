"""q5, hot items: in each sliding window of 10 s every 2 s, the auction(s) with the most
bids (all ties).

jetwake counts bids per auction in a keyless sliding window whose accumulator is a counter
(auction -> bids), as Beam's version combines per-auction counts in one combiner: frames are
counted where the bids are read, the windows are built from their frames by adding the frame
that entered and deducting the one that left, and each window's result is its auctions with
the highest count. The reference counts every window from the raw bids with the window tests'
brute-force sliding windows (``jetwake.engine.verification.window_reference``), so the rule of which
windows hold a bid is written once for the tests and the benchmark.
"""

from __future__ import annotations

from collections import Counter, _count_elements  # type: ignore[attr-defined]  # C loop
from collections.abc import Hashable, Sequence
from operator import itemgetter
from typing import Any, Callable

from jetwake import AggregateOperation, WindowDefinition
from jetwake.engine.pipeline.pipeline import Stage

from bench.nexmark.constants import Q5_SIZE_MS, Q5_SLIDE_MS
from bench.nexmark.generator import Event
from bench.nexmark.queries import NexmarkInputs, Query

SIZE_MS, SLIDE_MS = Q5_SIZE_MS, Q5_SLIDE_MS

_MISSING = object()


class BatchedOperation(AggregateOperation):
    """An aggregate operation whose batch path (``accumulate_all``) does the work: a run of
    items of one key (every run of a keyless window) is accumulated with one call, not one
    Python call per item. Runs of several keys fall back to the item-by-item path."""

    def __init__(self, accumulate_all: Callable[[Any, list], Any], **kw: Any) -> None:
        super().__init__(**kw)
        self._accumulate_all = accumulate_all

    def accumulate_all(self, acc: Any, items: list[Any]) -> Any:
        return self._accumulate_all(acc, items)

    def accumulate_grouped(self, table: dict[Any, Any], keys: Any, items: list[Any]) -> None:
        keys = list(keys)
        if not keys:
            return
        k = keys[0]
        if keys.count(k) != len(keys):
            super().accumulate_grouped(table, keys, items)
            return
        acc = table.get(k, _MISSING)
        table[k] = self._accumulate_all(self.create() if acc is _MISSING else acc, items)


_auction = itemgetter("auction")


def _count_all(acc: dict, bids: list) -> dict:
    _count_elements(acc, map(_auction, bids))
    return acc


def _count_one(acc: dict, bid: Any) -> dict:
    a = bid["auction"]
    acc[a] = acc.get(a, 0) + 1
    return acc


def _combine(a: dict, b: dict) -> dict:
    get = a.get
    for k, n in b.items():
        a[k] = get(k, 0) + n
    return a


def _deduct(a: dict, b: dict) -> dict:
    for k, n in b.items():
        left = a[k] - n
        if left:
            a[k] = left
        else:
            del a[k]
    return a


def _hottest(counts: dict) -> list[list[int]]:
    """The ``[auction, count]`` pairs with the highest count (all ties), by auction."""
    if not counts:
        return []
    top = max(counts.values())
    return sorted([a, n] for a, n in counts.items() if n == top)


def bids_per_auction() -> AggregateOperation:
    """Counts bids per auction (a dict accumulator), exporting the auctions with the most."""
    return BatchedOperation(_count_all, create=dict, accumulate=_count_one, combine=_combine,
                            deduct=_deduct, export=_hottest)


def _records(window: Any) -> list[dict]:
    return [{"auction": a, "num": n, "starttime": window.start, "endtime": window.end}
            for a, n in window.result]


def build(inputs: NexmarkInputs) -> Stage:
    return (inputs.bids()
            .window(WindowDefinition.sliding(SIZE_MS, SLIDE_MS))
            .aggregate(bids_per_auction())
            .flat_map(_records)
            .set_name("q5-hot-items"))


def comparable(record: Any) -> Hashable:
    return (record["auction"], record["num"], record["starttime"], record["endtime"])


def reference(events: Sequence[tuple[str, Event]]) -> Counter:
    # imported here: the processes that run the query (cluster members) never need it
    from jetwake.engine.verification.window_reference import sliding_reference

    counts = sliding_reference([(e["date_time"], e["auction"]) for k, e in events if k == "bid"],
                               SIZE_MS, SLIDE_MS)
    top: dict[tuple[int, int], int] = {}
    for start, end, _auction_id, n in counts:
        top[(start, end)] = max(top.get((start, end), 0), n)
    return Counter((a, n, start, end) for start, end, a, n in counts if n == top[(start, end)])


QUERY = Query("q5", "hot items", build, reference, comparable, reads=("bid",),
              peers=("quix", "bytewax"))
