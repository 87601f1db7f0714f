"""Snapshot data files go to a Kafka topic so that every member can restore them: a member
uploads its files and keeps the refs; any member downloads exactly those records again and gets
the same bytes, or an error naming the file when its records are gone or damaged."""

from __future__ import annotations

import os
import uuid
import zlib

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from jetwake.engine.cluster.snapshot_data_topic import (
    CHUNK_SIZE, SnapshotDataMissingError, SnapshotDataTopic, files_under, snapshot_data_topic,
)
from jetwake.engine.core.errors import SnapshotWriteError
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

FILES = {
    "jobs/j1/snapshots/3/count/0.bin": os.urandom(3 * 1024 * 1024 + 17),
    "jobs/j1/snapshots/3/count/1.bin": b"",
    "jobs/j1/snapshots/3/count/2.bin": b"a small state file",
    "jobs/j1/snapshots/3/rolling/0.files/000012.sst": os.urandom(CHUNK_SIZE),
    "jobs/j1/snapshots/3/rolling/0.files/MANIFEST-000005": os.urandom(700),
}


@pytest.fixture
def cluster(kafka_bootstrap):
    """A fresh cluster name and a factory of SnapshotDataTopic on it (topic ensured), all
    closed afterwards and the topic deleted."""
    name = f"t{uuid.uuid4().hex[:10]}"
    made: list[SnapshotDataTopic] = []

    def data_topic() -> SnapshotDataTopic:
        t = SnapshotDataTopic(kafka_bootstrap, name)
        t.ensure_topic()
        made.append(t)
        return t

    data_topic.name = name
    data_topic.bootstrap = kafka_bootstrap
    yield data_topic
    for t in made:
        t.close()
    try:
        AdminClient({"bootstrap.servers": kafka_bootstrap}).delete_topics(
            [snapshot_data_topic(name)])[snapshot_data_topic(name)].result(30)
    except Exception:  # noqa: BLE001 - cleanup only
        pass


def _write_files(directory, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _all_files(directory) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in directory.rglob("*") if p.is_file()}


@pytest.fixture
def uploaded(cluster, tmp_path):
    """FILES written under a member's directory and uploaded: (refs, prefix)."""
    source = tmp_path / "member-1"
    _write_files(source, FILES)
    rels = files_under(str(source), ["jobs/j1/snapshots/3"])
    prefix = "j1/3/member-1"
    return cluster().upload(str(source), rels, prefix), prefix


def test_files_under_lists_every_file_below_the_directories(tmp_path):
    _write_files(tmp_path, {**FILES, "jobs/j1/snapshots/4/count/0.bin": b"x"})
    assert files_under(str(tmp_path), ["jobs/j1/snapshots/3"]) == sorted(FILES)
    assert files_under(str(tmp_path), ["jobs/j1/snapshots/3/rolling",
                                       "jobs/j1/snapshots/3/count/2.bin"]) == [
        "jobs/j1/snapshots/3/count/2.bin",
        "jobs/j1/snapshots/3/rolling/0.files/000012.sst",
        "jobs/j1/snapshots/3/rolling/0.files/MANIFEST-000005",
    ]


def test_files_under_refuses_a_directory_that_does_not_exist(tmp_path):
    with pytest.raises(ValueError, match="'jobs/none' does not exist"):
        files_under(str(tmp_path), ["jobs/none"])


def test_another_member_downloads_the_same_bytes(cluster, uploaded, tmp_path):
    refs, _prefix = uploaded
    target = tmp_path / "member-2"
    cluster().download(refs, str(target))  # another instance, another directory
    assert _all_files(target) == FILES


def test_refs_name_the_partition_offsets_size_and_crc_of_each_file(uploaded):
    refs, _prefix = uploaded
    assert set(refs) == set(FILES)
    for rel, (partition, first, last, size, crc) in refs.items():
        assert 0 <= partition and 0 <= first <= last
        assert size == len(FILES[rel]) and crc == zlib.crc32(FILES[rel])
    big = refs["jobs/j1/snapshots/3/count/0.bin"]
    assert big[2] - big[1] >= 3  # four chunks of 1 MiB at least that many offsets apart


