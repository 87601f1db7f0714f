"""The producer every test writes its input with when the expected output depends on the
records' order in a partition (running sums, event times, "the last value wins", an offset
named in an error).

A plain producer may reorder a partition's records: when a produce request fails with a
retriable error (a broker that a loaded machine fenced for a moment answers "not the leader"),
librdkafka puts its records back in the queue, and a request that left after it may already
have been written (librdkafka keeps the order across retries only with one request in flight,
or with idempotence). A running-sums test failed once on a loaded machine with the signature
of such a reorder: a key's sums in the table started at one of its later values, as if the
key's first records came after it, and none of the earlier sums was there. An idempotent
producer keeps each partition's order across retries and writes no record twice; its start
costs a round trip to the broker (about 0.1-0.5 s).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

__all__ = ["ordered_producer"]


def ordered_producer(bootstrap: str, settings: dict[str, Any] | None = None) -> Producer:
    """An idempotent producer to ``bootstrap``; ``settings``: further librdkafka properties
    (``{"linger.ms": 5}``)."""
    return Producer({"bootstrap.servers": bootstrap, **(settings or {}),
                     "enable.idempotence": True})
