"""A seeded NEXMark event generator (pure Python; writing to Kafka comes later).

Follows the standard generator's shape: of every 50 events, 1 is a person,
3 are auctions and 46 are bids; person and auction ids start at 1000; bids
favour hot auctions and hot bidders, auctions favour hot sellers (ratios as
in the reference generator). Event times are spaced by the configured rate
and shuffled within `out_of_order_ms`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Union

from bench.nexmark.events import Auction, Bid, Person

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
TOTAL_PROPORTION = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
HOT_AUCTION_RATIO, HOT_SELLER_RATIO, HOT_BIDDER_RATIO = 2, 4, 4
STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne")
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
CATEGORIES = 5

Event = Union[Person, Auction, Bid]


@dataclass(frozen=True)
class GeneratorConfig:
    """How many events, how fast (events/s of event time), how disordered, which seed."""

    events: int
    rate: int = 10_000
    out_of_order_ms: int = 0
    seed: int = 0
    start_ms: int = 1_700_000_000_000


def generate(config: GeneratorConfig) -> Iterator[tuple[str, Event]]:
    """Yield (kind, record) pairs, kind one of "person", "auction", "bid"."""
    rng = random.Random(config.seed)
    spacing = 1000.0 / config.rate
    for n in range(config.events):
        epoch, offset = divmod(n, TOTAL_PROPORTION)
        at = config.start_ms + int(n * spacing)
        if config.out_of_order_ms:
            at -= rng.randint(0, config.out_of_order_ms)
        persons = epoch * PERSON_PROPORTION + min(offset, PERSON_PROPORTION)
        auctions = epoch * AUCTION_PROPORTION + max(0, min(offset - PERSON_PROPORTION, AUCTION_PROPORTION))
        if offset < PERSON_PROPORTION:
            pid = FIRST_PERSON_ID + persons
            yield "person", Person(
                id=pid, name=f"p{pid}", email=f"p{pid}@example.com",
                credit_card=" ".join(f"{rng.randint(0, 9999):04d}" for _ in range(4)),
                city=rng.choice(CITIES), state=rng.choice(STATES), date_time=at, extra="")
        elif offset < PERSON_PROPORTION + AUCTION_PROPORTION:
            aid = FIRST_AUCTION_ID + auctions
            last_person = FIRST_PERSON_ID + max(persons - 1, 0)
            seller = (last_person // HOT_SELLER_RATIO) * HOT_SELLER_RATIO if rng.randrange(HOT_SELLER_RATIO) else rng.randint(FIRST_PERSON_ID, last_person)
            initial = rng.randint(1, 1000)
            yield "auction", Auction(
                id=aid, item_name=f"item{aid}", description="", initial_bid=initial,
                reserve=initial + rng.randint(1, 1000), date_time=at,
                expires=at + rng.randint(1_000, 20_000), seller=max(seller, FIRST_PERSON_ID),
                category=10 + rng.randrange(CATEGORIES), extra="")
        else:
            last_auction = FIRST_AUCTION_ID + max(auctions - 1, 0)
            last_person = FIRST_PERSON_ID + max(persons - 1, 0)
            auction = (last_auction // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO if rng.randrange(HOT_AUCTION_RATIO) else rng.randint(FIRST_AUCTION_ID, last_auction)
            bidder = (last_person // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1 if rng.randrange(HOT_BIDDER_RATIO) else rng.randint(FIRST_PERSON_ID, last_person)
            yield "bid", Bid(
                auction=max(auction, FIRST_AUCTION_ID), bidder=max(bidder, FIRST_PERSON_ID),
                price=rng.randint(1, 10_000), channel=rng.choice(CHANNELS),
                url=f"https://example.com/{auction}", date_time=at, extra="")
