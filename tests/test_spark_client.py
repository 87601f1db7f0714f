"""A backfill whose member is a Client: the hand-off snapshot is written on the member through
its service, and Sinks.list appends through it, each chunk once."""

from __future__ import annotations

import pytest

from jetwake import (
    AggregateOperations as ops, Client, JobConfig, Member, Pipeline, SnapshotError, Sinks,
    Sources,
)

from support.spark_fixtures import spark_runner  # noqa: F401
from support.spark_handoff import KEYS, pipeline, produce
from support.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _entries(store, name):
    """A snapshot's entries, vertex by vertex, in a canonical order."""
    return {vertex: sorted(entries, key=repr)
            for vertex, entries in store.read(store.get_export(name)).items()}


@pytest.mark.kafka
def test_a_hand_off_through_a_client_writes_the_snapshot_an_embedded_member_gets(
        spark_runner, kafka_bootstrap, kafka_topic):
    n, cut = 4_000, 3_000
    topic = kafka_topic(partitions=2)
    produce(kafka_bootstrap, topic, n)
    until = {topic: {0: cut // 2, 1: cut // 2}}
    with Member(port=0) as m, Client(m.address) as client:
        spark_runner.run(pipeline(kafka_bootstrap, topic), until=until,
                         export_snapshot="direct", member=m)
        result = spark_runner.run(pipeline(kafka_bootstrap, topic), until=until,
                                  export_snapshot="via-client", member=client)
        assert result.snapshot == "via-client"
        assert "via-client" in [r.name for r in client.snapshots()]
        assert _entries(m.snapshot_store, "via-client") == _entries(m.snapshot_store, "direct")
        # the streaming job starts from it and counts every record once
        m.get_list("counts").clear()
        job = m.new_job(pipeline(kafka_bootstrap, topic),
                        JobConfig(initial_snapshot_name="via-client"))
        wait_until(lambda: len(m.get_list("counts")) >= n - cut,
                   timeout=60, what="the streaming job")
        job.cancel()
        last = {}
        for k, c in m.get_list("counts"):
            last[k] = max(c, last.get(k, 0))
        assert last == {f"k{k}": n // KEYS for k in range(KEYS)}


@pytest.mark.kafka
def test_a_snapshot_name_taken_on_the_member_fails_through_a_client_before_work(
        spark_runner, kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=1)
    produce(kafka_bootstrap, topic, 10)
    with Member(port=0) as m, Client(m.address) as client:
        spark_runner.run(pipeline(kafka_bootstrap, topic), export_snapshot="taken", member=m)
        with pytest.raises(SnapshotError, match="'taken' exists already"):
            spark_runner.run(pipeline(kafka_bootstrap, topic), export_snapshot="taken",
                             member=client)
        assert list(client.get_list("counts")) == list(m.get_list("counts"))


def test_sinks_list_and_map_through_a_client_write_what_the_member_holds(spark_runner):
    words = [f"w{i % 7}" for i in range(10_000)]

    def build() -> Pipeline:
        p = Pipeline()
        s = p.read_from(Sources.items(words))
        s.map(str.upper).write_to(Sinks.list("upper"))
        s.group_by(lambda w: w).aggregate(ops.counting()).write_to(Sinks.map("counts"))
        return p
    with Member(port=0) as m, Client(m.address) as client:
        result = spark_runner.run(build(), member=client)
        assert sorted(m.get_list("upper")) == sorted(w.upper() for w in words)
        assert dict(m.get_map("counts").items()) == {f"w{i}": words.count(f"w{i}")
                                                    for i in range(7)}
        assert result.counters["stages"]["list-sink-upper"]["items_out"] == len(words)


def test_a_list_commit_sent_again_through_a_client_is_applied_once():
    with Member(port=0) as m, Client(m.address) as client:
        remote = client.get_list("out")
        assert remote.commit([1, 2], "writer-a", 1) is True
        assert remote.commit([1, 2], "writer-a", 1) is False  # the same request again
        assert remote.commit([3], "writer-a", 2) is True
        assert list(m.get_list("out")) == [1, 2, 3]

