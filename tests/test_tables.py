"""Tables: ``Sources.kafka_table`` (a compacted topic's latest value per key), ``join_table``
(partitioned and broadcast, inner and left, bootstrap, snapshots) and ``map_using_map``, against
a real broker; each result compared with a reference computed in plain Python from the records
produced."""
from __future__ import annotations

import json
import logging
import os
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from jetwake import JobConfig, Member, Pipeline, Sinks, Sources
from jetwake.engine.core.errors import PipelineError

from support.kafka_broker import wait_for_topic
from support.kafka_job import Proc
from support.restores import restored_snapshots, wait_for_a_new_snapshot
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

KEYS = 60


@pytest.fixture
def compacted_topic(kafka_bootstrap):
    """Creates topics through the Admin API, compacted unless told otherwise."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    created: list[str] = []

    def new_topic(partitions: int = 3, compacted: bool = True) -> str:
        name = f"jetwake-tables-{uuid.uuid4().hex[:10]}"
        config = {"cleanup.policy": "compact" if compacted else "delete", "retention.ms": "-1"}
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                      config=config)])[name].result(60)
        created.append(name)
        wait_for_topic(admin, name, partitions)
        return name

    yield new_topic
    if created:
        for fut in admin.delete_topics(created, operation_timeout=30).values():
            try:
                fut.result(30)
            except Exception:  # noqa: BLE001 - clean-up only
                pass


def produce_json(bootstrap: str, topic: str, records: list[tuple[str, object]]) -> None:
    """``(key, value)`` records, value as JSON; a value of None is a tombstone."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for k, v in records:
        p.produce(topic, key=k.encode(), value=None if v is None else json.dumps(v).encode())
    assert p.flush(30) == 0


def table_records() -> list[tuple[str, object]]:
    """Every key written, then a third updated, then every seventh deleted: the table's
    latest values are not its first ones, and some keys are gone."""
    recs: list[tuple[str, object]] = [(f"k{i}", {"v": i}) for i in range(KEYS)]
    recs += [(f"k{i}", {"v": i * 100}) for i in range(0, KEYS, 3)]
    recs += [(f"k{i}", None) for i in range(0, KEYS, 7)]
    return recs


def latest(records: list[tuple[str, object]]) -> dict:
    """The reference: the latest value per key, a tombstone deleting the key."""
    table: dict = {}
    for k, v in records:
        if v is None:
            table.pop(k, None)
        else:
            table[k] = v
    return table


def stream_records(n: int) -> list[tuple[str, object]]:
    """Stream items ``{"n": i}`` keyed by table keys and by a few keys the table never had."""
    return [(f"k{i % (KEYS + 5)}", {"n": i}) for i in range(n)]


def joined(stream: list, table: dict, how: str) -> list:
    out = []
    for k, v in stream:
        value = table.get(k)
        if value is not None or how == "left":
            out.append([k, v["n"], value])
    return sorted(out, key=repr)


def join_pipeline(props: dict, stream_topic: str, table_topic: str, how: str,
                  broadcast: bool) -> Pipeline:
    p = Pipeline()
    table = p.read_from(Sources.kafka_table(table_topic, props, key_deserializer="str",
                                            value_deserializer="json"))
    stream = p.read_from(Sources.kafka(stream_topic, props, key_deserializer="str",
                                       value_deserializer="json"))
    (stream.join_table(table, lambda kv: kv[0], lambda kv, value: [kv[0], kv[1]["n"], value],
                       how=how, broadcast=broadcast)
        .write_to(Sinks.list(f"out-{how}-{broadcast}")))
    return p


