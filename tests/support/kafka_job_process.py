"""A member process for the Kafka fault tests (tests/test_kafka_faults.py).

    python tests/support/kafka_job_process.py DATA_DIR BOOTSTRAP IN_TOPIC OUT_TOPIC [options]

Opens ``Member(DATA_DIR)``. A job that was running there resumes from its last snapshot by
itself; if the directory holds no job yet, the script submits

    Kafka(IN_TOPIC) -> group_by(key).rolling_aggregate(counting()) -> Kafka(OUT_TOPIC)

with the given guarantee, so every input record with key ``k`` produces the record
``k -> "<count of k so far>"``: a reader that sees every output record exactly once also sees
exact per-key state. Then it sleeps until killed.

``--die-in-phase2 K``: the sink processor kills its own process (SIGKILL) at the start of the
K-th phase 2 it runs, after the snapshot's commit record and before the Kafka commit (once:
the file DATA_DIR/died-in-phase2 remembers it).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def build(bootstrap: str, in_topic: str, out_topic: str, die_in_phase2: int,
          exactly_once: bool | None, marker: str = ""):
    from jetwake import AggregateOperations, Pipeline, Sinks, Sources
    from jetwake.connectors.kafka.sink_exactly_once import KafkaExactlyOnceSinkProcessor
    from support.sink_processors import replace_processor_class

    props = {"bootstrap.servers": bootstrap}
    sink = Sinks.kafka(out_topic, props, key_fn=lambda kv: kv[0],
                       value_fn=lambda kv: str(kv[1]), key_serializer="str",
                       value_serializer="str", exactly_once=exactly_once)
    if die_in_phase2:
        class DyingSink(KafkaExactlyOnceSinkProcessor):
            phase2_calls = 0

            def snapshot_commit_finish(self, success: bool) -> bool:
                if self.context.snapshot_id in self.prepared_snapshot_ids():
                    DyingSink.phase2_calls += 1
                    if DyingSink.phase2_calls >= die_in_phase2 and not os.path.exists(marker):
                        open(marker, "w").close()  # once: the restarted job must not die
                        os.kill(os.getpid(), signal.SIGKILL)
                return super().snapshot_commit_finish(success)

        replace_processor_class(sink, KafkaExactlyOnceSinkProcessor, DyingSink)

    p = Pipeline()
    (p.read_from(Sources.kafka(in_topic, props, key_deserializer="str",
                               value_deserializer="str"))
      .group_by(lambda kv: kv[0])
      .rolling_aggregate(AggregateOperations.counting())
      .set_name("running-count")
      .write_to(sink))
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir")
    ap.add_argument("bootstrap")
    ap.add_argument("in_topic")
    ap.add_argument("out_topic")
    ap.add_argument("--guarantee", default="exactly_once")
    ap.add_argument("--interval-ms", type=int, default=200)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--die-in-phase2", type=int, default=0)
    ap.add_argument("--at-least-once-sink", action="store_true")
    args = ap.parse_args(argv)
    import faulthandler
    import logging
    faulthandler.register(signal.SIGUSR1)  # thread dumps on demand, for debugging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    from jetwake import JobConfig, Member

    # run as a script: tests/ (where `support` is) is not on sys.path by itself
    sys.path.insert(0, os.path.dirname(HERE))
    from support.restores import record_restores
    record_restores(args.data_dir)

    member = Member(args.data_dir, local_parallelism=args.parallelism)
    jobs = member.jobs()
    if not jobs:
        pipeline = build(args.bootstrap, args.in_topic, args.out_topic, args.die_in_phase2,
                         False if args.at_least_once_sink else None,
                         os.path.join(os.path.abspath(args.data_dir), "died-in-phase2"))
        member.new_job(pipeline, JobConfig(name="kafka-fault-job",
                                           processing_guarantee=args.guarantee,
                                           snapshot_interval_ms=args.interval_ms))
    print("READY", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
