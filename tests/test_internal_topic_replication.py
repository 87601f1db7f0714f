"""The topics a cluster keeps in Kafka (control, records, snapshot data, maps, lists) take as
many replicas as the brokers allow (3 on three brokers) with min.insync.replicas 2, or what the
member's ``internal_topic_replication`` says; a member warns when they have a single replica,
and a setting it cannot use fails with a clear message."""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from jetwake import Member
from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.server.cli.main import main
from support.cluster_processes import ClusterProcesses
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _internal_topics(admin: AdminClient, cluster: str) -> dict:
    md = admin.list_topics(timeout=10)
    return {name: t for name, t in md.topics.items() if name.startswith(f"__jetwake_{cluster}_")}


def _min_insync(admin: AdminClient, topic: str) -> str:
    """The topic's min.insync.replicas, asked again while the broker asked does not know the
    topic yet (a topic created through another broker reaches each one a moment later)."""
    resource = ConfigResource(ResourceType.TOPIC, topic)

    def ask() -> str | None:
        try:
            return admin.describe_configs([resource])[resource].result(30)[
                "min.insync.replicas"].value
        except KafkaException as e:
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            return None
    return wait_until(ask, what=f"{topic}'s configuration from every broker", interval=0.1)


def test_on_three_brokers_a_members_internal_topics_have_three_replicas_and_min_insync_two(
        kafka_three_brokers, tmp_path):
    cluster = f"r{uuid.uuid4().hex[:10]}"
    with Member(tmp_path / "m", cluster=cluster,
                kafka_bootstrap_servers=kafka_three_brokers.bootstrap) as member:
        member.get_map("totals").put("k", 1)
        member.get_list("events")  # a list's topic
    admin = AdminClient({"bootstrap.servers": kafka_three_brokers.bootstrap})
    expected = sorted(f"__jetwake_{cluster}_{kind}" for kind in (
        "control", "records", "snapshot_data", "map_totals", "list_events"))
    # a broker's metadata shows a topic created through another one a moment later
    topics = wait_until(lambda: (t := _internal_topics(admin, cluster)) and sorted(t) == expected
                        and t, what=lambda: f"the topics {expected} in the metadata")
    replicas = {name: {len(p.replicas) for p in t.partitions.values()}
                for name, t in topics.items()}
    assert replicas == {name: {3} for name in topics}
    data_topics = [n for n in topics if not n.endswith("_control")]  # no data of its own
    assert {n: _min_insync(admin, n) for n in data_topics} == {n: "2" for n in data_topics}


def test_a_member_warns_naming_its_topics_when_they_have_a_single_replica(
        kafka_three_brokers, tmp_path, caplog):
    cluster = f"r{uuid.uuid4().hex[:10]}"
    with caplog.at_level(logging.WARNING, logger="jetwake.cluster"):
        with Member(tmp_path / "m", cluster=cluster, internal_topic_replication=1,
                    kafka_bootstrap_servers=kafka_three_brokers.bootstrap):
            pass
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "single replica" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    for kind in ("control", "records", "snapshot_data"):
        assert f"__jetwake_{cluster}_{kind}" in warnings[0]
    assert "internal_topic_replication=3" in warnings[0]


def test_three_replicas_raise_no_warning(kafka_three_brokers, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="jetwake.cluster"):
        with Member(tmp_path / "m", cluster=f"r{uuid.uuid4().hex[:10]}",
                    kafka_bootstrap_servers=kafka_three_brokers.bootstrap):
            pass
    assert "single replica" not in caplog.text


@pytest.mark.parametrize("bad", [0, -1, True, "3", 2.0])
def test_an_internal_topic_replication_that_is_not_a_positive_int_is_refused(bad, tmp_path):
    with pytest.raises(ValueError, match=r"internal_topic_replication must be an int >= 1"):
        Member(tmp_path / "m", cluster="c", kafka_bootstrap_servers="127.0.0.1:1",
               internal_topic_replication=bad)


def test_more_replicas_than_brokers_fail_the_start_naming_the_broker_count(
        kafka_three_brokers, tmp_path):
    with pytest.raises(JetwakeError, match=r"internal_topic_replication=4, but the Kafka "
                                           r"cluster has 3 broker\(s\): set "
                                           r"internal_topic_replication to at most 3"):
        Member(tmp_path / "m", cluster=f"r{uuid.uuid4().hex[:10]}",
               kafka_bootstrap_servers=kafka_three_brokers.bootstrap,
               internal_topic_replication=4)
    # the failed start left nothing locked: a member starts on the same directory
    Member(tmp_path / "m").shutdown()


def test_internal_topic_replication_is_for_a_member_of_a_cluster(tmp_path):
    with pytest.raises(ValueError, match="for a member of a cluster: give cluster='NAME'"):
        Member(tmp_path / "m", internal_topic_replication=3)


def test_the_cli_refuses_an_internal_topic_replication_below_one(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["member", "start", "--internal-topic-replication", "0"])
    assert exit_.value.code == 2
    assert "--internal-topic-replication: expected a whole number >= 1, got '0'" \
        in capsys.readouterr().err


def test_member_start_takes_internal_topic_replication_from_the_command_line(
        kafka_three_brokers, tmp_path):
    cluster = ClusterProcesses(tmp_path, kafka_three_brokers.bootstrap)
    try:
        member = cluster.start_member("--internal-topic-replication", "1")
        wait_until(lambda: "ready: clients connect to" in member.log, timeout=60,
                   what=lambda: f"the member serving:\n{member.log}")
        admin = AdminClient({"bootstrap.servers": kafka_three_brokers.bootstrap})
        records = f"__jetwake_{cluster.name}_records"
        topic = wait_until(lambda: _internal_topics(admin, cluster.name).get(records),
                           what=f"the topic {records} in the metadata")
        assert [len(p.replicas) for p in topic.partitions.values()] == [1]
        assert "have a single replica" in member.log
    finally:
        cluster.stop_all()
