"""q3, local item suggestion: the sellers in Oregon, Idaho or California with their auctions
of category 10, as (name, city, state, auction id, and the newer event's date_time).

An unbounded join of two streams (persons and auctions), like Flink's regular join that keeps
both sides forever. It runs as one keyed ``map_stateful`` over the merged streams, keyed by the
person id (a person's ``id``, an auction's ``seller``): each key holds what the join still needs
(whether the person is a local seller, with the fields the output takes, and the ids of the
auctions that came before their seller), so each pair is emitted once whichever side comes
first. A person outside the three states is remembered as such, so their auctions are not kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from bench.nexmark.queries import NexmarkInputs, Query
from jetwake.engine.pipeline.pipeline import Stage

STATES = ("OR", "ID", "CA")
CATEGORY = 10


def is_local_seller(person: Any) -> bool:
    """Whether a person is one q3 suggests items of: living in OR, ID or CA."""
    return person["state"] in STATES


def is_suggested_item(auction: Any) -> bool:
    """Whether an auction is one q3 suggests: of category 10."""
    return auction["category"] == CATEGORY


def suggestion(person: Any, auction_id: int, auction_time: int) -> dict:
    """One output record of q3; ``date_time`` is the newer of the person's and the auction's
    (the event it waited for: the benchmark's latency is measured from it)."""
    return {"name": person["name"], "city": person["city"], "state": person["state"],
            "id": auction_id, "date_time": max(person["date_time"], auction_time)}


def _person_key(event: Any) -> int:
    """The join key: the person id of a person, the seller of an auction."""
    return event["seller"] if "seller" in event else event["id"]


def _new_state() -> list:
    # [the person's output fields, False for a person outside the states, None before the
    # person came; [id, date_time] of the auctions that came before their seller]
    return [None, []]


def _join(state: list, key: int, event: Any) -> list | None:
    """The join step on one person id's state: a list of suggestions, or None."""
    if "seller" in event:  # an auction of category 10
        person = state[0]
        if person is None:
            state[1].append([event["id"], event["date_time"]])
            return None
        return [suggestion(person, event["id"], event["date_time"])] if person else None
    if not is_local_seller(event):
        state[0], state[1] = False, []
        return None
    state[0] = person = {"name": event["name"], "city": event["city"],
                         "state": event["state"], "date_time": event["date_time"]}
    waiting, state[1] = state[1], []
    return [suggestion(person, a, t) for a, t in waiting] or None


def build(inputs: NexmarkInputs) -> Stage:
    auctions = inputs.auctions().filter(is_suggested_item)
    return (inputs.persons().merge(auctions)
            .group_by(_person_key).map_stateful(_new_state, _join).set_name("q3-join")
            .flat_map(lambda suggestions: suggestions).set_name("q3-suggestions"))


def comparable(record: Any) -> Hashable:
    return (record["name"], record["city"], record["state"], record["id"],
            record["date_time"])


def reference(events: Sequence[tuple[str, Any]]) -> Counter:
    persons = {e["id"]: e for k, e in events if k == "person" and is_local_seller(e)}
    return Counter(comparable(suggestion(persons[e["seller"]], e["id"], e["date_time"]))
                   for k, e in events
                   if k == "auction" and is_suggested_item(e) and e["seller"] in persons)


QUERY = Query("q3", "local item suggestion", build, reference, comparable,
              reads=("person", "auction"))