def test_a_download_with_the_prefix_given_checks_it(cluster, uploaded, tmp_path):
    refs, prefix = uploaded
    cluster().download(refs, str(tmp_path / "ok"), prefix=prefix)
    assert _all_files(tmp_path / "ok") == FILES
    one = {"jobs/j1/snapshots/3/count/2.bin": refs["jobs/j1/snapshots/3/count/2.bin"]}
    with pytest.raises(SnapshotDataMissingError, match="not the file's first chunk"):
        cluster().download(one, str(tmp_path / "bad"), prefix="j1/3/member-9")


def test_the_same_path_uploaded_twice_downloads_the_version_of_its_refs(cluster, tmp_path):
    data_topic = cluster()
    rel = "jobs/j1/snapshots/5/count/0.bin"
    _write_files(tmp_path / "a", {rel: os.urandom(2 * CHUNK_SIZE + 3)})
    _write_files(tmp_path / "b", {rel: os.urandom(2 * CHUNK_SIZE + 3)})
    refs_a = data_topic.upload(str(tmp_path / "a"), [rel], "j1/5/member-a")
    refs_b = data_topic.upload(str(tmp_path / "b"), [rel], "j1/5/member-b")
    data_topic.download(refs_a, str(tmp_path / "got-a"))
    data_topic.download(refs_b, str(tmp_path / "got-b"))
    assert _all_files(tmp_path / "got-a") == _all_files(tmp_path / "a")
    assert _all_files(tmp_path / "got-b") == _all_files(tmp_path / "b")


def test_a_wrong_crc_is_reported_naming_the_file_and_nothing_is_left_of_it(cluster, uploaded,
                                                                           tmp_path):
    refs, _prefix = uploaded
    rel = "jobs/j1/snapshots/3/count/0.bin"
    damaged = {rel: [*refs[rel][:4], (refs[rel][4] + 1) % 2**32]}
    target = tmp_path / "member-2"
    with pytest.raises(SnapshotDataMissingError, match=f"'{rel}'.*CRC-32"):
        cluster().download(damaged, str(target))
    assert not target.exists() or _all_files(target) == {}


def test_a_wrong_size_is_reported_naming_the_file(cluster, uploaded, tmp_path):
    refs, _prefix = uploaded
    rel = "jobs/j1/snapshots/3/count/2.bin"
    damaged = {rel: [*refs[rel][:3], refs[rel][3] + 1, refs[rel][4]]}
    with pytest.raises(SnapshotDataMissingError, match=f"'{rel}'.*hold 18 bytes, its ref "
                                                       "says 19"):
        cluster().download(damaged, str(tmp_path / "member-2"))


def test_offsets_past_the_end_of_the_partition_are_reported_as_missing(cluster, uploaded,
                                                                       tmp_path):
    refs, _prefix = uploaded
    rel = "jobs/j1/snapshots/3/count/2.bin"
    partition, first, last, size, crc = refs[rel]
    gone = {rel: [partition, last + 1000, last + 1000, size, crc]}
    with pytest.raises(SnapshotDataMissingError, match=f"'{rel}'.*offsets no longer exist"):
        cluster().download(gone, str(tmp_path / "member-2"))


def test_a_ref_pointing_at_another_files_records_is_reported(cluster, uploaded, tmp_path):
    refs, _prefix = uploaded
    rel = "jobs/j1/snapshots/3/count/2.bin"
    other = refs["jobs/j1/snapshots/3/rolling/0.files/MANIFEST-000005"]
    wrong = {rel: [*other[:3], *refs[rel][3:]]}
    with pytest.raises(SnapshotDataMissingError, match=f"'{rel}'.*not the file's first chunk"):
        cluster().download(wrong, str(tmp_path / "member-2"))