def test_join_table_gives_the_latest_value_per_key_inner_and_left_partitioned_and_broadcast(
        kafka_bootstrap, compacted_topic):
    """The table is read to its end before the first stream item is joined (bootstrap), so
    every item meets the table's latest values: tombstoned keys miss, updated keys give their
    last value; partitioned and broadcast tables give the same result."""
    table_topic, stream_topic = compacted_topic(3), compacted_topic(2, compacted=False)
    trecs, srecs = table_records(), stream_records(300)
    produce_json(kafka_bootstrap, table_topic, trecs)
    produce_json(kafka_bootstrap, stream_topic, srecs)
    reference = latest(trecs)
    props = {"bootstrap.servers": kafka_bootstrap}
    cases = [(how, broadcast) for how in ("inner", "left") for broadcast in (False, True)]
    with Member(local_parallelism=2) as m:
        jobs = {case: m.new_job(join_pipeline(props, stream_topic, table_topic, *case))
                for case in cases}
        results = {}
        for (how, broadcast), job in jobs.items():
            out = m.get_list(f"out-{how}-{broadcast}")
            want = joined(srecs, reference, how)
            wait_until(lambda: len(out) >= len(want),
                       what=lambda: f"{len(want)} joined items ({how}, broadcast={broadcast}), "
                                    f"got {len(out)}")
            results[how, broadcast] = (sorted(list(out), key=repr), job.metrics()["join-table"])
        for job in jobs.values():
            job.cancel()
    for (how, broadcast), (got, metrics) in results.items():
        want = joined(srecs, reference, how)
        assert got == want, (how, broadcast)
        hits = sum(1 for k, _ in srecs if k in reference)
        assert metrics["table_hits"] == hits
        assert metrics["table_misses"] == len(srecs) - hits
        assert metrics["table_entries"] == len(reference)
        assert metrics["table_updates"] == sum(v is not None for _, v in trecs)
        assert metrics["table_deletes"] == sum(v is None for _, v in trecs)
    assert results["inner", False][0] == results["inner", True][0]
    assert results["left", False][0] == results["left", True][0]


def test_table_changes_reach_items_that_come_later(kafka_bootstrap, compacted_topic):
    """A value written to the table while the job runs is what later stream items meet, and a
    tombstone removes the key for them; another stage reading the table sees its changelog."""
    table_topic, stream_topic = compacted_topic(2), compacted_topic(2, compacted=False)
    props = {"bootstrap.servers": kafka_bootstrap}
    produce_json(kafka_bootstrap, table_topic, [("a", 1), ("b", 2)])
    p = Pipeline()
    table = p.read_from(Sources.kafka_table(table_topic, props, key_deserializer="str",
                                            value_deserializer="json"))
    table.write_to(Sinks.list("changelog"))
    stream = p.read_from(Sources.kafka(stream_topic, props, key_deserializer="str",
                                       value_deserializer="json"))
    stream.join_table(table, lambda kv: kv[0], lambda kv, v: [kv[1], v], how="left") \
        .write_to(Sinks.list("joined"))
    with Member() as m:
        job = m.new_job(p)
        out, changelog = m.get_list("joined"), m.get_list("changelog")
        produce_json(kafka_bootstrap, stream_topic, [("a", 1), ("b", 2)])
        wait_until(lambda: len(out) == 2, what="the first two items")
        produce_json(kafka_bootstrap, table_topic, [("a", 10), ("b", None)])
        wait_until(lambda: len(changelog) == 4, what="the table's four changes")

        def applied() -> bool:
            m = job.metrics()["join-table"]
            return m["table_updates"] == 3 and m["table_deletes"] == 1
        wait_until(applied, what="the join to apply the changes")
        produce_json(kafka_bootstrap, stream_topic, [("a", 3), ("b", 4)])
        wait_until(lambda: len(out) == 4, what="the last two items")
        job.cancel()
    assert sorted(list(out)) == [[1, 1], [2, 2], [3, 10], [4, None]]
    # each key's changes in order (the keys are in different partitions)
    assert [v for k, v in changelog if k == "a"] == [1, 10]
    assert [v for k, v in changelog if k == "b"] == [2, None]


