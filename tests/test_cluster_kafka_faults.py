"""The cluster and its broker: when Kafka is away (the broker paused with SIGSTOP, so every
connection to it hangs), the members say so and retry; when it is back, the cluster recovers
by itself and the exactly-once job loses and duplicates nothing."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from support.cluster_processes import ClusterProcesses
from support.kafka_broker import TEST_BROKER_CONFIG, _kafka_local, session_timeout_ms
from support.cluster_sums import (
    Output, by_key, job_status, new_topic, produce_events, running_sums, submit_sums,
)
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.faults]


@pytest.fixture(scope="module")
def own_broker():
    """A broker of this module's own: pausing it must not stop other tests' broker."""
    kl = _kafka_local()
    port = kl.free_port()
    try:
        bootstrap = kl.start_broker(port, broker_config=TEST_BROKER_CONFIG)
    except Exception as e:  # noqa: BLE001
        kl.stop_broker(port)
        pytest.fail(f"the module's own broker did not start: {e}", pytrace=False)
    pids = kl.broker_status(port)["alive_pids"]
    try:
        yield bootstrap, pids
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        kl.stop_broker(port)


@pytest.fixture
def cluster(tmp_path: Path, own_broker):
    c = ClusterProcesses(tmp_path, own_broker[0])
    yield c
    c.stop_all()


def test_the_cluster_recovers_by_itself_when_its_broker_comes_back(
        cluster: ClusterProcesses, tmp_path: Path, own_broker) -> None:
    bootstrap, broker_pids = own_broker
    # the members lose their place once their session times out: a short one
    members = cluster.start(2, "--session-timeout", str(session_timeout_ms(bootstrap)))
    source, sink = new_topic(bootstrap), new_topic(bootstrap)
    first = [(f"k{i % 11}", i) for i in range(1000)]
    produce_events(bootstrap, source, first)
    job = submit_sums(cluster, members[0], tmp_path, bootstrap, source, sink)
    out = Output(bootstrap, sink)
    wait_until(lambda: out.has(len(first)), what="the first sums", timeout=60, interval=0)
    for pid in broker_pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        # longer than the session timeout: every member's session is gone when it is back
        wait_until(lambda: all("lost its place in cluster" in m.log for m in members),
                   what="every member to say that Kafka does not answer", timeout=60, interval=0.1)
    finally:
        for pid in broker_pids:
            os.kill(pid, signal.SIGCONT)
    second = [(f"k{i % 11}", i) for i in range(1000, 2000)]
    produce_events(bootstrap, source, second)
    wait_until(lambda: out.has(len(first) + len(second)), what="the sums after Kafka came back",
               timeout=180, interval=0)
    out.drain()
    out.close()
    # the job may finish its catching-up before the last member is back in the group
    wait_until(lambda: all("is back in cluster" in m.log for m in members),
               what="every member to say it is back in the cluster", timeout=60, interval=0.1)
    assert all(m.alive() for m in members)
    wait_until(lambda: len(cluster.cluster(members[1])["members"]) == 2,
               what="the cluster to show both members", timeout=30, interval=0.1)
    assert job_status(cluster, members[1], job["id"])["status"] == "RUNNING"
    assert len(out.records) == len(first) + len(second), "a record was written twice"
    assert by_key(out.records) == running_sums(first + second)