def test_delete_writes_a_tombstone_for_every_chunk(cluster, uploaded):
    refs, prefix = uploaded
    cluster().delete(refs, prefix)
    expected = {f"{prefix}/{rel}/{n}" for rel, data in FILES.items()
                for n in range(max(1, -(-len(data) // CHUNK_SIZE)))}
    latest = _latest_by_key(cluster)
    assert {k for k in latest if k.startswith(prefix + "/")} == expected
    assert all(latest[k] is None for k in expected)


def test_the_topic_rolls_segments_and_drops_tombstones_within_a_minute(cluster):
    # the cleaner compacts closed segments only and keeps tombstones delete.retention.ms: a
    # deleted snapshot's chunks must become reclaimable within minutes, not hours (a job
    # snapshotting every second otherwise grows the topic for hours)
    from confluent_kafka.admin import ConfigResource, ResourceType

    cluster()
    resource = ConfigResource(ResourceType.TOPIC, snapshot_data_topic(cluster.name))
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["cleanup.policy"].value == "compact"
    assert int(configs["segment.ms"].value) <= 60_000
    assert int(configs["delete.retention.ms"].value) <= 60_000


def test_uploading_a_missing_file_names_it(cluster, tmp_path):
    with pytest.raises(SnapshotWriteError, match="nothing.bin"):
        cluster().upload(str(tmp_path), ["nothing.bin"], "j/1/m")


@pytest.mark.parametrize("refs, match", [
    ({"a.bin": [0, 5, 4, 1, 1]}, "first <= last"),
    ({"a.bin": [0, 1, 2]}, r"\[partition, first offset"),
    ({"../a.bin": [0, 1, 2, 3, 4]}, "relative"),
    ([["a.bin", [0, 1, 2, 3, 4]]], "must be a dict"),
])
def test_bad_refs_are_refused_naming_the_problem(cluster, tmp_path, refs, match):
    with pytest.raises(ValueError, match=match):
        cluster().download(refs, str(tmp_path))


def test_a_bad_prefix_is_refused(cluster, tmp_path):
    with pytest.raises(ValueError, match="prefix"):
        cluster().upload(str(tmp_path), [], "/absolute/")


def _latest_by_key(cluster) -> dict[str, bytes | None]:
    """The latest record of every key in the cluster's snapshot data topic."""
    topic = snapshot_data_topic(cluster.name)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.partition.eof": True, "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10,
                                                  cached=False)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        reached = {p: 0 for p in partitions}
        latest: dict[str, bytes | None] = {}

        def at_the_end() -> bool:
            if all(reached[p] >= ends[p] for p in partitions):
                return True
            m = consumer.poll(0.5)
            if m is not None and m.error() is not None:
                reached[m.partition()] = max(reached[m.partition()], m.offset())
            elif m is not None:
                reached[m.partition()] = m.offset() + 1
                latest[m.key().decode()] = m.value()
            return all(reached[p] >= ends[p] for p in partitions)
        wait_until(at_the_end, timeout=30, interval=0, what=f"reading {topic} to its end")
        return latest
    finally:
        consumer.close()


# --- what a restore makes of a part it cannot fetch ----------------------------------------

def _store_with_part(cluster, tmp_path, refs):
    from jetwake.engine.cluster.cluster_snapshot_store import ClusterSnapshotStore
    from jetwake.snapshot.store.snapshot_store import CommitRecord

    data_topic = cluster()
    store = ClusterSnapshotStore(str(tmp_path / "member-2"), data_topic, records=None)
    rec = CommitRecord("j1", "job", 3, 0.0, 1.0, data_refs={"member-1": refs})
    return store, data_topic, rec


def test_a_part_whose_data_differs_from_its_ref_makes_the_snapshot_damaged(cluster, uploaded,
                                                                          tmp_path):
    from jetwake.snapshot.store.snapshot_store import SnapshotDamagedError

    refs, _prefix = uploaded
    rel = "jobs/j1/snapshots/3/count/0.bin"
    store, _topic, rec = _store_with_part(
        cluster, tmp_path, {rel: [*refs[rel][:4], (refs[rel][4] + 1) % 2**32]})
    with pytest.raises(SnapshotDamagedError, match="the part of member member-1"):
        store.fetch_parts(rec)


def test_a_part_kafka_cannot_give_now_is_tried_again_not_taken_for_damage(cluster, uploaded,
                                                                         tmp_path):
    # taken for damage, an exactly-once job would fall back past the snapshot (or be
    # suspended) for a broker that comes back in seconds
    from jetwake.engine.cluster.cluster_snapshot_store import RecordsUnreachableError
    from jetwake.engine.core.errors import RestartableError
    from jetwake.snapshot.store.snapshot_store import SnapshotDamagedError

    refs, _prefix = uploaded
    store, data_topic, rec = _store_with_part(cluster, tmp_path, refs)
    data_topic.close()  # its clients are gone: the download fails before reading a record
    with pytest.raises(RecordsUnreachableError, match="tried again once Kafka answers") as e:
        store.fetch_parts(rec)
    assert isinstance(e.value, RestartableError)
    assert not isinstance(e.value, SnapshotDamagedError)
