"""q1, currency conversion: every bid with its price converted from dollars to euros.

As Flink's nexmark q1, ``SELECT auction, bidder, 0.908 * price AS price, date_time, extra
FROM bid``. In Flink SQL ``0.908 * price`` is an exact DECIMAL with 3 decimals; here it is
``price * 908 / 1000``: an exact integer product divided once, which Python rounds to the
float nearest that exact decimal, and whose JSON form (the shortest repr) is that decimal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from bench.nexmark.constants import EURO_MILLS
from bench.nexmark.generator import Event
from bench.nexmark.queries import NexmarkInputs, Query
from jetwake.engine.pipeline.pipeline import Stage


def euros(price: int) -> float:
    """``0.908 * price`` as Flink's DECIMAL result, as the nearest float."""
    return price * EURO_MILLS / 1000


def convert(bid: Any) -> dict:
    return {"auction": bid["auction"], "bidder": bid["bidder"], "price": euros(bid["price"]),
            "date_time": bid["date_time"], "extra": bid["extra"]}


def build(inputs: NexmarkInputs) -> Stage:
    return inputs.bids().map(convert).set_name("q1-euros")


def comparable(record: Any) -> Hashable:
    return (record["auction"], record["bidder"], record["price"], record["date_time"])


def reference(events: Sequence[tuple[str, Event]]) -> Counter:
    return Counter(comparable(convert(e)) for k, e in events if k == "bid")


QUERY = Query("q1", "currency conversion", build, reference, comparable, reads=("bid",),
              peers=("quix", "bytewax"))
