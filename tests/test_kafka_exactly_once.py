"""The exactly-once Kafka sink against a real broker, driven by hand where a crash point must
be hit exactly: markers that outlive the group offsets, complete() before phase 2, the
markers topic, and the refusal of ``exactly_once=True`` in a job without exactly-once.

A "crash" here is a processor that is dropped without closing, followed by a new processor
restored from the entries the first one saved (what a restarted job does)."""
from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from jetwake import JobConfig, Member, Pipeline, Sinks, Sources
from jetwake.connectors.kafka.properties import KafkaConfigError
from jetwake.engine.core.processor import Inbox
from support.sink_processors import sink_processor
from support.waiting import wait_until

VERTEX = "kafka-sink"


def transactional_id(job_id: str, index: int = 0) -> str:
    return f"jetwake-{job_id}-{VERTEX}-{index}"


class HandDriven:
    """One sink processor made the way a job makes it (meta-supplier, supplier, init) and
    driven through the processor contract by hand."""

    def __init__(self, topic: str, properties: dict, job_id: str, *, restored_id: int = -1,
                 guarantee: str = "exactly_once", index: int = 0, total: int = 1) -> None:
        sink = Sinks.kafka(topic, properties, value_serializer="str")
        self.proc, self.snap = sink_processor(sink, job_id, VERTEX, restored_id=restored_id,
                                              guarantee=guarantee, index=index, total=total)

    def process(self, items: list) -> None:
        self.proc.process(0, Inbox(list(items)))

    def phase1(self, snapshot_id: int) -> list:
        """Saves the processor's state into snapshot ``snapshot_id`` and prepares; returns
        the saved entries."""
        self.snap.requested_id = snapshot_id
        self.proc.context.snapshot_id = snapshot_id
        entries = []
        while True:
            done = self.proc.save_to_snapshot()
            entries += self.proc.outbox.drain_snapshot()
            if done:
                break
        assert self.proc.snapshot_commit_prepare()
        return entries

    def phase2(self, snapshot_id: int, success: bool = True) -> None:
        self.snap.start_phase2(snapshot_id, success)
        self.proc.context.snapshot_id = snapshot_id
        while not self.proc.snapshot_commit_finish(success):
            pass

    def restore(self, entries: list) -> None:
        """Restores saved entries and lets the processor start (it settles them)."""
        inbox = Inbox(list(entries))
        while inbox:
            self.proc.restore_from_snapshot(inbox)
        assert self.proc.finish_snapshot_restore()
        self.proc.try_process()

    def close(self) -> None:
        self.proc.close()


def committed_values(bootstrap: str, topic: str, with_keys: bool = False) -> list:
    """Every value (``(key, value)`` with ``with_keys``) a read_committed reader sees in
    ``topic``, read up to the end of each partition (no waiting for records that might still
    come)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10,
                                           cached=False)[1] for p in parts}
        todo = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        values: list = []

        def at_the_end() -> bool:
            if not todo:
                return True
            for m in c.consume(1000, 0.2):
                if not m.error():
                    value = m.value().decode()
                    values.append((m.key() and m.key().decode(), value) if with_keys
                                  else value)
            for tp in c.position([TopicPartition(topic, p) for p in list(todo)]):
                if tp.offset >= ends[tp.partition]:
                    todo.discard(tp.partition)
            return not todo
        wait_until(at_the_end, timeout=30, interval=0, what=f"reading {topic} to its end")
        return values
    finally:
        c.close()


def delete_group(bootstrap: str, group: str) -> None:
    """Deletes a consumer group with its committed offsets (what Kafka does by itself once
    ``offsets.retention.minutes`` have passed since the group went empty)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.delete_consumer_groups([group], request_timeout=30)[group].result(30)
    except KafkaException as e:
        if "GROUP_ID_NOT_FOUND" not in str(e) and "not found" not in str(e).lower():
            raise


# --- with the broker -------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.kafka
def test_a_marker_outlives_the_group_offsets(kafka_bootstrap, kafka_topic):
    """Snapshot 1's phase 2 committed; then the consumer-group offsets expire (deleted here);
    a restore from snapshot 1 must not write snapshot 1's records again."""
    topic = kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap}
    job_id = uuid.uuid4().hex[:12]
    first = HandDriven(topic, props, job_id)
    first.process(["a", "b", "c"])
    entries = first.phase1(1)
    first.phase2(1)
    assert sorted(committed_values(kafka_bootstrap, topic)) == ["a", "b", "c"]
    first.close()

    delete_group(kafka_bootstrap, transactional_id(job_id))

    again = HandDriven(topic, props, job_id, restored_id=1)
    again.restore(entries)
    again.close()
    assert sorted(committed_values(kafka_bootstrap, topic)) == ["a", "b", "c"]


