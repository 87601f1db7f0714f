"""q7, highest bid: in each tumbling window of 10 s, the bid(s) with the highest price (all
ties), each output with the window's end.

jetwake keeps, per window, the highest price and the bids that reached it, in a keyless
tumbling window: each frame is reduced where the bids are read (one ``max`` over a run of
prices), the frames of a window are combined where the window is built, and the window emits
its highest bids. The standard (Flink SQL) version joins the bids with each window's maximum,
which reads every bid twice; keeping the tied bids in the accumulator gives the same rows
from one pass. The reference reduces every window from the raw bids with the window tests'
brute-force windows (``jetwake.engine.verification.window_reference``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from operator import itemgetter
from typing import Any

from jetwake import AggregateOperation, WindowDefinition
from jetwake.engine.pipeline.pipeline import Stage

from bench.nexmark.constants import Q7_SIZE_MS
from bench.nexmark.generator import Event
from bench.nexmark.queries import NexmarkInputs, Query
from bench.nexmark.queries.q5 import BatchedOperation

SIZE_MS = Q7_SIZE_MS

_price = itemgetter("price")


def _highest_all(acc: list | None, bids: list) -> list:
    prices = list(map(_price, bids))
    top = max(prices)
    if acc is not None and acc[0] > top:
        return acc
    if prices.count(top) == 1:
        best = [bids[prices.index(top)]]
    else:
        best = [b for b, p in zip(bids, prices) if p == top]
    if acc is not None and acc[0] == top:
        acc[1].extend(best)
        return acc
    return [top, best]


def _highest_one(acc: list | None, bid: Any) -> list:
    return _highest_all(acc, [bid])


def _combine(a: list | None, b: list | None) -> list | None:
    if a is None or (b is not None and b[0] > a[0]):
        return b
    if b is not None and b[0] == a[0]:
        a[1].extend(b[1])
    return a


def _bids(acc: list | None) -> list:
    return [] if acc is None else acc[1]


def highest_bids() -> AggregateOperation:
    """The bids with the highest price (all ties); the accumulator is ``[price, bids]``."""
    return BatchedOperation(_highest_all, create=lambda: None, accumulate=_highest_one,
                            combine=_combine, export=_bids)


def _records(window: Any) -> list[dict]:
    return [{"auction": b["auction"], "bidder": b["bidder"], "price": b["price"],
             "channel": b["channel"], "url": b["url"], "date_time": b["date_time"],
             "extra": b["extra"], "endtime": window.end} for b in window.result]


def build(inputs: NexmarkInputs) -> Stage:
    return (inputs.bids()
            .window(WindowDefinition.tumbling(SIZE_MS))
            .aggregate(highest_bids())
            .flat_map(_records)
            .set_name("q7-highest-bid"))


def comparable(record: Any) -> Hashable:
    return (record["auction"], record["bidder"], record["price"], record["date_time"],
            record["endtime"])


def reference(events: Sequence[tuple[str, Event]]) -> Counter:
    # imported here: the processes that run the query (cluster members) never need it
    from jetwake.engine.verification.window_reference import sliding_reference

    def higher(a: tuple, b: tuple) -> tuple:
        if a[0] != b[0]:
            return a if a[0] > b[0] else b
        return (a[0], a[1] + b[1])

    windows = sliding_reference([(e["date_time"], e) for k, e in events if k == "bid"],
                                SIZE_MS, SIZE_MS, keyed=False,
                                value=lambda e: (e[1]["price"], (e[1],)), combine=higher)
    return Counter((b["auction"], b["bidder"], b["price"], b["date_time"], end)
                   for _start, end, (_price_, bids) in windows for b in bids)


QUERY = Query("q7", "highest bid", build, reference, comparable, reads=("bid",),
              peers=("quix", "bytewax"))