def test_a_table_topic_that_is_not_compacted_logs_the_fix(kafka_bootstrap, compacted_topic,
                                                          caplog):
    caplog.set_level(logging.WARNING, logger="jetwake.kafka")
    table_topic, stream_topic = compacted_topic(1, compacted=False), compacted_topic(1)
    props = {"bootstrap.servers": kafka_bootstrap}
    p = Pipeline()
    table = p.read_from(Sources.kafka_table(table_topic, props))
    p.read_from(Sources.kafka(stream_topic, props)).join_table(table, lambda kv: kv[0]) \
        .write_to(Sinks.list("out"))
    with Member() as m:
        job = m.new_job(p)
        wait_until(lambda: "not compact" in caplog.text, what="the warning")
        job.cancel()
    warning = next(r.getMessage() for r in caplog.records if "not compact" in r.getMessage())
    assert table_topic in warning
    assert "--add-config cleanup.policy=compact" in warning


def test_a_missing_table_topic_fails_the_job_saying_how_to_create_it(kafka_bootstrap):
    props = {"bootstrap.servers": kafka_bootstrap, "jetwake.startup.timeout.ms": 500}
    missing = f"jetwake-missing-{uuid.uuid4().hex[:8]}"
    p = Pipeline()
    p.read_from(Sources.kafka_table(missing, props)).write_to(Sinks.list("out"))
    with Member() as m:
        with pytest.raises(Exception) as ei:  # when the job starts (or at its join)
            m.new_job(p).join(timeout=30)
    msg = str(ei.value)
    assert "Sources.kafka_table()" in msg and missing in msg
    assert "cleanup.policy=compact" in msg


def test_join_table_refuses_bad_arguments_when_the_pipeline_is_built():
    props = {"bootstrap.servers": "x:1"}
    p = Pipeline()
    stream = p.read_from(Sources.items([1, 2]))
    table = p.read_from(Sources.kafka_table("t", props))
    with pytest.raises(PipelineError, match="not a table.*Sources.kafka_table"):
        stream.join_table(stream, lambda x: x)
    with pytest.raises(PipelineError, match="not a table"):
        stream.join_table(table.map(lambda kv: kv), lambda x: x)
    with pytest.raises(ValueError, match="how must be 'inner' or 'left'"):
        stream.join_table(table, lambda x: x, how="outer")
    with pytest.raises(TypeError, match="key_fn"):
        stream.join_table(table, "key")
    with pytest.raises(TypeError, match="fn"):
        stream.join_table(table, lambda x: x, 3)
    with pytest.raises(ValueError, match="topic"):
        Sources.kafka_table("", props)
    with pytest.raises(ValueError, match="deserializer"):
        Sources.kafka_table("t", props, value_deserializer="yaml")
    with pytest.raises(TypeError, match="map_using_map.*fn"):
        stream.map_using_map("m", lambda x: x, None)
    with pytest.raises(ValueError, match="map_name"):
        stream.map_using_map("", lambda x: x, lambda x, v: v)


TABLE_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support",
                         "table_job_process.py")


def test_the_table_is_restored_from_a_snapshot_after_the_member_is_killed(
        kafka_bootstrap, compacted_topic, tmp_path):
    """The table in RocksDB, under exactly-once: the member process is SIGKILLed after a
    snapshot that holds the table; restarted, the job restores it with the table source's
    offsets (so it does not read the topic again) and joins the stream items produced
    meanwhile to it, each once. Without the restored table the inner join would drop them."""
    table_topic, stream_topic = compacted_topic(2), compacted_topic(2, compacted=False)
    out_topic = compacted_topic(1, compacted=False)
    trecs, first, rest = table_records(), stream_records(200), stream_records(400)[200:]
    table = latest(trecs)
    produce_json(kafka_bootstrap, table_topic, trecs)
    produce_json(kafka_bootstrap, stream_topic, first)
    data = str(tmp_path / "member")
    proc = Proc(data, kafka_bootstrap, stream_topic, table_topic, out_topic)
    proc.args[1] = TABLE_JOB
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([out_topic])
    got: list = []

    def read(n: int) -> bool:
        for msg in consumer.consume(1000, 0.2):
            if not msg.error():
                got.append(repr([msg.key().decode(), *json.loads(msg.value())]))
        return len(got) >= n
    try:
        proc.start(wait_ready=True)
        wait_until(lambda: read(len(joined(first, table, "inner"))), interval=0,
                   what=lambda: f"the first items joined ({len(got)} so far)")
        wait_for_a_new_snapshot(data)  # taken after the first items: it holds the table
        proc.kill()
        produce_json(kafka_bootstrap, stream_topic, rest)
        proc.start()
        everything = joined(first + rest, table, "inner")
        wait_until(lambda: read(len(everything)), interval=0,
                   what=lambda: f"{len(everything)} items joined ({len(got)} so far)\n"
                                f"{proc._tail()[-3000:]}")
    finally:
        proc.kill()
        consumer.close()
    assert restored_snapshots(data), "the restarted job did not restore a snapshot"
    assert sorted(got) == sorted(repr(x) for x in everything)  # each once: exactly-once


