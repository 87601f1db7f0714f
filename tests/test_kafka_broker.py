"""Round trips through a real Kafka broker (tests/support/kafka_broker.py says where it comes
from)."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from support.waiting import poll_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _consume(consumer: Consumer, want: int, timeout: float = 20.0, until=None):
    """Poll until `want` records (or `until(record)` is true); return them in poll order."""
    out = []

    def enough() -> bool:
        msg = consumer.poll(0.5)
        if msg is None:
            return False
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                return False
            raise AssertionError(f"consumer error: {msg.error()}")
        out.append(msg)
        return len(out) >= want or until is not None and until(msg)
    poll_until(enough, timeout=timeout, interval=0)
    return out


def test_produce_and_consume_three_partitions(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=3)
    n = 300
    expected = {f"key-{i % 17}".encode(): [] for i in range(n)}
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5})
    delivered = []
    for i in range(n):
        key, value = f"key-{i % 17}".encode(), f"value-{i}".encode()
        expected[key].append(value)
        producer.produce(topic, key=key, value=value,
                         on_delivery=lambda err, msg: delivered.append((err, msg.partition())))
    assert producer.flush(15) == 0
    assert len(delivered) == n and all(err is None for err, _ in delivered)
    assert {p for _, p in delivered} == {0, 1, 2}, "keys should spread over all 3 partitions"

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap,
                         "group.id": f"jetwake-test-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        records = _consume(consumer, n)
    finally:
        consumer.close()

    assert len(records) == n
    got: dict[bytes, list[bytes]] = {}
    partition_of: dict[bytes, int] = {}
    for msg in records:
        assert msg.topic() == topic
        got.setdefault(msg.key(), []).append(msg.value())
        # the same key always lands in the same partition ...
        assert partition_of.setdefault(msg.key(), msg.partition()) == msg.partition()
    # ... so per-key order is preserved, and every key/value pair came back exactly once
    assert got == expected


def test_read_committed_hides_aborted_transaction(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap,
                         "transactional.id": f"jetwake-tx-{uuid.uuid4().hex[:8]}",
                         "transaction.timeout.ms": 30000})
    producer.init_transactions(30)

    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"tx1", value=f"committed-{i}".encode())
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"tx2", value=f"aborted-{i}".encode())
    producer.flush(15)  # make sure the aborted records really reach the log
    producer.abort_transaction(30)

    producer.begin_transaction()
    producer.produce(topic, key=b"tx3", value=b"end")
    producer.commit_transaction(30)

    def read(isolation: str) -> list[bytes]:
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "unused",
                             "isolation.level": isolation, "enable.auto.commit": False,
                             "enable.partition.eof": True})
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            return [m.value() for m in _consume(consumer, 100, until=lambda m: m.value() == b"end")]
        finally:
            consumer.close()

    committed = read("read_committed")
    assert committed == [f"committed-{i}".encode() for i in range(5)] + [b"end"]

    # the aborted records are in the log: a read_uncommitted consumer does see them
    uncommitted = read("read_uncommitted")
    assert [v for v in uncommitted if v.startswith(b"aborted-")] == \
        [f"aborted-{i}".encode() for i in range(5)]
    assert uncommitted[-1] == b"end"
