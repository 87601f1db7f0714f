"""The cluster's maps and lists live in Kafka: two ClusterMaps instances (two members) see each
other's writes as soon as a write returns, the map's topic is its event journal (replayable
from a saved sequence, with what compaction removed counted as lost), and a map or list
outlives the instance that wrote it. Real broker, no mocks."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from jetwake.engine.cluster.cluster_maps import ClusterMaps, list_topic, map_topic
from jetwake.engine.core.partitioning import partition_of
from jetwake.engine.core.serialization import dumps
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


@pytest.fixture
def cluster(kafka_bootstrap):
    """A fresh cluster name and a factory of ClusterMaps on it (each a member), all closed and
    the cluster's map and list topics deleted afterwards."""
    name = f"t{uuid.uuid4().hex[:10]}"
    made: list[ClusterMaps] = []

    def member() -> ClusterMaps:
        m = ClusterMaps(kafka_bootstrap, name)
        made.append(m)
        return m

    member.name = name
    member.bootstrap = kafka_bootstrap
    yield member
    for m in made:
        m.close()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    ours = [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"__jetwake_{name}_")]
    if ours:
        for f in admin.delete_topics(ours, operation_timeout=30).values():
            try:
                f.result(30)
            except Exception:  # noqa: BLE001 - cleanup only
                pass


# --- maps -----------------------------------------------------------------------------------


def test_a_put_or_remove_on_one_member_is_read_on_another_as_soon_as_it_returns(cluster):
    a, b = cluster().get_map("m"), cluster().get_map("m")
    for i in range(30):
        assert a.put(f"k{i}", {"n": i}) is None
        assert b.get(f"k{i}") == {"n": i}
        assert b.put(f"k{i}", {"n": -i}) == {"n": i}
        assert a[f"k{i}"] == {"n": -i}
    for i in range(0, 30, 2):
        assert b.remove(f"k{i}") == {"n": -i}
        assert f"k{i}" not in a and a.get(f"k{i}", "gone") == "gone"
    assert a.remove("never") is None
    assert a.size() == b.size() == len(a) == 15


def test_put_all_of_50000_entries_is_read_whole_from_another_member(cluster):
    a, b = cluster().get_map("big"), cluster().get_map("big")
    entries = {(i, f"k{i}"): i * i for i in range(50_000)}
    a.put_all(entries)
    assert b.size() == 50_000
    assert dict(b.items()) == entries
    assert set(b.keys()) == set(entries)
    assert sorted(b.values()) == sorted(entries.values())
    # a partitioned read gives exactly the keys of those partitions
    some = [0, 7, 270]
    got = dict(b.entries(some))
    assert got == {k: v for k, v in entries.items() if partition_of(k) in some}


def test_put_if_absent_merge_and_clear_see_the_other_members_writes(cluster):
    a, b = cluster().get_map("m"), cluster().get_map("m")
    assert a.put_if_absent("x", 1) is None
    assert b.put_if_absent("x", 2) == 1
    assert b.merge("x", 10, lambda old, new: old + new) == 11
    assert a.merge("x", 5, lambda old, new: old + new) == 16
    assert a.merge("y", 3, lambda old, new: old + new) == 3
    assert b.merge("y", 0, lambda old, new: None) is None
    assert dict(a.items()) == {"x": 16}
    b.update({"p": 1, "q": 2})
    a.clear()
    assert b.size() == 0 and dict(b.items()) == {}


def test_none_is_not_a_value(cluster):
    m = cluster().get_map("m")
    with pytest.raises(ValueError, match="None is not a valid map value"):
        m.put("k", None)


def test_a_map_outlives_the_member_that_wrote_it(cluster):
    writer = cluster()
    writer.get_map("kept").put_all([(i, str(i)) for i in range(1000)])
    writer.get_map("kept").remove(7)
    writer.get_list("log").add_all(["a", "b"])
    writer.close()
    later = cluster()
    kept = later.get_map("kept")
    assert dict(kept.items()) == {i: str(i) for i in range(1000) if i != 7}
    assert list(later.get_list("log")) == ["a", "b"]


def test_names_that_cannot_be_kafka_topics_fail_naming_the_rule(cluster):
    c = cluster()
    with pytest.raises(ValueError, match="Kafka allows only letters, digits"):
        c.get_map("orders by day")
    with pytest.raises(ValueError, match="too long for a cluster"):
        c.get_list("x" * 300)
    with pytest.raises(ValueError, match="must not contain '/'"):
        c.get_map("a/b")
    with pytest.raises(ValueError, match="non-empty string"):
        c.get_map("")


# --- the event journal ----------------------------------------------------------------------


def test_the_journal_gives_every_change_from_an_offset_and_replays_from_a_saved_one(cluster):
    a, b = cluster().get_map("j"), cluster().get_map("j")
    start = b.journal_next_seq()
    a.put("k1", 1)
    a.put_all([("k2", 2), ("k3", 3)])
    a.put("k1", 11)
    a.remove("k2")
    assert b.journal_next_seq() == start + 5
    assert b.journal_oldest_seq() == 0
    batch = b.journal_read(start, 100)
    assert [(e.key, e.new_value, e.kind) for e in batch.events] == [
        ("k1", 1, "put"), ("k2", 2, "put"), ("k3", 3, "put"), ("k1", 11, "put"),
        ("k2", None, "remove")]
    assert [e.sequence for e in batch.events] == list(range(start, start + 5))
    assert batch.next_seq == start + 5 and batch.lost == 0
    # a reader that saved the sequence after two events replays exactly the rest, on any member
    saved = b.journal_read(start, 2).next_seq
    assert saved == start + 2
    replay = cluster().get_map("j").journal_read(saved, 100)
    assert replay.events == batch.events[2:]
    # nothing new: an empty batch at once, and past the end is an error
    assert b.journal_read(start + 5, 10).events == []
    with pytest.raises(ValueError, match="outside the journal"):
        b.journal_read(start + 6, 10)


