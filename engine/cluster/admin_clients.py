"""A long-lived Kafka admin client that is replaced when it stops getting answers.

After the brokers were killed and started again, librdkafka's admin client of a member went on
failing for minutes: the group description timed out at every call, and a partition's offsets
were refused with "leader epoch is older than broker epoch" (it asked with what it knew before),
while a new client got its answers at once. A member whose every call to the group times out
cannot start its share of a job, so the cluster's job stayed down. The member's long-lived
users (the membership's control topic, the cluster records' end offsets) therefore ask
through :class:`RenewableAdmin` and, on such a failure, have the next question go through a
new client.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from jetwake.connectors.kafka.client_log import with_client_log

__all__ = ["RenewableAdmin"]

# answers that mean the client's own view is stale, not that Kafka is away
_STALE = {KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
          KafkaError.NOT_LEADER_FOR_PARTITION}
# at most one new client per this many seconds: every call times out while Kafka is away, and
# each replaced client stays referenced for the member's life (a client destroyed with a
# request in flight never completes it). The "eonce->refcnt > 0" aborts once blamed on
# dropping clients came from librdkafka's group calls of the admin client (a use-after-free
# when the group's coordinator broker is lost mid-call, librdkafka #4605): no member asks them
# through an admin client any more (group_leave.describe_group).
_RENEW_AT_MOST_EVERY_S = 15.0


class RenewableAdmin:
    """One admin client for ``bootstrap_servers`` (see the module doc)."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._lock = threading.Lock()
        self._client: AdminClient | None = None
        # replaced clients, kept referenced (never destroyed): a client dropped while a
        # request of another thread is in flight never completes that request
        self._retired: list[AdminClient] = []
        self._renewed_at = 0.0

    def get(self) -> AdminClient:
        with self._lock:
            if self._client is None:
                self._client = AdminClient(with_client_log(
                    {"bootstrap.servers": self.bootstrap_servers}))
            return self._client

    def failed(self, client: AdminClient, error: BaseException) -> None:
        """``client`` (from :meth:`get`) failed with ``error``: after a time-out or a stale
        view the next :meth:`get` makes a new client."""
        timed_out = isinstance(error, (concurrent.futures.TimeoutError, TimeoutError))
        stale = isinstance(error, KafkaException) and error.args \
            and isinstance(error.args[0], KafkaError) and error.args[0].code() in _STALE
        if not (timed_out or stale):
            return
        with self._lock:
            now = time.monotonic()
            if self._client is client and now - self._renewed_at >= _RENEW_AT_MOST_EVERY_S:
                self._retired.append(client)
                self._client = None
                self._renewed_at = now
