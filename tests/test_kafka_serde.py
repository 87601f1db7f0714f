"""The Kafka connectors' record formats, without a broker: the built-in "json" format (msgspec),
tombstones, bad records, whole-chunk conversion and how the sink splits items into keys and
values."""
from __future__ import annotations

import json

import pytest

from jetwake.connectors.kafka.properties import source_properties
from jetwake.connectors.kafka.serde import (
    deserialize_all, make_deserializer, make_serializer, serialize_all,
)
from jetwake.connectors.kafka.sink import KafkaRecordFormat


def test_json_writes_compact_utf8_and_reads_it_back():
    dumps = make_serializer("json", "test")
    loads = make_deserializer("json", "test")
    value = {"name": "Zoë", "n": [1, 2.5, None, True], "nested": {"k": "v"}}
    raw = dumps(value)
    assert raw == '{"name":"Zoë","n":[1,2.5,null,true],"nested":{"k":"v"}}'.encode()
    assert loads(raw) == value
    assert json.loads(raw) == value  # any JSON reader reads it


def test_json_tombstones_stay_none_both_ways():
    assert make_serializer("json", "test")(None) is None
    assert make_deserializer("json", "test")(None) is None


def test_a_record_that_is_not_json_raises_json_decode_error_with_its_position():
    loads = make_deserializer("json", "test")
    with pytest.raises(json.JSONDecodeError) as e:
        loads(b'{"a": 1, x}')
    assert e.value.pos == 9 and e.value.doc == '{"a": 1, x}'
    with pytest.raises(json.JSONDecodeError):
        loads(b'{"a": ')  # truncated


def test_a_chunk_is_deserialized_as_record_by_record_also_with_tombstones():
    for spec, raw in (("json", [b'{"a":1}', None, b"[2]"]), ("str", [b"x", None, b"y"]),
                      ("msgpack", [b"\x01", None, b"\x92\x01\x02"])):
        d = make_deserializer(spec, "test")
        assert deserialize_all(d, raw) == [d(b) for b in raw], spec
    assert deserialize_all(None, [b"x", None]) == [b"x", None]


def test_a_chunk_with_a_bad_record_raises_what_the_record_alone_raises():
    d = make_deserializer("json", "test")
    with pytest.raises(json.JSONDecodeError):
        deserialize_all(d, [b"1", b"{bad", b"2"])
    user = make_deserializer(lambda b: int(b), "test")
    with pytest.raises(ValueError):
        deserialize_all(user, [b"1", b"x"])
    assert deserialize_all(user, [b"1", None]) == [1, None]


def test_a_chunk_is_serialized_as_record_by_record():
    for spec, items in (("json", [{"a": 1}, None, [1, "x"]]), (None, [b"a", "b", None]),
                        ("str", [1, None, "x"]), ("msgpack", [1, None, {"a": [1]}])):
        s = make_serializer(spec, "test")
        assert serialize_all(s, items) == [s(x) for x in items], spec
    raw = [b"a", None, b"b"]
    assert serialize_all(make_serializer(None, "test"), raw) is raw  # bytes pass untouched


def test_the_sink_splits_pairs_into_keys_and_values_and_writes_other_items_as_values():
    fmt = KafkaRecordFormat("t", {"bootstrap.servers": "x:1"}, {}, None, None,
                            make_serializer("str", "k"), make_serializer("json", "v"))
    assert fmt.keys_and_values([("k1", {"a": 1}), ("k2", None)]) == \
        ([b"k1", b"k2"], [b'{"a":1}', None])
    # a tuple of another length, a list or a named tuple is a value without key
    items = [("k1", 1), (1, 2, 3), [4, 5]]
    assert fmt.keys_and_values(items) == ([b"k1", None, None], [b"1", b"[1,2,3]", b"[4,5]"])
    assert fmt.serialize([("k", 1)]) == [[b"k", b"1"]]
    assert fmt.keys_and_values([{"a": 1}, {"b": 2}]) == ([None, None], [b'{"a":1}', b'{"b":2}'])
    with_fns = KafkaRecordFormat("t", {"bootstrap.servers": "x:1"}, {}, lambda x: x["id"],
                                 None, make_serializer("str", "k"),
                                 make_serializer("json", "v"))
    assert with_fns.keys_and_values([{"id": 7}]) == ([b"7"], [b'{"id":7}'])


def test_the_sink_produces_until_the_producer_queue_is_full_and_says_where_it_stopped():
    from confluent_kafka import Producer

    fmt = KafkaRecordFormat("t", {"bootstrap.servers": "127.0.0.1:1"}, {}, None, None,
                            make_serializer(None, "k"), make_serializer(None, "v"))
    # nothing answers on port 1: the records stay in the producer's queue of 5
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": 5,
                         "log_level": 0})
    keys, values = [b"k%d" % i for i in range(12)], [b"v%d" % i for i in range(12)]
    assert fmt.produce_columns(producer, keys, values[:3]) == 3
    assert fmt.produce_columns(producer, keys, values, start=3) == 5  # two more fit
    assert fmt.produce_columns(producer, keys, values, start=5) == 5
    assert len(producer) == 5
    producer.purge()
    producer.poll(0)  # the purged records leave the queue
    assert fmt.produce_columns(producer, keys, values, start=5) == 10


def test_the_source_refetches_after_10_ms_unless_the_properties_say_otherwise():
    props, _ = source_properties({"bootstrap.servers": "x:1"})
    assert props["fetch.queue.backoff.ms"] == 10
    props, _ = source_properties({"bootstrap.servers": "x:1", "fetch.queue.backoff.ms": 500})
    assert props["fetch.queue.backoff.ms"] == 500
