"""q6, average selling price per seller: the average winning price of each seller's last 10
closed auctions, emitted at each closed auction of the seller.

Built on ``winning_bids``: the closed auctions, grouped by seller and taken in closing order,
feed a keyed ``map_stateful`` holding each seller's last 10 winning prices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from bench.nexmark.queries import NexmarkInputs, Query
from bench.nexmark.queries.winning_bids import (
    closed_auctions, closed_in, closes_at, reference_winners,
)
from jetwake.engine.pipeline.pipeline import Stage

LAST = 10


def _new_prices() -> list:
    return []  # the seller's last LAST winning prices, oldest first


def average_after(prices: list, seller: int, winner: Any) -> dict:
    """The seller's record after one more closed auction (``prices`` is updated)."""
    prices.append(winner["price"])
    if len(prices) > LAST:
        del prices[0]
    return {"seller": seller, "avg_price": sum(prices) / len(prices),
            "auction": winner["auction"], "closed_at": closes_at(winner["expires"])}


def _averages(prices: list, seller: int, result: Any) -> list | None:
    return [average_after(prices, seller, w) for w in closed_in(result)] or None


def build(inputs: NexmarkInputs) -> Stage:
    return (closed_auctions(inputs, lambda c: c["seller"])
            .group_by(lambda r: r.key).map_stateful(_new_prices, _averages)
            .set_name("q6-last-10")
            .flat_map(lambda records: records).set_name("q6-averages"))


def comparable(record: Any) -> Hashable:
    return (record["seller"], record["auction"], round(record["avg_price"], 6),
            record["closed_at"])


def reference(events: Sequence[tuple[str, Any]]) -> Counter:
    prices: dict[int, list] = {}
    return Counter(
        comparable(average_after(prices.setdefault(w["seller"], _new_prices()),
                                 w["seller"], w))
        for w in reference_winners(events))


QUERY = Query("q6", "average selling price per seller", build, reference, comparable,
              reads=("auction", "bid"))
