"""The winning bid of each auction when it closes: what q4 and q6 build on, in one place for
both queries' pipelines and both references.

The rule (Nexmark's ``WinningBids``): a bid may win its auction when its price is at least the
auction's reserve and its time lies within ``[auction date_time, expires]``; of those, the
highest price wins, the earliest bid among equal prices. An auction without such a bid has no
winner. An auction closes when the watermark passes its ``expires``; closed auctions are taken
in the order of ``(expires, auction id)``.

The pipeline, in event time, with keyed state only (so snapshots carry it, RocksDB included):

1. ``candidates``: auctions and bids merged and keyed by auction id, in a ``map_stateful`` that
   keeps the auction (and the bids that came before it) and emits each bid that may win and
   beats the best so far, as a *candidate*: the bid with its auction's seller, category and
   expiry. The state of an auction is dropped ``MAX_AUCTION_MS`` after its last event (a ttl).
2. ``closed_auctions``: the candidates in sliding windows of ``MAX_AUCTION_MS + CLOSE_MS``
   sliding by ``CLOSE_MS``, grouped by the query's key (category, seller), each window
   keeping the best candidate per auction. The window ending at ``end`` holds the whole life
   of every auction expiring in ``[end - CLOSE_MS, end)``, and is emitted when the watermark
   passes ``end``: those auctions are closed there, with their winner. The engine has no
   per-item timer, so the window's end is the clock, and the auctions close up to
   ``CLOSE_MS`` after their expiry.
3. The query's own keyed ``map_stateful`` takes each window's closed auctions
   (``closed_in``, in ``(expires, auction id)`` order); the windows of one key reach it in
   order of their end, so it sees that key's auctions in closing order, whatever the
   parallelism.

An auction longer than ``MAX_AUCTION_MS`` cannot be covered by one window: step 1 fails the job
on it, naming the auction and the constant to raise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bench.nexmark.queries import NexmarkInputs
from jetwake import AggregateOperation, WindowDefinition
from jetwake.engine.pipeline.pipeline import Stage

MAX_AUCTION_MS = 20_000
"""The longest auction (``expires - date_time``) the pipeline accepts."""

CLOSE_MS = 1_000
"""The closing resolution: an auction closes when the watermark passes the end of the
``CLOSE_MS`` slot its expiry lies in."""


# --- the rule --------------------------------------------------------------------------------

def may_win(auction: Any, bid: Any) -> bool:
    """Whether ``bid`` may win ``auction``: price at least the reserve, time within the
    auction's life."""
    return (bid["price"] >= auction["reserve"]
            and auction["date_time"] <= bid["date_time"] <= auction["expires"])


def beats(bid: Any, other: Any | None) -> bool:
    """Whether ``bid`` beats ``other`` (None: no bid yet): a higher price, or the same price
    earlier."""
    return other is None or bid["price"] > other["price"] or (
        bid["price"] == other["price"] and bid["date_time"] < other["date_time"])


def candidate(auction: Any, bid: Any) -> dict:
    """A bid that may win, with what the queries need of its auction."""
    return {"auction": auction["id"], "seller": auction["seller"],
            "category": auction["category"], "expires": auction["expires"],
            "price": bid["price"], "date_time": bid["date_time"]}


def closes_at(expires: int) -> int:
    """The event time an auction expiring at ``expires`` closes at: the end of its
    ``CLOSE_MS`` slot, which the watermark must pass (what a run whose input stops short
    of an auction's close, through Kafka, has not seen close)."""
    return expires - expires % CLOSE_MS + CLOSE_MS


def close_order(c: Any) -> tuple[int, int]:
    """The order closed auctions are taken in: by expiry, then auction id."""
    return c["expires"], c["auction"]


# --- the reference ---------------------------------------------------------------------------

def reference_winners(events: Sequence[tuple[str, Any]]) -> list[dict]:
    """The winning candidate of every auction in ``events`` that has one, in closing order."""
    auctions = {e["id"]: e for k, e in events if k == "auction"}
    best: dict[int, dict] = {}
    for k, bid in events:
        if k != "bid":
            continue
        auction = auctions.get(bid["auction"])
        if auction is None or not may_win(auction, bid):
            continue
        c = candidate(auction, bid)
        if beats(c, best.get(auction["id"])):
            best[auction["id"]] = c
    return sorted(best.values(), key=close_order)


# --- the pipeline ----------------------------------------------------------------------------

def _auction_key(event: Any) -> int:
    return event["auction"] if "auction" in event else event["id"]


def _new_state() -> list:
    # [the auction (None before it comes), the bids that came before it, the best candidate]
    return [None, [], None]


def _candidates_step(state: list, key: int, event: Any) -> list | None:
    """Keeps an auction and emits the candidates that beat the best so far."""
    if "auction" not in event:  # the auction
        if event["expires"] - event["date_time"] > MAX_AUCTION_MS:
            raise ValueError(
                f"winning bids: auction {event['id']} lasts {event['expires'] - event['date_time']}"
                f" ms, longer than MAX_AUCTION_MS ({MAX_AUCTION_MS} ms) that the closing window "
                f"covers; raise bench.nexmark.queries.winning_bids.MAX_AUCTION_MS")
        state[0] = {f: event[f] for f in ("id", "seller", "category", "reserve", "date_time",
                                          "expires")}
        waiting, state[1] = state[1], []
        return [c for c in (_offer(state, b) for b in waiting) if c is not None] or None
    if state[0] is None:
        state[1].append({"price": event["price"], "date_time": event["date_time"]})
        return None
    c = _offer(state, event)
    return [c] if c is not None else None


def _offer(state: list, bid: Any) -> dict | None:
    auction = state[0]
    if not may_win(auction, bid):
        return None
    c = candidate(auction, bid)
    if not beats(c, state[2]):
        return None
    state[2] = c
    return c


def candidates(inputs: NexmarkInputs) -> Stage:
    """The bids that may win and beat the best before them, with their auction's fields."""
    return (inputs.auctions().merge(inputs.bids())
            .group_by(_auction_key)
            .map_stateful(_new_state, _candidates_step, ttl=MAX_AUCTION_MS + CLOSE_MS)
            .set_name("winning-bid-candidates")
            .flat_map(lambda cs: cs).set_name("candidates"))


def _best_create() -> dict:
    return {}


def _best_add(acc: dict, c: Any) -> dict:
    if beats(c, acc.get(c["auction"])):
        acc[c["auction"]] = c
    return acc


def _best_combine(acc: dict, other: dict) -> dict:
    for c in other.values():
        _best_add(acc, c)
    return acc


BEST_PER_AUCTION = AggregateOperation(_best_create, _best_add, _best_combine,
                                      export=dict)
"""The best candidate of each auction (auction id -> candidate)."""


def closed_auctions(inputs: NexmarkInputs, key_fn: Callable[[Any], Any]) -> Stage:
    """Per ``key_fn(candidate)``, one window result per ``CLOSE_MS`` slot, holding the best
    candidates of the auctions alive in the window; ``closed_in`` takes the closed ones."""
    size = -(-MAX_AUCTION_MS // CLOSE_MS) * CLOSE_MS + CLOSE_MS  # a whole auction, and its slot
    return (candidates(inputs)
            .window(WindowDefinition.sliding(size, CLOSE_MS)).group_by(key_fn)
            .aggregate(BEST_PER_AUCTION).set_name("closed-auctions"))


def closed_in(result: Any) -> list[dict]:
    """The winners of the auctions a window result closes (those that close at its end), in
    closing order."""
    end = result.end
    return sorted((c for c in result.result.values() if closes_at(c["expires"]) == end),
                  key=close_order)
