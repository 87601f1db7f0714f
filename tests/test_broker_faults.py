"""Broker faults under an exactly-once job on a three-member cluster over three brokers.

One job for the whole module: a Kafka input topic (3 partitions, 3 replicas, min.insync 2),
fed by a live producer, through keyed state changed in place in RocksDB (a running
``[sum, count]`` per key) to a Kafka output topic. Each test does one broker fault, checks
that it happened, undoes it, and then checks that the job caught up by itself with every
output record once (a ``read_committed`` reader) and the state exact, as the input says.
A killed broker is started again at once but not waited for: the job must catch up on
the two others meanwhile. The longest stretch without output after each fault is printed (run
with ``-s``) and reported in docs/reliability.md. Brokers gone for good are
tests/test_kafka_unreachable.py's.
"""

from __future__ import annotations

import time
from pathlib import Path

import cloudpickle
import pytest

from bench.chaos.harness import Output
from jetwake import JobConfig
from jetwake.engine.server.client import RemoteError
from support import broker_faults
from support.broker_faults import (
    Brokers, LiveInput, read_input, running_state_pipeline, running_states,
)
from support.cluster_processes import ClusterProcesses
from support.cluster_sums import by_key
from support.waiting import stays_true, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.faults]

PARTITIONS = 3
SESSION_TIMEOUT_S = 6.0       # the members' Kafka session timeout (the default)
SINK_VERTEX = "kafka-sink"
STALLS: dict[str, float] = {}  # fault -> longest stretch without output, for the docs


class Run:
    """The module's cluster, job, live input and output."""

    def __init__(self, tmp: Path, three_brokers, brokers: Brokers) -> None:
        self.bootstrap = three_brokers.bootstrap
        self.brokers = brokers
        self.source = three_brokers.new_topic("bf-in", partitions=PARTITIONS)
        self.sink = three_brokers.new_topic("bf-out", partitions=PARTITIONS)
        self.cluster = ClusterProcesses(tmp, self.bootstrap)
        self.members = self.cluster.start(3)
        # the pipeline's functions travel to the member processes by value
        cloudpickle.register_pickle_by_value(broker_faults)
        try:
            self.job_id = wait_until(self._submit, what="the job submitted", timeout=60,
                                     interval=0.5)
        finally:
            cloudpickle.unregister_pickle_by_value(broker_faults)
        self.input = LiveInput(self.bootstrap, self.source)
        self.output = Output(self.bootstrap, self.sink)
        self.output.start()
        wait_until(lambda: self.output.count() >= 50, what="the job's first output",
                   timeout=90, interval=0.1)

    def _submit(self) -> str | None:
        """Submits the job; None when the member was fenced as coordinator meanwhile (three
        members that have just started may still be moving the role), so it is asked again."""
        try:
            with self.members[0].client() as c:
                return c.new_job(
                    running_state_pipeline(self.bootstrap, self.source, self.sink),
                    JobConfig(name="running", processing_guarantee="exactly_once",
                              snapshot_interval_ms=200, state_backend="rocksdb")).id
        except RemoteError as e:
            if "FencedError" not in str(e):
                raise
            return None

    def transactional_ids(self) -> list[str]:
        return [f"jetwake-{self.job_id}-{SINK_VERTEX}-{i}" for i in range(len(self.members))]

    def assert_caught_up_exactly_once(self, fault: str, since: float) -> None:
        """Waits until the output covers every event acknowledged now, then checks every
        output record against the input: once each, and the running state exact."""
        target = self.input.sent
        wait_until(lambda: self.output.count() >= target,
                   what=lambda: f"output for the {target} events acknowledged after the "
                   f"{fault} (read {self.output.count()})", timeout=180, interval=0.1)
        got = by_key(self.output.snapshot())
        want = running_states(read_input(self.bootstrap, self.source, PARTITIONS))
        for key, values in got.items():
            assert values == want[key][:len(values)], \
                f"key {key}: the output is not the running state of the input, once each"
        STALLS[fault] = round(self.output.longest_stall(since), 2)
        print(f"\nbroker fault '{fault}': the output stopped for at most {STALLS[fault]} s")

    def close(self) -> None:
        self.input.stop()
        self.output.close()
        self.cluster.stop_all()