@pytest.mark.integration
@pytest.mark.kafka
def test_record_pairs_saved_by_an_earlier_version_are_written_once_with_their_keys(
        kafka_bootstrap, kafka_topic):
    """Earlier versions saved a snapshot's records as ``[key, value]`` pairs; this one saves
    chunks ``[keys or None, values]``. A restore from a snapshot that holds both kinds (its
    phase 2 never ran) writes every record once, in order, each with its key."""
    topic = kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap}
    job_id = uuid.uuid4().hex[:12]
    sink = HandDriven(topic, props, job_id)
    sink.process([("k1", "new-1"), ("k2", "new-2")])
    sink.process(["new-3"])                       # a chunk without keys
    entries = sink.phase1(1)
    sink.close()                                  # the member dies before phase 2
    (key, value), = entries
    assert [chunk[0] for chunk in value[5]] == [[b"k1", b"k2"], None]
    value[5][:0] = [[b"old-k", b"old-1"], [None, b"old-2"]]   # as an earlier version saved

    again = HandDriven(topic, props, job_id, restored_id=1)
    again.restore([(key, value)])
    again.close()
    assert committed_values(kafka_bootstrap, topic, with_keys=True) == [
        ("old-k", "old-1"), (None, "old-2"), ("k1", "new-1"), ("k2", "new-2"),
        (None, "new-3")]


@pytest.mark.integration
@pytest.mark.kafka
def test_a_batch_saved_in_parts_is_restored_whole_and_written_once(kafka_bootstrap, kafka_topic,
                                                                   monkeypatch):
    """A snapshot interval's output is saved as several entries (parts of at least
    SNAPSHOT_PART_RECORDS records, each its own frame); a restore joins them in order, also
    when the snapshot holds the batch twice, and writes every record once."""
    from jetwake.connectors.kafka import sink_exactly_once

    monkeypatch.setattr(sink_exactly_once, "SNAPSHOT_PART_RECORDS", 2)
    topic = kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap}
    job_id = uuid.uuid4().hex[:12]
    sink = HandDriven(topic, props, job_id)
    for chunk in (["a", "b"], ["c", "d", "e"], ["f"]):
        sink.process(chunk)
    entries = sink.phase1(1)
    sink.close()                                  # the member dies before phase 2
    assert [value[6] for _, value in entries] == [0, 1, 2]

    again = HandDriven(topic, props, job_id, restored_id=1)
    again.restore(entries + entries[1:2])         # a part restored twice counts once
    again.close()
    assert committed_values(kafka_bootstrap, topic) == ["a", "b", "c", "d", "e", "f"]


@pytest.mark.integration
@pytest.mark.kafka
def test_complete_before_phase2_commits_nothing_of_the_snapshot(kafka_bootstrap, kafka_topic):
    """complete() arrives after phase 1 of snapshot 1 and before its phase 2: it must wait
    (False) and write nothing; phase 2 then writes snapshot 1's records with the marker and
    complete() the records that came after the barrier."""
    topic = kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap}
    job_id = uuid.uuid4().hex[:12]
    sink = HandDriven(topic, props, job_id)
    sink.process(["before-1", "before-2"])
    entries = sink.phase1(1)
    sink.process(["after"])
    assert sink.proc.complete() is False
    assert committed_values(kafka_bootstrap, topic) == []
    sink.phase2(1)
    assert sink.proc.complete() is True
    sink.close()
    assert sorted(committed_values(kafka_bootstrap, topic)) == ["after", "before-1", "before-2"]

    # a restore from snapshot 1 (the job crashed before it was COMPLETED) writes nothing again
    again = HandDriven(topic, props, job_id, restored_id=1)
    again.restore(entries)
    again.close()
    assert sorted(committed_values(kafka_bootstrap, topic)) == ["after", "before-1", "before-2"]


