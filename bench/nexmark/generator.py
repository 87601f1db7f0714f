"""A seeded NEXMark event generator (pure Python), shaped as the standard one (Apache Beam's
and the Flink nexmark repository's ``GeneratorConfig``, ``PersonGenerator``,
``AuctionGenerator`` and ``BidGenerator``).

- Of every 50 events, 1 is a person, 3 are auctions and 46 are bids, in that order within
  the group of 50 (event number ``n``: ``n % 50 == 0`` a person, ``1..3`` auctions, the rest
  bids). Person and auction ids start at 1000 and count up with their kind; the category of
  an auction is one of 10..14.
- Hot items: a bid is for a hot auction with probability 1 - 1/``hot_auction_ratio``
  (default 2, so half the bids), the hot one being the first auction of the newest batch of
  ``HOT_AUCTION_BATCH`` (100) auctions; likewise a bid's bidder is the second person of the
  newest batch of 100 people with probability 1 - 1/``hot_bidder_ratio`` (default 4), and
  an auction's seller the first person of that batch with probability
  1 - 1/``hot_seller_ratio`` (default 4). Otherwise the bid picks among the newest
  ``num_in_flight_auctions`` (100) auctions, and the bidder or seller among the newest
  ``num_active_people`` (1000) people, each plus a lead of 10 ids not generated yet (as the
  standard generator: such a bid may name an auction or person that appears a little later).
- Prices (initial bids, reserves over them, bids) are ``round(10 ** U(0, 6) * 100)`` cents.
- An auction expires 1 ms to twice the "horizon" after it starts, the horizon being the
  event time at which ``num_in_flight_auctions`` more auctions will have been made.
- Half the bids come through one of four hot channels with their fixed URL, the others
  through ``channel-N`` (N < 10,000).
- ``extra`` pads each record towards the standard average sizes (person 200, auction 500,
  bid 100 bytes, with the standard generator's +-20 % spread).
- Event time: event ``n`` happens at ``start_ms + n * 1000 / rate`` ms; with
  ``out_of_order_ms`` each event's ``date_time`` is moved back by a uniform 0 ..
  ``out_of_order_ms`` ms, so records arrive out of order by at most that much.

The same ``seed`` gives the same events.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Union

from bench.nexmark.events import Auction, Bid, Person

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
CATEGORIES = 5
PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
TOTAL_PROPORTION = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
# the probability of a hot choice is 1 - 1/ratio (the standard configuration's defaults)
HOT_AUCTION_RATIO, HOT_SELLER_RATIO, HOT_BIDDER_RATIO = 2, 4, 4
# the hot auction / seller / bidder is one of the newest batch of this many ids
HOT_AUCTION_BATCH = HOT_SELLER_BATCH = HOT_BIDDER_BATCH = 100
NUM_ACTIVE_PEOPLE = 1000
NUM_IN_FLIGHT_AUCTIONS = 100
PERSON_ID_LEAD = AUCTION_ID_LEAD = 10
AVG_PERSON_BYTES, AVG_AUCTION_BYTES, AVG_BID_BYTES = 200, 500, 100
HOT_CHANNELS_RATIO = 2
CHANNELS_NUMBER = 10_000
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
          "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
CHANNELS = HOT_CHANNELS  # the hot ones; the others are "channel-N"

Event = Union[Person, Auction, Bid]


@dataclass(frozen=True)
class GeneratorConfig:
    """How many events, how fast (events/s of event time), how disordered, which seed."""

    events: int
    rate: int = 10_000
    out_of_order_ms: int = 0
    seed: int = 0
    start_ms: int = 1_700_000_000_000

    def __post_init__(self) -> None:
        if self.events < 0:
            raise ValueError(f"GeneratorConfig: events must be >= 0, got {self.events}")
        if self.rate <= 0:
            raise ValueError(f"GeneratorConfig: rate must be > 0 events/s, got {self.rate}")
        if self.out_of_order_ms < 0:
            raise ValueError("GeneratorConfig: out_of_order_ms must be >= 0, got "
                             f"{self.out_of_order_ms}")

    def time_of(self, n: int) -> int:
        """The undisturbed event time (ms) of event number ``n``."""
        return self.start_ms + n * 1000 // self.rate


def kind_of(n: int) -> str:
    """The kind of event number ``n``: "person", "auction" or "bid"."""
    offset = n % TOTAL_PROPORTION
    if offset < PERSON_PROPORTION:
        return "person"
    return "auction" if offset < PERSON_PROPORTION + AUCTION_PROPORTION else "bid"


def last_person(n: int) -> int:
    """The base-0 id of the newest person at event ``n`` (this one, if it is a person)."""
    epoch, offset = divmod(n, TOTAL_PROPORTION)
    return epoch * PERSON_PROPORTION + min(offset, PERSON_PROPORTION - 1)


def last_auction(n: int) -> int:
    """The base-0 id of the newest auction at event ``n`` (this one, if it is an auction);
    -1 before the first."""
    epoch, offset = divmod(n, TOTAL_PROPORTION)
    if offset < PERSON_PROPORTION:
        return epoch * AUCTION_PROPORTION - 1
    return epoch * AUCTION_PROPORTION + min(offset - PERSON_PROPORTION, AUCTION_PROPORTION - 1)


def _some_person(n: int, rng: random.Random) -> int:
    """A base-0 person id among the active ones (plus the lead)."""
    people = last_person(n) + 1
    active = min(people, NUM_ACTIVE_PEOPLE)
    return people - active + rng.randrange(active + PERSON_ID_LEAD)


def _some_auction(n: int, rng: random.Random) -> int:
    """A base-0 auction id among those in flight (plus the lead)."""
    newest = max(last_auction(n), 0)
    low = max(newest - NUM_IN_FLIGHT_AUCTIONS, 0)
    return low + rng.randrange(newest - low + 1 + AUCTION_ID_LEAD)


def _price(rng: random.Random) -> int:
    return int(10.0 ** (rng.random() * 6.0) * 100.0 + 0.5)


class _Text:
    """Cheap seeded text: slices of one random pool of letters and spaces."""

    def __init__(self, rng: random.Random) -> None:
        alphabet = string.ascii_lowercase + " "
        self.pool = "".join(rng.choice(alphabet) for _ in range(4096))
        self.rng = rng

    def of(self, length: int) -> str:
        at = self.rng.randrange(len(self.pool) - length)
        return self.pool[at:at + length]

    def extra(self, current: int, average: int) -> str:
        """Padding towards ``average`` bytes with a +-20 % spread (the standard nextExtra)."""
        if current > average:
            return ""
        want = average - current
        delta = round(want * 0.2)
        size = want - delta + (self.rng.randrange(2 * delta) if delta else 0)
        return self.of(size)


def generate(config: GeneratorConfig) -> Iterator[tuple[str, Event]]:
    """Yield (kind, record) pairs, kind one of "person", "auction", "bid"."""
    rng = random.Random(config.seed)
    text = _Text(rng)
    hot_urls = [f"https://www.nexmark.com/{text.of(5)}/{text.of(5)}/item.htm?query=1"
                for _ in HOT_CHANNELS]
    # the horizon: event time until num_in_flight_auctions more auctions exist
    horizon_events = NUM_IN_FLIGHT_AUCTIONS * TOTAL_PROPORTION // AUCTION_PROPORTION
    for n in range(config.events):
        at = config.time_of(n)
        if config.out_of_order_ms:
            at -= rng.randint(0, config.out_of_order_ms)
        kind = kind_of(n)
        if kind == "person":
            pid = FIRST_PERSON_ID + last_person(n)
            name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
            email = f"{text.of(7)}@{text.of(5)}.com"
            card = " ".join(f"{rng.randrange(10_000):04d}" for _ in range(4))
            city, state = rng.choice(CITIES), rng.choice(STATES)
            size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
            yield "person", Person(id=pid, name=name, email=email, credit_card=card, city=city,
                                   state=state, date_time=at,
                                   extra=text.extra(size, AVG_PERSON_BYTES))
        elif kind == "auction":
            aid = FIRST_AUCTION_ID + last_auction(n)
            if rng.randrange(HOT_SELLER_RATIO) > 0:
                seller = last_person(n) // HOT_SELLER_BATCH * HOT_SELLER_BATCH
            else:
                seller = _some_person(n, rng)
            category = FIRST_CATEGORY_ID + rng.randrange(CATEGORIES)
            initial = _price(rng)
            horizon = config.time_of(n + horizon_events) - config.time_of(n)
            expires = at + 1 + rng.randrange(max(horizon * 2, 1))
            item = text.of(1 + rng.randrange(20))
            description = text.of(1 + rng.randrange(100))
            reserve = initial + _price(rng)
            size = 8 + len(item) + len(description) + 40
            yield "auction", Auction(id=aid, item_name=item, description=description,
                                     initial_bid=initial, reserve=reserve, date_time=at,
                                     expires=expires, seller=FIRST_PERSON_ID + seller,
                                     category=category,
                                     extra=text.extra(size, AVG_AUCTION_BYTES))
        else:
            if rng.randrange(HOT_AUCTION_RATIO) > 0:
                auction = max(last_auction(n), 0) // HOT_AUCTION_BATCH * HOT_AUCTION_BATCH
            else:
                auction = _some_auction(n, rng)
            if rng.randrange(HOT_BIDDER_RATIO) > 0:
                bidder = last_person(n) // HOT_BIDDER_BATCH * HOT_BIDDER_BATCH + 1
            else:
                bidder = _some_person(n, rng)
            price = _price(rng)
            if rng.randrange(HOT_CHANNELS_RATIO) > 0:
                i = rng.randrange(len(HOT_CHANNELS))
                channel, url = HOT_CHANNELS[i], hot_urls[i]
            else:
                c = rng.randrange(CHANNELS_NUMBER)
                channel = f"channel-{c}"
                url = f"https://www.nexmark.com/item.htm?query=1&channel_id={c}"
            yield "bid", Bid(auction=FIRST_AUCTION_ID + auction,
                             bidder=FIRST_PERSON_ID + bidder, price=price, channel=channel,
                             url=url, date_time=at, extra=text.extra(32, AVG_BID_BYTES))
