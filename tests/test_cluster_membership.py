"""Cluster membership and the coordinator come from Kafka's group protocol: exactly one member
holds the control partition and is the coordinator; when it leaves, another takes over; a
deposed coordinator's writes are fenced."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer

from jetwake.engine.cluster.membership import (
    CoordinatorFence, FencedError, KafkaMembership, group_id,
)
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


@pytest.fixture
def cluster(kafka_bootstrap):
    """A fresh cluster name and a factory of started members, all stopped afterwards."""
    name = f"t{uuid.uuid4().hex[:10]}"
    started: list[KafkaMembership] = []

    def member(member_id: str) -> KafkaMembership:
        m = KafkaMembership(kafka_bootstrap, name, member_id, f"127.0.0.1:{5700 + len(started)}",
                            session_timeout_ms=6000)
        m.start()
        started.append(m)
        return m

    member.name = name
    member.bootstrap = kafka_bootstrap
    yield member
    for m in started:
        m.stop()


def _coordinators(members: list[KafkaMembership]) -> list[str]:
    return [m.member_id for m in members if m.is_coordinator]


def test_exactly_one_member_is_the_coordinator(cluster):
    members = [cluster(f"m{i}") for i in range(3)]
    wait_until(lambda: len(_coordinators(members)) == 1, what="one coordinator")
    wait_until(lambda: len(members[0].members()) == 3, what="three members in the group")
    view = members[0].members()
    assert sorted(i.id for i in view) == ["m0", "m1", "m2"]
    assert [i.id for i in view if i.is_coordinator] == _coordinators(members)
    assert {i.address for i in view} == {m.address for m in members}


def test_when_the_coordinator_leaves_another_member_takes_over(cluster):
    members = [cluster(f"m{i}") for i in range(3)]
    wait_until(lambda: len(_coordinators(members)) == 1, what="one coordinator")
    first = next(m for m in members if m.is_coordinator)
    first.stop()
    rest = [m for m in members if m is not first]
    wait_until(lambda: len(_coordinators(rest)) == 1, what="a new coordinator", timeout=30)
    assert first.member_id not in _coordinators(rest)
    wait_until(lambda: len(rest[0].members()) == 2, what="the group without the one that left")


def test_a_deposed_coordinator_can_write_nothing(cluster, kafka_topic):
    topic = kafka_topic()
    old = CoordinatorFence(cluster.bootstrap, cluster.name)
    old.write([(topic, b"k", b"from the old coordinator")])
    new = CoordinatorFence(cluster.bootstrap, cluster.name)  # a newer coordinator takes over
    with pytest.raises(FencedError, match="no longer the coordinator"):
        old.write([(topic, b"k", b"late write of the old coordinator")])
    new.write([(topic, b"k", b"from the new coordinator")])
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    seen: list[bytes] = []
    try:
        wait_until(lambda: seen.extend(m.value() for m in consumer.consume(10, timeout=0.5)
                                       if m.error() is None) or len(seen) >= 2,
                   what="the committed records")
    finally:
        consumer.close()
    assert seen == [b"from the old coordinator", b"from the new coordinator"]
    old.close()
    new.close()


def test_a_fenced_write_tells_its_member_before_failing(cluster, kafka_topic):
    topic = kafka_topic()
    told: list[str] = []
    old = CoordinatorFence(cluster.bootstrap, cluster.name, on_fenced=told.append)
    new = CoordinatorFence(cluster.bootstrap, cluster.name)
    with pytest.raises(FencedError):
        old.write([(topic, b"k", b"late")])
    assert len(told) == 1 and "no longer the coordinator" in told[0]
    old.close()
    new.close()


def test_a_deposed_coordinator_steps_down_and_rejoins_as_the_youngest(cluster):
    # two members both believing they coordinate (seen after a simultaneous start under load):
    # the one fenced by the other gives the role up, whatever the group last told it
    members = [cluster(f"m{i}") for i in range(2)]
    wait_until(lambda: len(_coordinators(members)) == 1, what="one coordinator")
    wait_until(lambda: len(members[0].members()) == 2, what="two members in the group")
    first = next(m for m in members if m.is_coordinator)
    other = next(m for m in members if m is not first)
    first.deposed("fenced by a newer coordinator (test)")
    assert not first.is_coordinator
    wait_until(lambda: other.is_coordinator, what="the other member coordinating", timeout=30)
    wait_until(lambda: {i.id for i in other.members()} == {"m0", "m1"},
               what="the deposed member back in the group", timeout=30)
    assert not first.is_coordinator  # it joined as the youngest: no role by age


def test_a_bad_cluster_name_is_refused_naming_the_rule(kafka_bootstrap):
    with pytest.raises(ValueError, match="cluster name"):
        KafkaMembership(kafka_bootstrap, "no spaces allowed", "m0", "127.0.0.1:1")


def test_the_group_is_named_after_the_cluster():
    assert group_id("prod") == "jetwake-prod"
