"""The cluster's records live in a compacted Kafka topic: the coordinator writes them in fenced
transactions, any member reads the latest value of every key, large values are chunked
transparently, and what was written outlives its writer."""

from __future__ import annotations

import os
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from support.waiting import wait_until

from jetwake.engine.cluster.cluster_records import CHUNK_SIZE, ClusterRecords, records_topic
from jetwake.engine.cluster.membership import FencedError
from jetwake.engine.core.errors import JetwakeError

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


@pytest.fixture
def cluster(kafka_bootstrap):
    """A fresh cluster name and a factory of ClusterRecords on it (topic ensured), all closed
    afterwards and the topic deleted."""
    name = f"t{uuid.uuid4().hex[:10]}"
    made: list[ClusterRecords] = []

    def records() -> ClusterRecords:
        r = ClusterRecords(kafka_bootstrap, name)
        r.ensure_topic()
        made.append(r)
        return r

    records.name = name
    records.bootstrap = kafka_bootstrap
    yield records
    for r in made:
        r.close()
    try:
        AdminClient({"bootstrap.servers": kafka_bootstrap}).delete_topics(
            [records_topic(name)])[records_topic(name)].result(30)
    except Exception:  # noqa: BLE001 - cleanup only
        pass


def test_put_many_and_read_all_round_trip_many_keys(cluster):
    writer = cluster()
    writer.open_writer()
    items = [(f"job/{i}", f"record {i}".encode()) for i in range(200)]
    writer.put_many(items)
    assert writer.read_all() == dict(items)


def test_the_latest_value_wins_and_a_tombstone_removes_the_key(cluster):
    writer = cluster()
    writer.open_writer()
    writer.put_many([("job/1", b"starting"), ("job/2", b"running"), ("job/3", b"x")])
    writer.put_many([("job/1", b"running"), ("job/3", None)])
    writer.put("job/2", b"completed")
    assert writer.read_all() == {"job/1": b"running", "job/2": b"completed"}


def test_the_last_value_of_a_key_repeated_in_one_call_wins(cluster):
    writer = cluster()
    writer.open_writer()
    writer.put_many([("k", b"first"), ("k", b"second")])
    assert writer.read_all() == {"k": b"second"}


def test_a_value_larger_than_a_kafka_message_round_trips_in_chunks(cluster):
    writer = cluster()
    writer.open_writer()
    big = os.urandom(5 * 1024 * 1024)
    writer.put_many([("definition/1", big), ("job/1", b"small")])
    assert writer.read_all() == {"definition/1": big, "job/1": b"small"}
    # in the topic it is several records, none larger than a chunk
    assert max(len(v) for v in _raw_records(cluster).values() if v) <= CHUNK_SIZE


def test_a_chunked_value_replaced_by_a_smaller_one_leaves_no_chunks_behind(cluster):
    writer = cluster()
    writer.open_writer()
    writer.put("definition/1", os.urandom(3 * CHUNK_SIZE + 10))
    writer.put("definition/1", b"small now")
    writer.put("definition/2", os.urandom(2 * CHUNK_SIZE))
    writer.put("definition/2", None)
    assert writer.read_all() == {"definition/1": b"small now"}
    assert {k for k, v in _raw_records(cluster).items() if v is not None} == {"definition/1"}


def test_a_new_writer_removes_the_chunks_of_the_values_its_predecessor_wrote(cluster):
    first = cluster()
    first.open_writer()
    first.put("definition/1", os.urandom(2 * CHUNK_SIZE + 1))
    second = cluster()
    second.open_writer()
    second.put("definition/1", None)
    assert second.read_all() == {}
    assert {k for k, v in _raw_records(cluster).items() if v is not None} == set()


def test_a_deposed_writer_is_fenced_and_its_write_is_never_visible(cluster):
    old = cluster()
    old.open_writer()
    old.put("job/1", b"from the old coordinator")
    new = cluster()
    new.open_writer()  # a newer coordinator takes over
    with pytest.raises(FencedError, match="no longer the coordinator"):
        old.put_many([("job/1", b"late write"), ("job/2", os.urandom(2 * CHUNK_SIZE))])
    new.put("job/3", b"from the new coordinator")
    expected = {"job/1": b"from the old coordinator", "job/3": b"from the new coordinator"}
    assert new.read_all() == expected
    assert old.read_all() == expected
    assert cluster().read_all() == expected