def test_wait_for_events_returns_when_another_member_writes(cluster):
    a, b = cluster().get_map("w"), cluster().get_map("w")
    end = b.journal_next_seq()
    assert b.wait_for_events(end, 0.05) is False
    a.put("k", 1)
    assert b.wait_for_events(end, 10) is True
    assert b.journal_read(end, 10).events[0].new_value == 1


def _read_all(m, from_seq: int) -> tuple[list, int]:
    """Every event from ``from_seq`` to the end, and how many were lost on the way."""
    end = m.journal_next_seq()
    events, lost, seq = [], 0, from_seq
    while seq < end:
        batch = m.journal_read(seq, 10_000)
        events += batch.events
        lost += batch.lost
        seq = batch.next_seq
    return events, lost


def test_events_before_the_log_start_are_counted_as_lost(cluster):
    # Kafka moves the log start of a topic that also deletes (a compact-only one, as jetwake
    # creates, keeps its start): such a topic is accepted as a map's, so its reader must cope
    topic = map_topic(cluster.name, "trimmed")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={
        "cleanup.policy": "compact,delete", "retention.ms": "-1"})])[topic].result(30)
    m = cluster().get_map("trimmed")
    m.put_all([(i, i) for i in range(100)])
    tp = TopicPartition(m.topic, 0, 40)
    for f in admin.delete_records([tp]).values():
        f.result(30)
    wait_until(lambda: m.journal_oldest_seq() == 40, what="the log start to move to 40", timeout=30)
    events, lost = _read_all(m, 0)
    assert lost == 40
    assert [e.key for e in events] == list(range(40, 100))


def test_records_removed_by_compaction_are_counted_as_lost(cluster):
    # a topic that compacts as soon as the broker's cleaner looks: tiny segments, no lag
    topic = map_topic(cluster.name, "compacted")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={
        "cleanup.policy": "compact", "segment.bytes": "4096", "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.001", "min.compaction.lag.ms": "0"})])[topic].result(30)
    m = cluster().get_map("compacted")
    for round_ in range(10):
        m.put_all([(f"k{i}", round_) for i in range(100)])
    assert _read_all(m, 0)[1] == 0

    def compacted():
        events, lost = _read_all(m, 0)
        return (events, lost) if lost else None

    events, lost = wait_until(compacted,
                              what="the broker's cleaner to compact the topic", timeout=45,
                              interval=0.5)
    assert len(events) + lost == 1000  # every offset is either an event or counted lost
    latest = {e.key: e.new_value for e in events}
    assert latest == {f"k{i}": 9 for i in range(100)}  # the latest value of each key stays
    assert dict(m.items()) == latest


# --- lists ----------------------------------------------------------------------------------


def test_a_commit_is_applied_once_whichever_member_repeats_it(cluster):
    a, b = cluster().get_list("out"), cluster().get_list("out")
    assert a.committed_snapshot("w1") == -1
    assert a.commit([1, 2, 3], "w1", 5) is True
    assert b.commit([1, 2, 3], "w1", 5) is False
    assert b.commit([0], "w1", 4) is False  # an older snapshot of that writer
    assert b.commit([], "w2", 1) is True    # the marker alone
    assert b.commit([4], "w1", 6) is True
    assert list(a) == [1, 2, 3, 4] and len(b) == 4 and b[3] == 4 and b[-4:-2] == [1, 2]
    assert b.committed_snapshot("w1") == 6 and a.committed_snapshot("w2") == 1


def test_a_commit_interrupted_part_way_and_retried_is_applied_once_and_whole(cluster):
    a, b = cluster().get_list("out"), cluster().get_list("out")
    a.add("before")
    # a writer that crashed after two of its three records reached Kafka
    p = Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(2):
        p.produce(a.topic, key=dumps(["c", "w", 3, i, 3]), value=dumps(f"item{i}"), partition=0)
    p.flush(30)
    assert list(b) == ["before"] and b.committed_snapshot("w") == -1
    assert b.commit(["item0", "item1", "item2"], "w", 3) is True  # the retry, elsewhere
    assert list(a) == ["before", "item0", "item1", "item2"]
    assert a.committed_snapshot("w") == 3


def test_clear_empties_the_list_for_every_member_and_keeps_the_markers(cluster):
    a, b = cluster().get_list("l"), cluster().get_list("l")
    a.add_all(range(5))
    a.commit(["c"], "w", 1)
    b.clear()
    assert list(a) == [] and len(a) == 0
    a.add(9)
    assert list(b) == [9] and b == [9]
    assert b.commit(["c"], "w", 1) is False and b.committed_snapshot("w") == 1


def test_a_list_topic_keeps_its_records_forever(cluster):
    lst = cluster().get_list("kept")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    res = ConfigResource(ResourceType.TOPIC, list_topic(cluster.name, "kept"))
    conf = admin.describe_configs([res])[res].result(30)
    assert conf["cleanup.policy"].value == "delete"
    assert conf["retention.ms"].value == "-1" and conf["retention.bytes"].value == "-1"
    assert lst.topic == list_topic(cluster.name, "kept")
