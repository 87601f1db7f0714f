"""q11, user sessions: per bidder, the bids of each session (bids less than 10 s apart), with
the session's start and end.

jetwake counts bids per bidder in session windows of a 10 s gap. A session starts at its first
bid and ends at its last bid plus the gap; two bids exactly 10 s apart are in different
sessions (docs/windowing.md). The reference builds the sessions from the raw bids with the
window tests' brute-force sessions (``jetwake.engine.verification.window_reference``), which follow the
same rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from jetwake import AggregateOperations as ops
from jetwake import WindowDefinition
from jetwake.engine.pipeline.pipeline import Stage

from bench.nexmark.constants import Q11_GAP_MS
from bench.nexmark.generator import Event
from bench.nexmark.queries import NexmarkInputs, Query

GAP_MS = Q11_GAP_MS


def _bidder(bid: Any) -> int:
    return bid["bidder"]


def _record(session: Any) -> dict:
    return {"bidder": session.key, "bid_count": session.result, "starttime": session.start,
            "endtime": session.end}


def build(inputs: NexmarkInputs) -> Stage:
    return (inputs.bids()
            .window(WindowDefinition.session(GAP_MS))
            .group_by(_bidder)
            .aggregate(ops.counting())
            .map(_record)
            .set_name("q11-user-sessions"))


def comparable(record: Any) -> Hashable:
    return (record["bidder"], record["bid_count"], record["starttime"], record["endtime"])


def reference(events: Sequence[tuple[str, Event]]) -> Counter:
    # imported here: the processes that run the query (cluster members) never need it
    from jetwake.engine.verification.window_reference import session_reference

    sessions = session_reference([(e["date_time"], e["bidder"]) for k, e in events if k == "bid"],
                                 GAP_MS)
    return Counter((bidder, n, start, end) for start, end, bidder, n in sessions)


QUERY = Query("q11", "user sessions", build, reference, comparable, reads=("bid",),
              peers=("quix", "bytewax"))
