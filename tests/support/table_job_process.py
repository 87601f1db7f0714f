"""A member process for the table restart test (tests/test_tables.py; the test SIGKILLs it).

    python tests/support/table_job_process.py DATA_DIR BOOTSTRAP STREAM TABLE OUT

Opens ``Member(DATA_DIR)``. A job that was running there resumes from its last snapshot by
itself; if the directory holds no job yet, the script submits

    Kafka(STREAM).join_table(Kafka table(TABLE)) -> Kafka(OUT)

(partitioned, inner, the table in RocksDB, exactly-once, snapshots every 200 ms): each stream
record ``k -> {"n": i}`` gives ``k -> [i, table value of k]``. Then it prints READY and sleeps
until killed.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    data_dir, bootstrap, stream, table, out = sys.argv[1:6]
    import logging
    logging.basicConfig(level=logging.WARNING)
    from jetwake import JobConfig, Member, Pipeline, Sinks, Sources

    sys.path.insert(0, os.path.dirname(HERE))  # run as a script: tests/ is not on sys.path
    from support.restores import record_restores
    record_restores(data_dir)

    member = Member(data_dir, local_parallelism=2)
    if not member.jobs():
        props = {"bootstrap.servers": bootstrap}
        p = Pipeline()
        t = p.read_from(Sources.kafka_table(table, props, key_deserializer="str",
                                            value_deserializer="json")).set_name("table")
        (p.read_from(Sources.kafka(stream, props, key_deserializer="str",
                                   value_deserializer="json"))
          .join_table(t, lambda kv: kv[0], lambda kv, value: (kv[0], [kv[1]["n"], value]))
          .set_name("joined")
          .write_to(Sinks.kafka(out, props, key_fn=lambda kv: kv[0], value_fn=lambda kv: kv[1],
                                key_serializer="str", value_serializer="json")))
        member.new_job(p, JobConfig(name="tables", processing_guarantee="exactly_once",
                                    snapshot_interval_ms=200, state_backend="rocksdb"))
    print("READY", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
