"""A member process for the kill test of map_using_service_async
(tests/test_map_using_service_kafka.py).

    python tests/support/service_job_process.py DATA_DIR BOOTSTRAP IN_TOPIC OUT_TOPIC URL

Opens ``Member(DATA_DIR)``. A job that was running there resumes from its last snapshot by
itself; if the directory holds no job yet, the script submits, under exactly-once,

    Kafka(IN_TOPIC) -> map_using_service_async(GET URL?x=value) -> Kafka(OUT_TOPIC)

so every input record ``k -> i`` gives the output record ``k -> i * 10`` (the service's answer),
written by the transactional sink. Prints READY, then sleeps until killed.
"""

from __future__ import annotations

import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def build(bootstrap: str, in_topic: str, out_topic: str, url: str):
    from jetwake import Pipeline, Sinks, Sources
    from support.http_service import aiohttp_factory, fetch

    async def call(session, kv):
        return kv[0], await fetch(session, url, int(kv[1]))

    props = {"bootstrap.servers": bootstrap}
    p = Pipeline()
    (p.read_from(Sources.kafka(in_topic, props, key_deserializer="str",
                               value_deserializer="str"))
      .map_using_service_async(aiohttp_factory(), call, max_concurrent=16)
      .write_to(Sinks.kafka(out_topic, props, key_fn=lambda kv: kv[0],
                            value_fn=lambda kv: str(kv[1]), key_serializer="str",
                            value_serializer="str")))
    return p


def main() -> int:
    data_dir, bootstrap, in_topic, out_topic, url = sys.argv[1:6]
    import faulthandler
    import logging
    faulthandler.register(signal.SIGUSR1)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    # run as a script: tests/ (where `support` is) is not on sys.path by itself
    sys.path.insert(0, os.path.dirname(HERE))
    from jetwake import JobConfig, Member
    from support.restores import record_restores
    record_restores(data_dir)
    member = Member(data_dir, local_parallelism=2)
    if not member.jobs():
        member.new_job(build(bootstrap, in_topic, out_topic, url),
                       JobConfig(name="service-kill-job", processing_guarantee="exactly_once",
                                 snapshot_interval_ms=200))
    print("READY", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
