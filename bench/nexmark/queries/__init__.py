"""The NEXMark queries as jetwake pipelines, and the registry the runner and tests use.

Each query module (``q0.py`` ... ``q12.py``) defines one ``Query``: how to build it from
the event streams (``NexmarkInputs``), and a plain-Python reference computed from the
generated events, against which the benchmark and the tests check every output record.
The runner (``bench.nexmark.runner``) writes a query's output stage to a Kafka topic as
JSON; ``Query.comparable`` turns one decoded output record into the hashable form the
reference's multiset holds.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

from jetwake import Pipeline, Sources
from jetwake.engine.pipeline.pipeline import Stage

from bench.nexmark.events import AUCTION_TOPIC, BID_TOPIC, END_MARKER_FIELD, PERSON_TOPIC
from bench.nexmark.generator import Event

KINDS = ("person", "auction", "bid")
TOPICS = {"person": PERSON_TOPIC, "auction": AUCTION_TOPIC, "bid": BID_TOPIC}


@dataclass
class NexmarkInputs:
    """The event streams a query reads, with event time from each record's ``date_time``.

    ``kafka`` (consumer properties) reads the three topics; ``events`` (a list of
    ``(kind, record)`` pairs, as the generator yields) reads from memory instead, for
    tests of a query's logic without a broker. ``allowed_lag_ms`` bounds the disorder the
    watermark allows (the generator's ``out_of_order_ms``). From Kafka, the end-of-input
    markers ``bench.nexmark.kafka_input.fill`` writes (a record with ``END_MARKER_FIELD``, an
    event time a day after the last event, one per partition) end the input as a bounded
    source's end would: they move the watermark past every window and are then dropped.
    """

    pipeline: Pipeline
    kafka: dict | None = None
    events: Sequence[tuple[str, Event]] | None = None
    allowed_lag_ms: int = 1_000
    topic_prefix: str = ""

    def persons(self) -> Stage:
        """The stream of Person records."""
        return self.stream("person")

    def auctions(self) -> Stage:
        """The stream of Auction records."""
        return self.stream("auction")

    def bids(self) -> Stage:
        """The stream of Bid records."""
        return self.stream("bid")

    def stream(self, kind: str) -> Stage:
        """One kind's records as a stage with event timestamps (``date_time``)."""
        if kind not in KINDS:
            raise ValueError(f"NexmarkInputs.stream(): kind must be one of {KINDS}, got {kind!r}")
        if self.kafka is not None:
            # the value column as the items, no record made (Sources.kafka reads an
            # attrgetter projection as a column)
            source = Sources.kafka(self.topic_prefix + TOPICS[kind], self.kafka,
                                   value_deserializer="json", projection=_VALUE)
            stage = self.pipeline.read_from(source)
        elif self.events is not None:
            stage = self.pipeline.read_from(
                Sources.items([e for k, e in self.events if k == kind]))
        else:
            raise ValueError("NexmarkInputs: give kafka (consumer properties) or events")
        stage = stage.with_timestamps(_date_time, self.allowed_lag_ms).set_name(f"{kind}s")
        if self.kafka is not None:
            # the end-of-input markers moved the watermark past every window; no query sees them
            stage = stage.filter(_not_end_marker).set_name(f"{kind}s-events")
        return stage


_VALUE = attrgetter("value")


def _not_end_marker(event: Any) -> bool:
    return END_MARKER_FIELD not in event


# read by C code, no Python call per event (the timestamp stage checks it is an int)
_date_time = itemgetter("date_time")


@dataclass(frozen=True)
class Query:
    """One NEXMark query.

    ``build(inputs)`` returns the output stage (items must be JSON-serialisable: dicts or
    lists); the runner adds the Kafka sink. ``reference(events)`` computes the expected
    output from the generated ``(kind, record)`` pairs as a multiset of
    ``comparable(record)`` values, where ``record`` is one output item after a JSON round
    trip. ``reads`` names the kinds the query consumes (for the events/s figure).
    ``exact=False`` marks a query whose output depends on wall-clock time (q12): then
    ``check(events, outputs)`` returns a list of problems instead of the multiset
    comparison.
    """

    name: str
    title: str
    build: Callable[[NexmarkInputs], Stage]
    reference: Callable[[Sequence[tuple[str, Event]]], Counter]
    comparable: Callable[[Any], Hashable]
    reads: tuple[str, ...] = ("bid",)
    exact: bool = True
    check: Callable[[Sequence[tuple[str, Event]], list[Any]], list[str]] | None = None
    peers: tuple[str, ...] = field(default=())


QUERY_NAMES = ("q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q11", "q12")


def query(name: str) -> Query:
    """The query called ``name`` (q0 ... q12), imported from its module."""
    if name not in QUERY_NAMES:
        raise ValueError(f"unknown NEXMark query {name!r}: choose from {', '.join(QUERY_NAMES)}")
    module = importlib.import_module(f"bench.nexmark.queries.{name}")
    q = module.QUERY
    if not isinstance(q, Query) or q.name != name:
        raise TypeError(f"bench.nexmark.queries.{name}.QUERY must be the Query named {name!r}")
    return q


def check_output(q: Query, events: Sequence[tuple[str, Event]], outputs: list[Any]) -> list[str]:
    """The differences between a query's outputs and its reference, as readable lines
    (empty when they agree)."""
    if not q.exact:
        return q.check(events, outputs) if q.check else []
    want = q.reference(events)
    got = Counter(q.comparable(o) for o in outputs)
    problems = []
    missing, extra = want - got, got - want
    if missing:
        problems.append(f"{q.name}: {sum(missing.values())} expected records missing, e.g. "
                        f"{list(missing)[:3]}")
    if extra:
        problems.append(f"{q.name}: {sum(extra.values())} unexpected records, e.g. "
                        f"{list(extra)[:3]}")
    return problems
