"""A Kafka job whose brokers are gone for good fails, naming them and how long they have been
silent (``jetwake.unreachable.timeout.ms``), instead of retrying forever where only the log
shows it. The broker is a private one the test stops: the session's broker stays up."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from jetwake import JobConfig, JobStatus, Member, Pipeline, Sinks, Sources
from support.kafka_broker import private_broker
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def test_a_job_whose_brokers_are_gone_for_good_fails_naming_them_and_how_long(
        tmp_path: Path) -> None:
    with private_broker() as (kl, port, bootstrap):
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(50):
            producer.produce("in", key=f"k{i % 5}", value=json.dumps(i))
        producer.flush(30)
        props = {"bootstrap.servers": bootstrap, "jetwake.unreachable.timeout.ms": 3000,
                 "jetwake.partition.discovery.ms": 1000}
        p = Pipeline()
        (p.read_from(Sources.kafka("in", props, key_deserializer="str",
                                   value_deserializer="json"))
          .write_to(Sinks.kafka("out", {"bootstrap.servers": bootstrap},
                                key_serializer="str", value_serializer="json")))
        with Member(tmp_path / "member") as member:
            job = member.new_job(p, JobConfig(name="gone", processing_guarantee="exactly_once",
                                              snapshot_interval_ms=200))
            wait_until(lambda: sum(m.get("records_in", 0) for m in job.metrics().values())
                       >= 50, what="the job reading its input", timeout=60, interval=0.1)
            kl.stop_broker(port)
            gone = time.monotonic()
            assert not kl.broker_ready(bootstrap, 1), "the broker still answers"
            wait_until(lambda: job.get_status() == JobStatus.FAILED,
                       what=lambda: f"the job to fail (it is {job.get_status()}: "
                                    f"{job.failure})", timeout=90, interval=0.2)
            failed_after = time.monotonic() - gone
            failure = job.failure or ""
    assert failed_after >= 3.0
    assert "KafkaUnreachableError" in failure or "have not answered" in failure
    assert f"the Kafka brokers at {bootstrap} have not answered for" in failure
    assert "jetwake.unreachable.timeout.ms=3000" in failure
