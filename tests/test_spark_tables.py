"""Tables on the Spark backfill: ``join_table`` (partitioned and broadcast) and
``map_using_map`` give what the member gives (the plain-Python reference), and the hand-off
holds the table, so a streaming job started from it joins new stream items to the table the
backfill read, without reading the table again."""
from __future__ import annotations

import pytest

from jetwake import BroadcastKey, JobConfig, Member, Pipeline, Sinks, Sources
from jetwake.engine.core.errors import PipelineError

from support.spark_fixtures import spark_runner  # noqa: F401
from support.waiting import wait_until
from test_tables import (  # noqa: F401 - compacted_topic is a fixture
    compacted_topic, joined, latest, produce_json, stream_records, table_records,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.kafka]

PRICES = {f"k{i}": i * 2 for i in range(0, 60, 2)}


def pipeline(bootstrap: str, stream_topic: str, table_topic: str) -> Pipeline:
    props = {"bootstrap.servers": bootstrap}
    p = Pipeline()
    table = p.read_from(Sources.kafka_table(table_topic, props, key_deserializer="str",
                                            value_deserializer="json")).set_name("table")
    stream = p.read_from(Sources.kafka(stream_topic, props, key_deserializer="str",
                                       value_deserializer="json")).set_name("stream")

    def pair(kv, value):
        return [kv[0], kv[1]["n"], value]
    stream.join_table(table, lambda kv: kv[0], pair).set_name("joined") \
        .write_to(Sinks.list("joined"))
    stream.join_table(table, lambda kv: kv[0], pair, how="left", broadcast=True) \
        .set_name("joined-global").write_to(Sinks.list("joined-global"))
    stream.map_using_map("prices", lambda kv: kv[0], pair).set_name("priced") \
        .write_to(Sinks.list("priced"))
    return p


def looked_up(stream: list) -> list:
    return sorted(([k, v["n"], PRICES.get(k)] for k, v in stream), key=repr)


def test_backfill_and_hand_off_of_tables_equal_the_member(spark_runner, kafka_bootstrap,
                                                          compacted_topic):
    table_topic, stream_topic = compacted_topic(2), compacted_topic(2, compacted=False)
    trecs, first, rest = table_records(), stream_records(240), stream_records(400)[240:]
    produce_json(kafka_bootstrap, table_topic, trecs)
    produce_json(kafka_bootstrap, stream_topic, first)
    table = latest(trecs)
    lists = ("joined", "joined-global", "priced")

    def results(m: Member) -> dict:
        return {name: sorted((list(x) for x in m.get_list(name)), key=repr) for name in lists}

    with Member() as m:
        m.get_map("prices").put_all(PRICES)
        spark_runner.run(pipeline(kafka_bootstrap, stream_topic, table_topic),
                         export_snapshot="tables", member=m)
        backfilled = results(m)
        assert backfilled == {"joined": joined(first, table, "inner"),
                              "joined-global": joined(first, table, "left"),
                              "priced": looked_up(first)}
        handed_off = m.snapshot_store.read(m.snapshot_store.get_export("tables"))

        produce_json(kafka_bootstrap, stream_topic, rest)
        job = m.new_job(pipeline(kafka_bootstrap, stream_topic, table_topic),
                        JobConfig(initial_snapshot_name="tables",
                                  processing_guarantee="at_least_once"))
        everything = first + rest
        wait_until(lambda: len(m.get_list("joined-global")) >= len(everything)
                   and len(m.get_list("priced")) >= len(everything)
                   and len(m.get_list("joined")) >= len(joined(everything, table, "inner")),
                   what="the streaming job to join the rest of the stream")
        metrics = job.metrics()
        streamed = m.snapshot_store.read(job.export_snapshot("streamed"))
        job.cancel()
        final = results(m)
    assert final == {"joined": joined(everything, table, "inner"),
                     "joined-global": joined(everything, table, "left"),
                     "priced": looked_up(everything)}
    # the table came from the hand-off: the table source read no record again
    assert metrics["table"]["records_in"] == 0
    assert metrics["joined"]["table_entries"] == len(table)
    # the hand-off's entries have the shapes the processors save
    for vertex in ("table", "joined", "joined-global"):
        assert vertex in handed_off, sorted(handed_off)
        mine = {_shape(k) for k, _ in handed_off[vertex]}
        theirs = {_shape(k) for k, _ in streamed[vertex]}
        assert mine == theirs, vertex


def _shape(key):
    if isinstance(key, BroadcastKey):
        k = key.key
        return ("broadcast", k[0] if isinstance(k, tuple) else k)
    return type(key).__name__


def test_map_using_map_on_spark_needs_the_member(spark_runner):
    p = Pipeline()
    p.read_from(Sources.items([1])).map_using_map("m", lambda x: x, lambda x, v: v) \
        .write_to(Sinks.noop())
    with pytest.raises(PipelineError, match="map_using_map.*member="):
        spark_runner.run(p)