def test_map_using_map_looks_items_up_in_the_members_map_one_read_per_chunk(monkeypatch):
    """Each item gets its key's value (None when absent: the item is kept or dropped by fn's
    result); the map is read with one get_all per chunk of items, and lookups and misses are
    counted."""
    from jetwake.engine.data.named_maps import KeyValueMap

    reads: list[int] = []
    get_all = KeyValueMap.get_all

    def counting_get_all(self, keys):
        keys = list(keys)
        reads.append(len(keys))
        return get_all(self, keys)
    monkeypatch.setattr(KeyValueMap, "get_all", counting_get_all)
    items = [f"w{i % 50}" for i in range(5000)]
    prices = {f"w{i}": i for i in range(0, 50, 2)}
    p = Pipeline()
    (p.read_from(Sources.items(items))
        .map_using_map("prices", lambda w: w,
                       lambda w, price: None if w == "w1" else (w, price))
        .write_to(Sinks.list("priced")))
    with Member() as m:
        m.get_map("prices").put_all(prices)
        job = m.new_job(p)
        job.join(timeout=60)
        got = sorted(m.get_list("priced"))
        metrics = job.metrics()["map-using-map"]
    assert got == sorted((w, prices.get(w)) for w in items if w != "w1")
    assert metrics["map_lookups"] == len(items)
    assert metrics["map_misses"] == sum(w not in prices for w in items)
    assert sum(reads) == len(items) and len(reads) < len(items) / 100


def test_map_using_map_after_group_by_looks_the_grouping_key_up():
    p = Pipeline()
    (p.read_from(Sources.items([("a", 1), ("b", 2), ("c", 3)]))
        .group_by(lambda kv: kv[0])
        .map_using_map("factors", lambda kv, factor: (kv[0], kv[1] * (factor or 0)))
        .write_to(Sinks.list("scaled")))
    with Member(local_parallelism=2) as m:
        m.get_map("factors").put_all({"a": 10, "b": 100})
        m.new_job(p).join(timeout=60)
        assert sorted(m.get_list("scaled")) == [("a", 10), ("b", 200), ("c", 0)]
    # the key looked up may also be given, as Stage.map_using_map takes it
    p = Pipeline()
    (p.read_from(Sources.items([("a", "x"), ("b", "y")]))
        .group_by(lambda kv: kv[0])
        .map_using_map("names", lambda kv: kv[1], lambda kv, name: (kv[0], name))
        .write_to(Sinks.list("named")))
    with Member(local_parallelism=2) as m:
        m.get_map("names").put_all({"x": "ex"})
        m.new_job(p).join(timeout=60)
        assert sorted(m.get_list("named")) == [("a", "ex"), ("b", None)]


def test_the_ready_markers_reach_every_partition_of_a_partitioned_edge():
    """A table source processor sends one marker per partition: whichever processors own the
    partitions, on however many members, each hears from it."""
    from jetwake.engine.core.partitioning import PARTITION_COUNT, partition_of
    from jetwake.engine.processors.table_join import ready_markers, table_route_key

    markers = ready_markers(3, 4)
    assert {partition_of(table_route_key(m)) for m in markers} == set(range(PARTITION_COUNT))
    assert {(m.source, m.sources) for m in markers} == {(3, 4)}