@pytest.fixture(scope="module")
def brokers(kafka_three_brokers, tmp_path_factory):
    b = Brokers(kafka_three_brokers.bootstrap)
    try:
        yield b
    finally:
        # kept for a failure's post-mortem: the brokers' run directory goes when they stop
        b.save_logs(tmp_path_factory.mktemp("broker-fault-logs"))
        b.heal()


@pytest.fixture(scope="module")
def run(tmp_path_factory, kafka_three_brokers, brokers):
    r = Run(tmp_path_factory.mktemp("broker-faults"), kafka_three_brokers, brokers)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def healed(run):
    """Every broker runs and is in sync before a test, and again after it, whatever it did."""
    run.brokers.heal()
    yield run
    run.brokers.heal()


def test_the_job_goes_on_exactly_once_when_the_leader_of_its_topics_is_killed(healed) -> None:
    run = healed
    node = run.brokers.leader(run.source, 0)
    led = [(t, p) for t in (run.source, run.sink) for p in range(PARTITIONS)
           if run.brokers.leader(t, p) == node]
    since = time.monotonic()
    run.brokers.kill(node)
    wait_until(lambda: all(run.brokers.leader(t, p) not in (node, -1) for t, p in led),
               what=lambda: f"the partitions broker {node} led to have other leaders"
               f"{run.brokers.stopped_nodes()}", timeout=60, interval=0.2)
    run.brokers.restart(node)
    run.assert_caught_up_exactly_once("partition leader killed", since)


def test_the_job_goes_on_exactly_once_when_the_active_controller_is_killed(healed) -> None:
    run = healed
    node, epoch = run.brokers.controller()
    since = time.monotonic()
    run.brokers.kill(node)
    wait_until(lambda: run.brokers.controller()[1] > epoch,
               what=lambda: f"another active controller than {node} at epoch {epoch} (now "
               f"{run.brokers.controller()}; running: {run.brokers.running()})"
               f"{run.brokers.stopped_nodes()}", timeout=60, interval=0.2)
    assert run.brokers.controller()[0] != node
    run.brokers.restart(node)
    run.assert_caught_up_exactly_once("active controller killed", since)


def test_the_job_goes_on_exactly_once_when_its_transaction_coordinator_is_killed(
        healed) -> None:
    run = healed
    coordinators = [run.brokers.transaction_coordinator(t) for t in run.transactional_ids()]
    node = max(set(coordinators), key=coordinators.count)
    since = time.monotonic()
    run.brokers.kill(node)
    wait_until(lambda: all(run.brokers.transaction_coordinator(t) not in (node, -1)
                           for t, c in zip(run.transactional_ids(), coordinators)
                           if c == node),
               what=lambda: f"another transaction coordinator than broker {node}"
               f"{run.brokers.stopped_nodes()}", timeout=60, interval=0.2)
    run.brokers.restart(node)
    run.assert_caught_up_exactly_once("transaction coordinator killed", since)


def test_the_job_goes_on_exactly_once_when_a_broker_is_paused_past_its_session(
        healed) -> None:
    run = healed
    node = run.brokers.leader(run.source, 0)
    since = time.monotonic()
    run.brokers.pause(node)
    # fenced by the controller after broker.session.timeout.ms: its leaderships move
    wait_until(lambda: run.brokers.leader(run.source, 0) not in (node, -1),
               what=f"input partition 0 led by another broker than the paused {node}",
               timeout=60, interval=0.2)
    assert time.monotonic() - since > SESSION_TIMEOUT_S
    run.brokers.resume(node)
    run.assert_caught_up_exactly_once("broker paused", since)
    wait_until(lambda: node in run.brokers.isr(run.source, 0), what=f"broker {node} back in "
               "sync", timeout=90, interval=0.2)


def test_the_job_restarts_by_itself_exactly_once_when_every_broker_was_stopped(
        healed) -> None:
    run = healed
    since = time.monotonic()
    for node in run.brokers.nodes:
        run.brokers.kill(node)
    stays_true(lambda: all(run.brokers.pid(n) is None for n in run.brokers.nodes),
               seconds=SESSION_TIMEOUT_S + 2, what="every broker stopped")
    wait_until(lambda: all("cannot reach Kafka" in m.log for m in run.members),
               what="every member to say it cannot reach Kafka", timeout=30, interval=0.2)
    run.brokers.heal()
    run.assert_caught_up_exactly_once("every broker stopped", since)
    assert all(m.alive() for m in run.members)
