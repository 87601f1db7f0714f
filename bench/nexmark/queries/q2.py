"""q2, selection: the bids on a few auctions, those whose id is a multiple of 123.

As Flink's nexmark q2, ``SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from bench.nexmark.constants import AUCTION_MODULUS as MODULUS
from bench.nexmark.generator import Event
from bench.nexmark.queries import NexmarkInputs, Query
from jetwake.engine.pipeline.pipeline import Stage


def selected(bid: Any) -> bool:
    return bid["auction"] % MODULUS == 0


def project(bid: Any) -> dict:
    return {"auction": bid["auction"], "price": bid["price"]}


def build(inputs: NexmarkInputs) -> Stage:
    return inputs.bids().filter(selected).map(project).set_name("q2-selection")


def comparable(record: Any) -> Hashable:
    return (record["auction"], record["price"])


def reference(events: Sequence[tuple[str, Event]]) -> Counter:
    return Counter(comparable(project(e)) for k, e in events if k == "bid" and selected(e))


QUERY = Query("q2", "selection", build, reference, comparable, reads=("bid",),
              peers=("quix", "bytewax"))