@pytest.mark.integration
@pytest.mark.kafka
def test_a_crash_after_complete_before_phase2_writes_the_snapshot_once(kafka_bootstrap,
                                                                      kafka_topic):
    """The member dies right after complete() was called (phase 2 of snapshot 1 never ran):
    the restore from snapshot 1 writes its records, and they appear once."""
    topic = kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap}
    job_id = uuid.uuid4().hex[:12]
    sink = HandDriven(topic, props, job_id)
    sink.process(["x", "y"])
    entries = sink.phase1(1)
    sink.proc.complete()          # whatever it answers, the member dies now

    again = HandDriven(topic, props, job_id, restored_id=1)
    again.restore(entries)
    again.close()
    assert sorted(committed_values(kafka_bootstrap, topic)) == ["x", "y"]


def marker_records(bootstrap: str, topic: str) -> list[tuple[str, dict]]:
    """(key, value) of every committed record of a markers topic."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        tp = TopicPartition(topic, 0)
        end = c.get_watermark_offsets(tp, timeout=10, cached=False)[1]
        c.assign([TopicPartition(topic, 0, 0)])
        out = []

        def at_the_end() -> bool:
            if c.position([tp])[0].offset >= end:
                return True
            out.extend((m.key().decode(), json.loads(m.value()))
                       for m in c.consume(1000, 0.2) if not m.error())
            return False
        wait_until(at_the_end, timeout=30, interval=0, what=f"reading {topic} to its end")
        return out
    finally:
        c.close()


@pytest.mark.integration
@pytest.mark.kafka
def test_markers_go_to_a_compacted_topic_created_on_demand(kafka_bootstrap, kafka_topic):
    topic = kafka_topic()
    markers = f"jetwake-test-markers-{uuid.uuid4().hex[:8]}"
    props = {"bootstrap.servers": kafka_bootstrap, "jetwake.markers.topic": markers}
    job_id = uuid.uuid4().hex[:12]
    sink = HandDriven(topic, props, job_id)
    try:
        for sid, items in ((1, ["a"]), (2, []), (3, ["b", "c"])):
            sink.process(items)
            sink.phase1(sid)
            sink.phase2(sid)
        sink.close()
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        res = ConfigResource("TOPIC", markers)
        config = admin.describe_configs([res])[res].result(30)
        assert config["cleanup.policy"].value == "compact"
        # one marker per snapshot that wrote records, keyed by the transactional id
        assert marker_records(kafka_bootstrap, markers) == [
            (transactional_id(job_id), {"snapshot_id": 1, "topic": topic}),
            (transactional_id(job_id), {"snapshot_id": 3, "topic": topic})]
    finally:
        AdminClient({"bootstrap.servers": kafka_bootstrap}).delete_topics([markers])


@pytest.mark.integration
@pytest.mark.kafka
def test_a_markers_topic_whose_records_expire_is_refused(kafka_bootstrap, kafka_topic):
    topic, markers = kafka_topic(), kafka_topic()   # a plain topic: cleanup.policy=delete
    props = {"bootstrap.servers": kafka_bootstrap, "jetwake.markers.topic": markers}
    sink = HandDriven(topic, props, uuid.uuid4().hex[:12])
    with pytest.raises(KafkaConfigError, match=r"cleanup.policy=delete.*cleanup.policy=compact"):
        sink.process(["a"])
    sink.close()
    assert committed_values(kafka_bootstrap, topic) == []


@pytest.mark.integration
@pytest.mark.kafka
def test_the_latest_marker_is_found_behind_many_others(kafka_bootstrap, kafka_topic):
    """Other sinks wrote thousands of markers after ours: the backward scan still finds
    ours, and a restore writes nothing again."""
    from confluent_kafka import Producer

    topic = kafka_topic()
    markers = f"jetwake-test-markers-{uuid.uuid4().hex[:8]}"
    props = {"bootstrap.servers": kafka_bootstrap, "jetwake.markers.topic": markers}
    job_id = uuid.uuid4().hex[:12]
    try:
        sink = HandDriven(topic, props, job_id)
        sink.process(["a", "b"])
        entries = sink.phase1(1)
        sink.phase2(1)
        sink.close()
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        for i in range(20_000):
            p.produce(markers, json.dumps({"snapshot_id": i}).encode(), f"other-{i % 500}",
                      partition=0)
            if i % 5000 == 0:
                p.poll(0)
        assert p.flush(30) == 0
        again = HandDriven(topic, props, job_id, restored_id=1)
        again.restore(entries)
        again.close()
        assert sorted(committed_values(kafka_bootstrap, topic)) == ["a", "b"]
    finally:
        AdminClient({"bootstrap.servers": kafka_bootstrap}).delete_topics([markers])


@pytest.mark.integration
@pytest.mark.kafka
def test_a_crash_inside_the_phase2_transaction_writes_the_snapshot_once(kafka_bootstrap,
                                                                       kafka_topic):
    """The member dies after producing snapshot 1's records and marker, before the commit:
    the restore fences the open transaction (aborted: neither records nor marker count) and
    writes snapshot 1 again."""
    from confluent_kafka import Producer

    from jetwake.connectors.kafka.sink_markers import KafkaMarkerTopic

    topic = kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap}
    job_id = uuid.uuid4().hex[:12]
    sink = HandDriven(topic, props, job_id)
    sink.process(["a", "b"])
    entries = sink.phase1(1)
    # what phase 2 does, up to the commit, with the processor's transactional id
    dying = Producer({"bootstrap.servers": kafka_bootstrap,
                      "transactional.id": transactional_id(job_id)})
    dying.init_transactions(30)
    dying.begin_transaction()
    for v in ("a", "b"):
        dying.produce(topic, v.encode())
    KafkaMarkerTopic("__jetwake_sink_markers", props, 30, "test").produce(
        dying, transactional_id(job_id), 1, topic)
    assert dying.flush(30) == 0                     # in the log, not committed

    again = HandDriven(topic, props, job_id, restored_id=1)
    again.restore(entries)
    again.close()
    assert sorted(committed_values(kafka_bootstrap, topic)) == ["a", "b"]


@pytest.mark.integration
@pytest.mark.kafka
def test_a_group_offset_marker_of_an_earlier_version_is_honoured(kafka_bootstrap, kafka_topic):
    """A job saved by a version that kept markers as consumer-group offsets (offset N+1 on
    partition 0 of the sink's topic, group = transactional id) restores without writing the
    committed snapshot again, as long as those offsets have not expired."""
    topic = kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap,
             "jetwake.markers.topic": f"jetwake-test-markers-{uuid.uuid4().hex[:8]}"}
    job_id = uuid.uuid4().hex[:12]
    sink = HandDriven(topic, props, job_id)
    sink.process(["a"])
    entries = sink.phase1(4)
    sink.close()
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": transactional_id(job_id),
                  "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
    c.close()
    try:
        again = HandDriven(topic, props, job_id, restored_id=4)
        again.restore(entries)
        again.close()
        assert committed_values(kafka_bootstrap, topic) == []   # snapshot 4 counts as written
    finally:
        AdminClient({"bootstrap.servers": kafka_bootstrap}).delete_topics(
            [props["jetwake.markers.topic"]])


@pytest.mark.integration
@pytest.mark.kafka
def test_an_exactly_once_batch_job_completes_and_writes_every_record_once(kafka_bootstrap,
                                                                         kafka_topic):
    topic = kafka_topic(partitions=2)
    pl = Pipeline()
    pl.read_from(Sources.items(range(3000))).write_to(
        Sinks.kafka(topic, {"bootstrap.servers": kafka_bootstrap}, value_serializer="str"))
    with Member(local_parallelism=2) as m:
        job = m.new_job(pl, JobConfig(processing_guarantee="exactly_once",
                                      snapshot_interval_ms=20))
        job.join(timeout=120)
    assert sorted(int(v) for v in committed_values(kafka_bootstrap, topic)) == \
        list(range(3000))


# --- without a broker ------------------------------------------------------------------------

@pytest.mark.parametrize("guarantee", ["none", "at_least_once"])
def test_exactly_once_sink_in_a_job_without_exactly_once_is_refused(guarantee):
    pl = Pipeline()
    pl.read_from(Sources.items([1, 2, 3])).write_to(
        Sinks.kafka("out", {"bootstrap.servers": "127.0.0.1:1"}, exactly_once=True))
    with Member() as m:
        with pytest.raises(KafkaConfigError) as ei:
            m.new_job(pl, JobConfig(name="strict", processing_guarantee=guarantee))
    msg = str(ei.value)
    assert f"'{guarantee}'" in msg and "'strict'" in msg
    assert "JobConfig(processing_guarantee='exactly_once')" in msg
    assert "exactly_once=None" in msg and "False" in msg
