"""The three NEXMark event kinds as JSON records, with the standard fields.

Records are plain dicts (the Kafka JSON format reads and writes them as is);
these TypedDicts name the fields so the generator, queries and references agree.
Times (`date_time`, `expires`) are epoch milliseconds.
"""

from __future__ import annotations

from typing import TypedDict

PERSON_TOPIC = "nexmark-person"
AUCTION_TOPIC = "nexmark-auction"
BID_TOPIC = "nexmark-bid"
# a record holding this field is no event but the end of the input (see
# bench/nexmark/kafka_input.py): readers drop it, after its event time moved their watermark
END_MARKER_FIELD = "end_of_input"


class Person(TypedDict):
    """A new user of the auction site."""

    id: int
    name: str
    email: str
    credit_card: str
    city: str
    state: str
    date_time: int
    extra: str


class Auction(TypedDict):
    """An item put up for auction by a seller (a person id)."""

    id: int
    item_name: str
    description: str
    initial_bid: int
    reserve: int
    date_time: int
    expires: int
    seller: int
    category: int
    extra: str


class Bid(TypedDict):
    """A bid by a bidder (a person id) on an auction (an auction id)."""

    auction: int
    bidder: int
    price: int
    channel: str
    url: str
    date_time: int
    extra: str
