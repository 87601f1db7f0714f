"""q0, pass-through: every bid, unchanged. Measures the cost of reading, decoding,
encoding and writing a record, with no query logic."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from bench.nexmark.generator import Event
from bench.nexmark.queries import NexmarkInputs, Query
from jetwake.engine.pipeline.pipeline import Stage


def build(inputs: NexmarkInputs) -> Stage:
    return inputs.bids()


def comparable(bid: Any) -> Hashable:
    return (bid["auction"], bid["bidder"], bid["price"], bid["date_time"])


def reference(events: Sequence[tuple[str, Event]]) -> Counter:
    return Counter(comparable(e) for k, e in events if k == "bid")


QUERY = Query("q0", "pass-through", build, reference, comparable, reads=("bid",),
              peers=("quix", "bytewax"))
