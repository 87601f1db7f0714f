"""The two pieces of the fast coordinator failover, each on its own: Kafka removes a group's
consumer named by its member id at once (LeaveGroup on its behalf), and a peer address counts
as dead only when nothing listens there (a listener that does not accept, like a paused
process's, does not count)."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from jetwake.engine.cluster.membership import KafkaMembership
from jetwake.engine.cluster.peer_link import nothing_listens
from support.ports import free_port
from support.waiting import wait_until


@contextmanager
def two_members(bootstrap: str) -> Iterator[tuple[KafkaMembership, KafkaMembership, Any]]:
    """m1 (the coordinator: it joined first) and m2 in a new cluster's group, both seen by m2,
    with m1's consumer as m2 finds it (the membership's coordinator_consumer)."""
    name = f"t{uuid.uuid4().hex[:10]}"
    first = KafkaMembership(bootstrap, name, "m1", "127.0.0.1:5701", session_timeout_ms=6000)
    first.start()
    second = KafkaMembership(bootstrap, name, "m2", "127.0.0.1:5702", session_timeout_ms=6000)
    try:
        second.start()
        wait_until(lambda: len(second.members()) == 2, what="two members", timeout=30,
                   interval=0.1)
        found = second.coordinator_consumer()
        assert found is not None and found[0].id == "m1"
        yield first, second, found
    finally:
        second.stop()
        first.stop()


@pytest.mark.integration
@pytest.mark.kafka
def test_a_removed_coordinator_consumer_hands_the_coordinator_over_before_the_session_timeout(
        kafka_bootstrap: str) -> None:
    with two_members(kafka_bootstrap) as (first, second, found):
        removed_at = time.monotonic()
        assert second.remove_dead_consumer(found[1]) is True
        wait_until(lambda: second.is_coordinator, what="m2 to coordinate", timeout=30,
                   interval=0.05)
        assert time.monotonic() - removed_at < 6.0, "it waited for the session timeout"
        assert second.remove_dead_consumer(found[1]) is False  # gone already


def test_an_address_where_nothing_listens_counts_as_dead() -> None:
    assert nothing_listens(f"127.0.0.1:{free_port()}")


def test_a_listener_that_does_not_accept_like_a_paused_process_does_not_count_as_dead() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:  # never accept()s
        assert not nothing_listens("127.0.0.1:%d" % listener.getsockname()[1])


@pytest.mark.integration
@pytest.mark.kafka
def test_a_live_member_the_group_expelled_joins_again_as_the_youngest_and_does_not_coordinate(
        kafka_bootstrap: str) -> None:
    with two_members(kafka_bootstrap) as (first, second, found):
        assert second.remove_dead_consumer(found[1]) is True  # m1's process is alive
        wait_until(lambda: [(m.id, m.is_coordinator) for m in second.members()]
                   == [("m2", True), ("m1", False)],
                   what="m1 back in the group, m2 coordinating", timeout=30, interval=0.1)
        assert not first.is_coordinator


def test_an_unspecified_host_never_counts_as_dead() -> None:
    # connecting to 0.0.0.0 reaches this machine, whatever the member's own is
    assert not nothing_listens(f"0.0.0.0:{free_port()}")
