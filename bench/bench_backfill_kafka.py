"""How a backfill reads Kafka: one confluent-kafka consumer per partition inside the Spark tasks
(what ``SparkRunner`` does) beside Spark's own Kafka source (the ``spark-sql-kafka`` package,
fetched by Spark through ``spark.jars.packages``), on the same topic, in one Spark session.

A topic of ``BACKFILL_KAFKA_RECORDS`` records (2 million by default, keys ``k0``..``k999``, two
partitions) is counted per key:

- per-partition readers: the pipeline ``Sources.kafka(...).group_by(key).aggregate(counting())``
  run by ``SparkRunner`` (records deserialized, counted a chunk at a time);
- Spark's Kafka source to Python rows: ``spark.read.format("kafka")``, then the same decoding
  and counting in ``mapPartitions`` over the rows Spark hands to Python (no jetwake stage
  machinery: the least this path can cost);
- Spark's Kafka source to Arrow batches (``mapInArrow``, when pandas is installed, which
  PySpark's Arrow functions need): the same counting over each batch's key column.

Needs a broker (``KAFKA_BOOTSTRAP_SERVERS``) and the package from a Maven repository; the
package's version is ``BACKFILL_SPARK_KAFKA_VERSION``, by default the pyspark version (when the
repository does not serve that one yet, name an older 4.x: docs/performance.md has the run).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections import _count_elements  # type: ignore[attr-defined]

from .report import figure, timer

RECORDS = int(os.environ.get("BACKFILL_KAFKA_RECORDS", 2_000_000))
ROUNDS = int(os.environ.get("BACKFILL_ROUNDS", 3))
KEYS = 1_000


def produce(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20,
                  "compression.type": "lz4"})
    keys = [f"k{i}".encode() for i in range(KEYS)]
    for i in range(RECORDS):
        while True:
            try:
                p.produce(topic, str(i).encode(), keys[i % KEYS], partition=i % 2)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120):
        raise RuntimeError("the benchmark's records were not all acknowledged")


def count_rows(rows):  # one Spark partition of the Kafka source's rows
    table: dict = {}
    chunk = []
    for row in rows:
        chunk.append((row[0].decode(), row[1].decode()))
        if len(chunk) >= 4096:
            _count_elements(table, map(_key, chunk))
            chunk = []
    _count_elements(table, map(_key, chunk))
    return iter(table.items())


def count_batches(batches):  # mapInArrow: the same over Arrow batches of the key column
    import pyarrow as pa
    table: dict = {}
    for b in batches:
        keys = [k.decode() for k in b.column(0).to_pylist()]
        values = [v.decode() for v in b.column(1).to_pylist()]
        _count_elements(table, map(_key, zip(keys, values)))
    yield pa.RecordBatch.from_pydict({"k": list(table), "n": list(table.values())})


def _key(kv):
    return kv[0]


def _package_version() -> str:
    import pyspark
    return os.environ.get("BACKFILL_SPARK_KAFKA_VERSION", pyspark.__version__)


def main() -> None:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("pyspark is not installed: pip install -e '.[spark]'", file=sys.stderr)
        return
    if not bootstrap:
        print("bench_backfill_kafka: set KAFKA_BOOTSTRAP_SERVERS to a broker", file=sys.stderr)
        return
    from pyspark.sql import SparkSession

    from jetwake import AggregateOperations, Pipeline, Sinks, Sources, SparkRunner

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # read when the context starts
    topic = f"bench-backfill-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic)
    version = _package_version()
    package = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"
    with timer() as t_start:
        try:
            spark = (SparkSession.builder.master("local[2]").appName("bench-backfill-kafka")
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")
                     .config("spark.default.parallelism", "2")
                     .config("spark.sql.shuffle.partitions", "2")
                     .config("spark.jars.packages", package).getOrCreate())
        except Exception as e:  # noqa: BLE001 - report why, then stop
            print(f"bench_backfill_kafka: Spark could not fetch {package}: {e}",
                  file=sys.stderr)
            return
    spark.sparkContext.setLogLevel("ERROR")
    figure(f"Spark session with {package}", t_start[0], "s", "(the package fetched or cached)")
    runner = SparkRunner(spark=spark)

    def pipeline() -> Pipeline:
        p = Pipeline()
        (p.read_from(Sources.kafka(topic, {"bootstrap.servers": bootstrap},
                                   key_deserializer="str", value_deserializer="str"))
          .group_by(_key).aggregate(AggregateOperations.counting())
          .write_to(Sinks.noop()))
        return p

    def readers() -> int:
        return runner.run(pipeline()).counters["stages"]["aggregate"]["items_out"]

    def source_df():
        return (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic).option("startingOffsets", "earliest")
                .option("endingOffsets", "latest").load().select("key", "value"))

    def spark_rows() -> int:
        return source_df().rdd.mapPartitions(count_rows) \
            .reduceByKey(lambda a, b: a + b, 2).count()

    def spark_arrow() -> int:
        return source_df().mapInArrow(count_batches, "k string, n long") \
            .groupBy("k").sum("n").count()

    cases = [("per-partition readers (SparkRunner)", readers),
             ("Spark's Kafka source, rows to Python", spark_rows)]
    try:
        import pandas  # noqa: F401
        cases.append(("Spark's Kafka source, mapInArrow", spark_arrow))
    except ImportError:
        print("(mapInArrow not measured: PySpark's Arrow functions need pandas)")
    best = {name: float("inf") for name, _ in cases}
    for name, run in cases:  # a first run of each warms its code paths up
        assert run() == KEYS, name
    for _ in range(ROUNDS):
        for name, run in cases:
            started = time.perf_counter()
            assert run() == KEYS, name
            best[name] = min(best[name], time.perf_counter() - started)
    for name, seconds in best.items():
        figure(f"backfill Kafka {RECORDS // 1000}k records: {name}", RECORDS / seconds,
               "records/s")
    spark.stop()


if __name__ == "__main__":
    main()
