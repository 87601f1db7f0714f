"""q4, average price per category: the average winning price of the closed auctions of each
category, updated at each closed auction.

Flink's SQL gives an updating result (each auction's maximum bid is revised as bids come, and
so is the average). Here each auction counts once, when it closes with its winning bid
(``winning_bids``), and each closed auction emits the category's running average: the output
is the sequence of running averages, one record per closed auction with a winner, each
naming the number of auctions it averages.
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


def _new_average() -> list:
    return [0, 0]  # closed auctions, sum of their winning prices


def average_after(state: list, category: int, winner: Any) -> dict:
    """The category's record after one more closed auction (``state`` is updated)."""
    state[0] += 1
    state[1] += winner["price"]
    return {"category": category, "avg_price": state[1] / state[0], "auctions": state[0],
            "closed_at": closes_at(winner["expires"])}


def _averages(state: list, category: int, result: Any) -> list | None:
    return [average_after(state, category, w) for w in closed_in(result)] or None


def build(inputs: NexmarkInputs) -> Stage:
    return (closed_auctions(inputs, lambda c: c["category"])
            .group_by(lambda r: r.key).map_stateful(_new_average, _averages)
            .set_name("q4-average")
            .flat_map(lambda records: records).set_name("q4-averages"))


def comparable(record: Any) -> Hashable:
    return (record["category"], record["auctions"], round(record["avg_price"], 6),
            record["closed_at"])


def reference(events: Sequence[tuple[str, Any]]) -> Counter:
    states: dict[int, list] = {}
    return Counter(
        comparable(average_after(states.setdefault(w["category"], _new_average()),
                                 w["category"], w))
        for w in reference_winners(events))


QUERY = Query("q4", "average price per category", build, reference, comparable,
              reads=("auction", "bid"))
