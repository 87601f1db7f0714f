"""Kafka on the Spark backfill: ``Sources.kafka``'s Spark reader (the offset ranges to read, a
consumer per partition inside a Spark task) and ``Sinks.kafka``'s Spark writer (a producer per
Spark task).

Why readers in Spark tasks rather than Spark's own Kafka source: measured on one topic, the
readers take 2.1M records/s into the pipeline, Spark's source 0.15M/s handing JVM rows to Python
and 0.95M/s through Arrow batches (docs/backfill.md, docs/performance.md); the records are
consumed in Python either way, and only here does the reading know the source's deserializers,
projection and ``on_error``. Spark's source also needs its package's jars from a Maven
repository at start-up, in the version of Spark.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from jetwake.engine.backfill.connector_forms import SparkReader, SparkWriter
from jetwake.engine.backfill.stage_output import StageOut
from jetwake.engine.core.errors import JetwakeError
from jetwake.connectors.kafka.serde import KafkaRecord
from jetwake.connectors.kafka.client_log import with_client_log
from jetwake.connectors.kafka.source import KafkaDeserializationError, KafkaSourceEntries

__all__ = ["BackfillKafkaError", "KafkaSparkReader", "KafkaSparkWriter", "OffsetRange",
           "offset_ranges", "read_range", "write_partition"]


class BackfillKafkaError(JetwakeError):
    """A Kafka source or sink of a backfill cannot run: a missing topic, brokers that do not
    answer, an ``until`` before the start."""


OffsetRange = tuple  # (topic, topic index, partition, start offset, end offset)


class KafkaSparkReader(SparkReader):
    """``Sources.kafka`` on the Spark backfill: one Spark partition per Kafka partition, read
    from the source's ``start`` up to the run's ``until`` by a consumer in the task, records
    deserialized as the streaming source does. With a hand-off, the source's snapshot entry
    (``KafkaSourceProcessor``'s) holds the next offset of every partition."""

    def __init__(self, topics: list[str], properties: dict, start: Any,
                 key_deserializer: Callable[[Any], Any] | None,
                 value_deserializer: Callable[[Any], Any] | None,
                 projection: Callable[[Any], Any] | None, on_error: str,
                 dead_letter_topic: str | None) -> None:
        self.topics = tuple(topics)
        self.properties = properties
        self.start = start
        self.key_deserializer = key_deserializer
        self.value_deserializer = value_deserializer
        self.projection = projection
        self.on_error = on_error
        self.dead_letter_topic = dead_letter_topic

    def bounds(self, until: Any) -> list[OffsetRange]:
        return offset_ranges(self, until)

    def read(self, backfill: Any, t: Any, bounds: Any) -> StageOut:
        ranges: list[OffsetRange] = bounds
        for topic, _, p, _, end in ranges:
            backfill.offsets.setdefault(topic, {})[p] = end
        count = backfill.task_counter()
        rdd = backfill.sc.parallelize(ranges, max(1, len(ranges))).flatMap(
            lambda r: read_range(r, self, count), preservesPartitioning=True)
        if backfill.export_state:
            rdd = rdd.persist()
            self._hand_off_entry(backfill, t, ranges)
        return StageOut(rdd, timed=True, unbounded=True)

    @staticmethod
    def _hand_off_entry(backfill: Any, t: Any, ranges: list[OffsetRange]) -> None:
        """The source's snapshot entry (``KafkaSourceEntries``): the next
        offset of every partition, and each partition's highest event time once the
        timestamp stage that runs in the source has found it."""
        counts: dict = {}
        for topic, _, p, _, _ in ranges:
            counts[topic] = max(counts.get(topic, 0), p + 1)
        offsets = [[topic, p, end, None] for topic, _, p, _, end in ranges]
        backfill.driver_state.append((t.name, *KafkaSourceEntries.offsets(0, offsets, counts)))

        def record(tops: list) -> None:  # one Spark partition per Kafka partition
            for i, ts in tops:
                offsets[i][3] = ts
        backfill.on_partition_tops(t, record)


class KafkaSparkWriter(SparkWriter):
    """``Sinks.kafka`` on the Spark backfill: a producer per task, idempotent, or with
    ``exactly_once`` one transaction per task (see :func:`write_partition`)."""

    def __init__(self, fmt: Any, exactly_once: bool | None) -> None:
        self.fmt, self.exactly_once = fmt, exactly_once

    def write(self, backfill: Any, t: Any, chunks: Any) -> int:
        import uuid

        fmt = self.fmt
        txn = f"jetwake-backfill-{uuid.uuid4().hex[:12]}-{t.name}" if self.exactly_once \
            else None
        try:
            return chunks.mapPartitionsWithIndex(lambda i, it: [write_partition(
                i, it, fmt, f"{txn}-{i}" if txn else None)]).sum()
        except BaseException:
            if txn is not None:  # tasks Spark killed when the job failed left theirs open
                fence_transactions(fmt, [f"{txn}-{i}" for i in range(chunks.getNumPartitions())])
            raise


def _consumer(props: dict, group: str) -> Any:
    from confluent_kafka import Consumer

    conf = {k: v for k, v in props.items() if k not in ("group.id",)}
    conf.update({"group.id": group, "enable.auto.commit": False,
                 "enable.partition.eof": False})
    return Consumer(with_client_log(conf))


def offset_ranges(source: KafkaSparkReader, until: Any,
                  timeout: float = 10.0) -> list[OffsetRange]:
    """The ``[start, end)`` offsets of every partition of the source's topics: the start by
    the source's ``start``, the end by ``until``; fails when a topic is missing, the brokers
    do not answer or ``until`` lies before the start."""
    from confluent_kafka import KafkaException, TopicPartition

    props = source.properties
    servers = props.get("bootstrap.servers")
    consumer = _consumer(props, "jetwake-backfill-ranges")
    try:
        try:
            md = consumer.list_topics(timeout=timeout)
        except KafkaException as err:
            raise BackfillKafkaError(f"Sources.kafka(): the Kafka brokers at {servers} did not "
                                     f"answer within {timeout:.0f} s: {err}") from None
        missing = [t for t in source.topics if t not in md.topics
                   or md.topics[t].error is not None or not md.topics[t].partitions]
        if missing:
            raise BackfillKafkaError(f"Sources.kafka(): topic(s) {missing} do not exist on "
                                     f"{servers}; create them first, or fix the topic names")
        tps = [(t, ti, p) for ti, t in enumerate(source.topics)
               for p in sorted(md.topics[t].partitions)]
        marks = {(t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=timeout)
                 for t, _, p in tps}

        def at_time(ms: int) -> dict:
            found = consumer.offsets_for_times([TopicPartition(t, p, ms) for t, _, p in tps],
                                               timeout=timeout)
            return {(x.topic, x.partition): (x.offset if x.offset >= 0
                                             else marks[(x.topic, x.partition)][1])
                    for x in found}

        start = source.start
        if start == "earliest":
            starts = {tp: lo for tp, (lo, _) in marks.items()}
        elif start == "latest":
            starts = {tp: hi for tp, (_, hi) in marks.items()}
        else:
            starts = at_time(int(start))
        if until == "latest":
            ends = {tp: hi for tp, (_, hi) in marks.items()}
        elif isinstance(until, int):
            ends = at_time(until)
        else:
            ends = {}
            for t, _, p in tps:
                if t not in until:
                    raise ValueError(f"until: no offsets for topic {t!r} (its partitions: "
                                     f"{sorted(md.topics[t].partitions)})")
                if p not in until[t]:
                    raise ValueError(f"until: no offset for partition {p} of topic {t!r}")
                ends[(t, p)] = until[t][p]
                if ends[(t, p)] > marks[(t, p)][1]:
                    raise ValueError(
                        f"until: offset {until[t][p]} of partition {p} of topic {t!r} lies "
                        f"beyond its end ({marks[(t, p)][1]}): a backfill reads what the topic "
                        "holds; give an offset up to the end, or until='latest'")
        out = []
        for t, ti, p in tps:
            s, e = starts[(t, p)], ends[(t, p)]
            if e < s:
                raise ValueError(
                    f"until lies before start: partition {p} of topic {t!r} would end at "
                    f"offset {e} but starts at {s} (start={start!r}); choose a later until "
                    "or an earlier start")
            out.append((t, ti, p, s, min(e, marks[(t, p)][1])))
        return out
    finally:
        consumer.close()


def read_range(r: OffsetRange, source: KafkaSparkReader, count: Callable[[str, int], None],
               stall_timeout: float = 60.0) -> Iterator[list]:
    """The records of one offset range, in offset order, as chunks of elements ``(record time,
    None, item)`` (``chunks.py``), deserialized as the streaming source does; a record that
    cannot be read fails the run or goes to the dead-letter topic (``on_error``)."""
    from confluent_kafka import KafkaError, TopicPartition

    topic, _, partition, start, end = r
    if end <= start:
        return
    kd, vd = source.key_deserializer, source.value_deserializer
    projection = source.projection
    consumer = _consumer(source.properties, f"jetwake-backfill-{topic}")
    dead = None
    tp = TopicPartition(topic, partition, start)
    consumer.assign([tp])
    n = 0
    try:
        deadline = time.monotonic() + stall_timeout
        pos = start
        while pos < end:
            msgs = consumer.consume(2000, 0.5)
            if not msgs:
                # a range may end in transaction markers, which no consumer ever sees
                here = consumer.position([TopicPartition(topic, partition)])[0].offset
                if here >= end:
                    break
                if time.monotonic() > deadline:
                    raise BackfillKafkaError(
                        f"Sources.kafka(): partition {partition} of {topic!r} gave no record "
                        f"for {stall_timeout:.0f} s at offset {pos} (reading up to {end})")
                continue
            deadline = time.monotonic() + stall_timeout
            chunk = []
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    if err.fatal():
                        raise BackfillKafkaError(f"Sources.kafka(): fatal consumer error: {err}")
                    continue
                off = m.offset()
                if off >= end:
                    pos = end
                    break
                pos = off + 1
                try:
                    k, v = m.key(), m.value()
                    if kd is not None:
                        k = kd(k)
                    if vd is not None:
                        v = vd(v)
                    item = projection(KafkaRecord(topic, partition, off, m.timestamp()[1], k, v,
                                                  m.headers() or [])) \
                        if projection is not None else (k, v)
                except Exception as e:  # noqa: BLE001 - fail or dead-letter, as the source does
                    if source.on_error != "dead_letter":
                        raise KafkaDeserializationError(
                            f"Sources.kafka(): cannot deserialize the record at topic "
                            f"{topic!r}, partition {partition}, offset {off}: "
                            f"{type(e).__name__}: {e}. Pass on_error='dead_letter' with a "
                            "dead_letter_topic to route such records aside") from e
                    if dead is None:
                        from jetwake.connectors.kafka.dead_letter import DeadLetterWriter
                        assert source.dead_letter_topic is not None  # Sources.kafka checks
                        dead = DeadLetterWriter(source.dead_letter_topic, source.properties)
                    dead.write(m, e)
                    count("dead_letters", 1)
                    n += 1
                    continue
                chunk.append((m.timestamp()[1], None, item))
            n += len(chunk)
            if chunk:
                yield chunk
        if dead is not None:
            dead.flush()
    finally:
        count("records_in", n)
        if dead is not None:
            dead.close()
        consumer.close()


def write_partition(index: int, chunks: Iterator[list], fmt: Any,
                    transactional_id: str | None) -> int:
    """Produces the items of one Spark task (its chunks of items) to ``fmt.topic``: an
    idempotent producer, or with
    ``transactional_id`` one transaction for the whole task (a retried or speculative attempt
    of the task has the same id, so its ``init_transactions`` fences the earlier attempt and
    aborts what it left open). Returns the number of records written."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer(_producer_config(fmt, transactional_id))
    errors: list = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    if transactional_id is not None:
        producer.init_transactions(60)
        producer.begin_transaction()
    n = 0

    def produce(batch: list) -> None:
        keys, values = fmt.keys_and_values(batch)
        for k, v in zip(keys, values):
            while True:
                try:
                    producer.produce(fmt.topic, v, k, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)

    try:
        for batch in chunks:
            if batch:
                produce(batch)
                n += len(batch)
        if transactional_id is not None:
            producer.commit_transaction(120)
        elif producer.flush(120) > 0:
            raise BackfillKafkaError(f"{fmt.where}: records were not acknowledged in 120 s")
        if errors:
            raise BackfillKafkaError(f"{fmt.where}: {len(errors)} record(s) failed: {errors[0]}")
    except KafkaException as e:
        _abort(producer, transactional_id)
        raise BackfillKafkaError(f"{fmt.where}: {e}") from None
    except BaseException:
        _abort(producer, transactional_id)  # a function of the pipeline raised: nothing stays
        raise
    return n


def fence_transactions(fmt: Any, transactional_ids: list[str]) -> None:
    """Aborts whatever transaction each of ``transactional_ids`` left open (a task Spark killed
    when the job failed never aborted its own): a producer that takes over an id fences the
    earlier one, and the broker aborts its open transaction. Otherwise read_committed
    consumers of the topic would wait at it for the transaction's timeout."""
    from confluent_kafka import KafkaException, Producer

    for tid in transactional_ids:
        try:
            Producer(_producer_config(fmt, tid)).init_transactions(30)
        except KafkaException:
            pass  # the run's own failure is what the caller reports


def _producer_config(fmt: Any, transactional_id: str | None) -> dict:
    """The sink's producer settings: idempotent, and transactional under ``transactional_id``
    (one transaction spans a whole task, which may write for minutes: librdkafka's default
    timeout, 60 s, would let the broker abort it; 15 min is the brokers' default maximum)."""
    props = dict(fmt.properties)
    props["enable.idempotence"] = True
    if transactional_id is not None:
        props["transactional.id"] = transactional_id
        props.setdefault("transaction.timeout.ms", 900_000)
    return with_client_log(props)


def _abort(producer: Any, transactional_id: str | None) -> None:
    """Aborts the task's open transaction, so that read_committed consumers are not held at
    it until the broker's transaction timeout (a retried attempt would fence it too)."""
    if transactional_id is None:
        return
    try:
        producer.abort_transaction(30)
    except Exception:  # noqa: BLE001 - not begun, already ended, or fenced: nothing to undo
        pass