def test_a_reader_made_after_its_writer_closed_sees_everything(cluster):
    writer = cluster()
    writer.open_writer()
    big = os.urandom(2 * CHUNK_SIZE + 5)
    writer.put_many([("job/1", b"a"), ("definition/1", big), ("gone", b"x")])
    writer.put("gone", None)
    writer.close()
    assert cluster().read_all() == {"job/1": b"a", "definition/1": big}


def test_a_reader_catches_up_with_what_was_written_since_its_last_read(cluster):
    writer = cluster()
    writer.open_writer()
    reader = cluster()
    writer.put("job/1", b"one")
    # a commit becomes visible to other readers a moment after it returns
    wait_until(lambda: reader.read_all() == {"job/1": b"one"}, what="the first write", timeout=10)
    writer.put_many([("job/2", b"two"), ("job/1", None)])
    wait_until(lambda: reader.read_all() == {"job/2": b"two"}, what="the second write", timeout=10)
    assert reader.read_all() == {"job/2": b"two"}  # nothing new: returns at once, same answer


def test_an_empty_topic_reads_as_no_records(cluster):
    assert cluster().read_all() == {}


def test_the_topic_is_compacted_with_one_partition(cluster):
    cluster()
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = records_topic(cluster.name)
    assert len(admin.list_topics(topic=topic, timeout=10).topics[topic].partitions) == 1
    resource = ConfigResource(ResourceType.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(10)
    assert config["cleanup.policy"].value == "compact"
    assert int(config["max.message.bytes"].value) > CHUNK_SIZE


@pytest.fixture
def existing_records_topic(kafka_bootstrap):
    """Makes a cluster's records topic as someone else made it: (partitions, config) -> the
    cluster's name; deleted afterwards."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    made: list[str] = []

    def make(partitions: int, config: dict[str, str]) -> str:
        name = f"t{uuid.uuid4().hex[:10]}"
        topic = records_topic(name)
        admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(30)
        made.append(topic)
        return name

    yield make
    if made:
        for future in admin.delete_topics(made).values():
            try:
                future.result(30)
            except Exception:  # noqa: BLE001 - cleanup only
                pass


def test_an_existing_topic_that_deletes_by_age_is_refused_naming_the_fix(
        kafka_bootstrap, existing_records_topic):
    name = existing_records_topic(1, {"cleanup.policy": "delete"})
    with ClusterRecords(kafka_bootstrap, name) as records:
        with pytest.raises(JetwakeError, match="cleanup.policy=delete.*must be 'compact'"):
            records.ensure_topic()


def test_an_existing_topic_with_several_partitions_is_refused(kafka_bootstrap,
                                                              existing_records_topic):
    name = existing_records_topic(3, {"cleanup.policy": "compact"})
    with ClusterRecords(kafka_bootstrap, name) as records:
        with pytest.raises(JetwakeError, match="has 3 partitions; it must have exactly 1"):
            records.ensure_topic()


def test_writing_without_open_writer_is_refused_naming_the_fix(cluster):
    with pytest.raises(JetwakeError, match="open_writer"):
        cluster().put("job/1", b"x")


@pytest.mark.parametrize("items, match", [
    ([("", b"x")], "non-empty string"),
    ([("a\x00b", b"x")], "NUL"),
    ([("job/1", "text")], "bytes or None"),
    ([("job/1",)], r"\(key, value\) pairs"),
    ("job/1", "list of"),
])
def test_bad_items_are_refused_naming_the_problem(cluster, items, match):
    writer = cluster()
    writer.open_writer()
    with pytest.raises(ValueError, match=match):
        writer.put_many(items)


def test_bad_arguments_are_refused(kafka_bootstrap):
    with pytest.raises(ValueError, match="bootstrap servers"):
        ClusterRecords("", "c")
    with pytest.raises(ValueError, match="cluster name"):
        ClusterRecords(kafka_bootstrap, "no spaces")


def _raw_records(cluster) -> dict[str, bytes | None]:
    """The latest raw record of every key in the cluster's records topic, read committed."""
    topic = records_topic(cluster.name)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10,
                                                cached=False)
        consumer.assign([TopicPartition(topic, 0, 0)])
        latest: dict[str, bytes | None] = {}
        reached = 0

        def at_the_end() -> bool:
            nonlocal reached
            if reached >= end:
                return True
            m = consumer.poll(0.5)
            if m is not None and m.error() is not None:
                reached = max(reached, m.offset())
            elif m is not None:
                reached = m.offset() + 1
                latest[m.key().decode()] = m.value()
            return reached >= end
        wait_until(at_the_end, timeout=30, interval=0, what=f"reading {topic} to offset {end}")
        return latest
    finally:
        consumer.close()
