"""q8, monitor new users: the persons who put up an auction within the 10-second tumbling
window in which they registered, as (id, name, window start and end).

A window join in event time: persons and auctions are co-aggregated in the same tumbling
windows and keys (a person's ``id``, an auction's ``seller``), and a person is output for a
window in which both sides have items. As in Flink's SQL, which groups each side by key and
window before joining, a person is output once per window however many auctions they created
in it (Beam's version emits one row per auction).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from bench.nexmark.queries import NexmarkInputs, Query
from jetwake import AggregateOperations, WindowDefinition
from jetwake.engine.pipeline.pipeline import Stage

WINDOW_MS = 10_000


def window_start(date_time: int) -> int:
    """The start of the tumbling window holding ``date_time``."""
    return date_time - date_time % WINDOW_MS


def new_user(result: Any) -> dict | None:
    """One output record from a window's ``(persons, auction count)`` of one person id, or
    None when either side is empty."""
    persons, auctions = result.result
    if not persons or not auctions:
        return None
    return {"id": result.key, "name": persons[0]["name"], "starttime": result.start,
            "endtime": result.end}


def build(inputs: NexmarkInputs) -> Stage:
    # the window keeps each person's id and name only
    persons = inputs.persons().map(lambda p: {"id": p["id"], "name": p["name"]})
    return (persons.window(WindowDefinition.tumbling(WINDOW_MS)).group_by(lambda p: p["id"])
            .aggregate2(inputs.auctions().group_by(lambda a: a["seller"]),
                        AggregateOperations.to_list(), AggregateOperations.counting())
            .set_name("q8-window-join")
            .map(new_user).set_name("q8-new-users"))


def comparable(record: Any) -> Hashable:
    return (record["id"], record["name"], record["starttime"], record["endtime"])


def reference(events: Sequence[tuple[str, Any]]) -> Counter:
    sellers = {(e["seller"], window_start(e["date_time"])) for k, e in events if k == "auction"}
    return Counter((e["id"], e["name"], window_start(e["date_time"]),
                    window_start(e["date_time"]) + WINDOW_MS)
                   for k, e in events
                   if k == "person" and (e["id"], window_start(e["date_time"])) in sellers)


QUERY = Query("q8", "monitor new users", build, reference, comparable,
              reads=("person", "auction"))
