"""The queries' constants, in one place for jetwake's queries (``bench/nexmark/queries/``)
and the peers' (``peers.py``, run in venvs without jetwake, so this module imports nothing)."""

EURO_MILLS = 908                         # q1: 0.908 euros to the dollar, exactly
AUCTION_MODULUS = 123                    # q2: the bids of auctions whose id % 123 == 0
Q5_SIZE_MS, Q5_SLIDE_MS = 10_000, 2_000  # q5: sliding windows of 10 s every 2 s
Q7_SIZE_MS = 10_000                      # q7: tumbling windows of 10 s
Q11_GAP_MS = 10_000                      # q11: sessions end after 10 s without a bid
