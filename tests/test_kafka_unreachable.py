"""Kafka jobs whose brokers are gone for good fail, naming them and how long they have been
silent (``jetwake.unreachable.timeout.ms``), instead of retrying forever where only the log
shows it: a job that reads and writes Kafka, and a job whose only Kafka connector is its
sink. The clock starts when the brokers first fail to answer and runs across the jobs'
restarts, so the jobs fail soon after the bound, not after their commit retries and restarts.
The broker is a private one the test stops: the session's broker stays up."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from jetwake import JobConfig, JobStatus, Member, Pipeline, Sinks, Sources
from jetwake.testing import TestSources
from support.kafka_broker import private_broker
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

BOUND_MS = 3000


def _reads_and_writes(bootstrap: str, bounded: dict) -> Pipeline:
    p = Pipeline()
    (p.read_from(Sources.kafka("in", {**bounded, "jetwake.partition.discovery.ms": 500},
                               key_deserializer="str", value_deserializer="json"))
      .write_to(Sinks.kafka("out", bounded, key_serializer="str", value_serializer="json")))
    return p


def _only_writes(bootstrap: str, bounded: dict) -> Pipeline:
    p = Pipeline()
    (p.read_from(TestSources.item_stream(50, lambda ts, seq: (f"k{seq % 5}", seq)))
      .write_to(Sinks.kafka("out2", bounded, key_serializer="str", value_serializer="json")))
    return p


def _metric(job, key: str) -> int:
    return sum(m.get(key, 0) for m in job.metrics().values())


def test_kafka_jobs_whose_brokers_are_gone_for_good_fail_soon_after_the_bound(
        tmp_path: Path) -> None:
    with private_broker(("in", "out", "out2")) as (kl, port, bootstrap):
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(50):
            producer.produce("in", key=f"k{i % 5}", value=json.dumps(i))
        producer.flush(30)
        bounded = {"bootstrap.servers": bootstrap, "jetwake.unreachable.timeout.ms": BOUND_MS}
        config = dict(processing_guarantee="exactly_once", snapshot_interval_ms=200)
        with Member(tmp_path / "member") as member:
            reads = member.new_job(_reads_and_writes(bootstrap, bounded),
                                   JobConfig(name="reads", **config))
            writes = member.new_job(_only_writes(bootstrap, bounded),
                                    JobConfig(name="writes", **config))
            wait_until(lambda: _metric(reads, "records_out") >= 50
                       and _metric(writes, "records_out") > 0,
                       what="both jobs writing to Kafka", timeout=60, interval=0.1)
            gone = time.monotonic()  # the broker stops answering while it shuts down
            kl.stop_broker(port)
            assert not kl.broker_ready(bootstrap, 1), "the broker still answers"
            failed_after: dict[str, float] = {}

            def note_failed() -> bool:
                for job in (reads, writes):
                    if job.name not in failed_after and job.get_status() == JobStatus.FAILED:
                        failed_after[job.name] = time.monotonic() - gone
                return len(failed_after) == 2
            wait_until(note_failed, what=lambda: "both jobs to fail (they are "
                       f"{[(j.get_status(), j.failure) for j in (reads, writes)]})",
                       timeout=60, interval=0.1)
            failures = {job.name: job.failure or "" for job in (reads, writes)}
    print(f"\nbrokers gone for good: FAILED after {failed_after} s (bound {BOUND_MS} ms): "
          f"{failures}")
    for name, failure in failures.items():
        assert "KafkaUnreachableError" in failure, (name, failure)
        assert f"the Kafka brokers at {bootstrap} have not answered for" in failure, failure
        assert f"jetwake.unreachable.timeout.ms={BOUND_MS}" in failure, failure
    # the clock started when the broker went, not at the jobs' later restarts or retries
    assert all(after >= BOUND_MS / 1000 for after in failed_after.values()), failed_after
    assert all(after < 20 for after in failed_after.values()), failed_after


def test_a_cluster_whose_brokers_are_gone_for_good_says_so_to_a_client(tmp_path: Path) -> None:
    """On a cluster the membership and the jobs' records live on the same brokers: once they
    are gone for good no member coordinates, and a client asking for a job's status is told
    that Kafka does not answer and where, instead of a bare connection error or a wait with
    no end."""
    from jetwake.engine.cluster.member_calls import COORDINATOR_WAIT_S
    from support.cluster_processes import ClusterProcesses

    with private_broker(("in", "out")) as (kl, port, bootstrap):
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(50):
            producer.produce("in", key=f"k{i % 5}", value=json.dumps(i))
        producer.flush(30)
        bounded = {"bootstrap.servers": bootstrap, "jetwake.unreachable.timeout.ms": BOUND_MS}
        cluster = ClusterProcesses(tmp_path, bootstrap)
        try:
            members = cluster.start(2)
            with members[0].client() as client:
                job = client.new_job(_reads_and_writes(bootstrap, bounded),
                                     JobConfig(name="reads", processing_guarantee="exactly_once",
                                               snapshot_interval_ms=200))
                wait_until(lambda: _metric(job, "records_out") >= 50, timeout=60,
                           interval=0.1, what="the job writing to Kafka")
                kl.stop_broker(port)
                assert not kl.broker_ready(bootstrap, 1), "the broker still answers"
                asked = time.monotonic()
                with pytest.raises(Exception) as told:
                    wait_until(lambda: job.refresh()["status"] == "NEVER", timeout=120,
                               what="an error from the status call")
                waited = time.monotonic() - asked
        finally:
            cluster.stop_all()
    message = str(told.value)
    assert "NotCoordinatorError" in type(told.value).__name__ + message, message
    assert f"Kafka at {bootstrap} did not answer" in message, message
    assert waited < COORDINATOR_WAIT_S * 3, waited
