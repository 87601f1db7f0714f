"""A network partition cuts one member off while an exactly-once Kafka job runs on three.

Each member runs in a network namespace of its own, joined to the host by a bridge where a
Kafka broker of this module listens (tests/support/network_partition.py). A member is cut off from
everything (Kafka and its peers) or only from its peers, with the quorum rule
(split-brain protection) on or off; a read_committed consumer of the sink topic must see every
rolling sum exactly once and exact, whatever the partition did. The broker is the module's own
(started from tests/support/local_kafka on the bridge's address, a few seconds): the session's
broker listens on loopback, which the namespaces cannot reach.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.cluster_processes import ClusterMemberProcess, ClusterProcesses
from support.kafka_broker import (
    TEST_BROKER_CONFIG, _kafka_local, session_timeout_ms, watch_for_orphaning,
)
from support.network_partition import NamespacesUnavailable, PartitionNetwork
from support.cluster_sums import (
    Output, by_key, new_topic, produce_events, running_sums, sums_job_file,
)
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.faults]

# members listen for clients on this port, each in its own namespace (so the same one)
CLIENT_PORT = 5701


@pytest.fixture(scope="module")
def net():
    """Three namespaces on a bridge, for the module; skips where namespaces cannot be made."""
    try:
        network = PartitionNetwork(3)
    except NamespacesUnavailable as e:
        pytest.skip(str(e))
    try:
        yield network
    finally:
        network.close()


@pytest.fixture(scope="module")
def bridge_kafka(net: PartitionNetwork):
    """A broker of this module listening on the bridge's address, where the members in their
    namespaces reach it (the session's broker listens on loopback, which they cannot)."""
    kl = _kafka_local()
    port = kl.free_port()
    try:
        bootstrap = kl.start_broker(port, host=net.host_address,
                                    broker_config=TEST_BROKER_CONFIG)
        watch_for_orphaning(port)
        yield bootstrap
    finally:
        kl.stop_broker(port)


class NamespacedMember(ClusterMemberProcess):
    """A ``jetwake member start --cluster`` process in namespace ``slot`` of the network,
    listening for clients and peers on that namespace's address."""

    def __init__(self, root: Path, index: int, cluster: str, bootstrap: str, token: str,
                 net: PartitionNetwork, slot: int, extra: tuple[str, ...] = ()) -> None:
        self.slot = slot
        self.port = CLIENT_PORT
        self.address = f"{net.address(slot)}:{self.port}"
        self.data_dir = root / f"member-{index}"
        self.log_path = root / f"member-{index}.log"
        self.token = token
        cmd = [*net.command_prefix(slot), sys.executable, "-m", "jetwake.engine.server.cli",
               "member", "start", "--cluster", cluster, "--kafka", bootstrap,
               "--data-dir", str(self.data_dir), "--host", net.address(slot),
               "--port", str(self.port), "--token", token, "--cooperative-threads", "1",
               "--local-parallelism", "1", "--scale-up-delay", "1000", *extra]
        self._log = open(self.log_path, "w")
        env = {k: v for k, v in os.environ.items() if not k.startswith("JETWAKE_")}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)


class NamespacedCluster(ClusterProcesses):
    """A cluster whose n-th member runs in namespace n of the network."""

    def __init__(self, root: Path, bootstrap: str, net: PartitionNetwork) -> None:
        super().__init__(root, bootstrap)
        self.net = net

    def start_member(self, *extra: str, token: str | None = None,  # type: ignore[override]
                     cluster: str | None = None) -> NamespacedMember:
        slot = len(self.members) + 1
        m = NamespacedMember(self.root, len(self.members), cluster or self.name,
                             self.bootstrap, token or self.token, self.net, slot, extra)
        self.members.append(m)
        return m


@pytest.fixture
def cluster(tmp_path: Path, bridge_kafka: str, net: PartitionNetwork):
    c = NamespacedCluster(tmp_path, bridge_kafka, net)
    try:
        yield c
    finally:
        net.heal_all()
        c.stop_all()


@pytest.fixture
def outputs(bridge_kafka: str):
    """Makes read_committed readers of sink topics, closed after the test whatever happened."""
    made: list[Output] = []

    def make(topic: str) -> Output:
        out = Output(bridge_kafka, topic)
        made.append(out)
        return out

    yield make
    for out in made:
        out.close()


def _batch(start: int, count: int, keys: int = 13) -> list[tuple[str, int]]:
    return [(f"k{i % keys}", i) for i in range(start, start + count)]


def _submit(cluster: NamespacedCluster, member: ClusterMemberProcess, tmp_path: Path,
            source: str, sink: str, name: str, *flags: str) -> dict:
    return cluster.cli_json(member, "submit",
                            str(sums_job_file(tmp_path, cluster.bootstrap, source, sink)),
                            "--name", name, "--guarantee", "exactly_once",
                            "--snapshot-interval", "200", *flags)


def _status(cluster: NamespacedCluster, member: ClusterMemberProcess, job_id: str) -> dict:
    return cluster.status(member, job_id)


def _view(cluster: NamespacedCluster, via: ClusterMemberProcess) -> dict[str, dict]:
    """The members as ``via`` sees them, by their peer address's host (the namespace's
    address, known even for a member that does not answer)."""
    return {m["peer_address"].rpartition(":")[0]: m for m in cluster.cluster(via)["members"]}


def _runs_share(cluster: NamespacedCluster, via: ClusterMemberProcess,
                member: ClusterMemberProcess, jobs: int = 1) -> bool:
    """Whether ``via`` sees ``member`` in the cluster, answering, running ``jobs`` shares."""
    entry = _view(cluster, via).get(member.address.rpartition(":")[0])
    return entry is not None and entry["state"] == "ACTIVE" and (entry["jobs"] or 0) >= jobs


def _assert_exactly_once(out: Output, events: list[tuple[str, int]]) -> None:
    out.drain()
    assert len(out.records) == len(events), (
        f"{len(out.records)} records for {len(events)} events: a record was written twice")
    assert by_key(out.records) == running_sums(events)


def test_with_the_quorum_rule_a_member_cut_off_is_left_behind_and_used_again_once_healed(
        cluster: NamespacedCluster, net: PartitionNetwork, outputs, tmp_path: Path) -> None:
    """A member (not the coordinator) loses the network: Kafka drops it after the session
    timeout, the job restarts from its last snapshot on the two others (a quorum of the three
    it ran on) and goes on; healed, the member joins again and the job restarts to use it.
    A read_committed reader sees every sum once."""
    members = cluster.start(3, "--session-timeout", str(session_timeout_ms(cluster.bootstrap)))
    bootstrap = cluster.bootstrap
    source, sink = new_topic(bootstrap), new_topic(bootstrap)
    batches = [_batch(0, 1000), _batch(1000, 1000), _batch(2000, 1000)]
    events = batches[0] + batches[1] + batches[2]
    produce_events(bootstrap, source, batches[0])
    coordinator = cluster.coordinator()
    job = _submit(cluster, coordinator, tmp_path, source, sink, "sums",
                  "--split-brain-protection")
    out = outputs(sink)
    wait_until(lambda: out.has(1000), what="the first sums", timeout=60, interval=0)
    victim = next(m for m in members if m is not coordinator)
    broker_port = int(bootstrap.rpartition(":")[2])

    net.cut(victim.slot)
    assert not net.reaches(victim.slot, net.host_address, broker_port)
    produce_events(bootstrap, source, batches[1])
    wait_until(lambda: out.has(2000),
               what="the sums of the two members left", timeout=30, interval=0.2)
    assert victim.address.rpartition(":")[0] not in _view(cluster, coordinator)
    assert _status(cluster, coordinator, job["id"])["status"] == "RUNNING"

    net.heal(victim.slot)
    wait_until(lambda: _runs_share(cluster, coordinator, victim),
               what="the healed member to run its share of the job again", timeout=90, interval=0.2)
    # the member's return moves the group's partitions once; the coordinator stays
    wait_until(lambda: cluster.coordinator(coordinator) is coordinator,
               what="the coordinator to coordinate on after the member's return", timeout=30,
               interval=0.2)
    produce_events(bootstrap, source, batches[2])
    wait_until(lambda: out.has(3000),
               what="the sums on three members again", timeout=60, interval=0.2)
    _assert_exactly_once(out, events)


def test_with_the_quorum_rule_a_coordinator_cut_off_steps_down_and_rejoins_as_a_member(
        cluster: NamespacedCluster, net: PartitionNetwork, outputs, tmp_path: Path) -> None:
    """The coordinator loses the network: the two others, a quorum, see it leave the group;
    the next oldest takes over (fencing it) and resumes the job from its last snapshot. The
    cut-off coordinator cannot reach Kafka, loses its session and steps down by itself while
    still cut off, so it commits nothing; healed, it joins again as a plain member. Every sum
    once."""
    members = cluster.start(3, "--session-timeout", str(session_timeout_ms(cluster.bootstrap)))
    bootstrap = cluster.bootstrap
    source, sink = new_topic(bootstrap), new_topic(bootstrap)
    batches = [_batch(0, 1000), _batch(1000, 1000), _batch(2000, 1000)]
    events = batches[0] + batches[1] + batches[2]
    produce_events(bootstrap, source, batches[0])
    old = cluster.coordinator()
    other = next(m for m in members if m is not old)
    job = _submit(cluster, other, tmp_path, source, sink, "sums", "--split-brain-protection")
    out = outputs(sink)
    wait_until(lambda: out.has(1000), what="the first sums", timeout=60, interval=0)

    net.cut(old.slot)
    new = wait_until(lambda: cluster.coordinator(via=other) not in (old, None)
                     and cluster.coordinator(via=other),
                     what="another coordinator", timeout=30, interval=0.1)
    produce_events(bootstrap, source, batches[1])
    wait_until(lambda: out.has(2000),
               what="the sums under the new coordinator", timeout=30, interval=0.2)
    assert _status(cluster, new, job["id"])["status"] == "RUNNING"
    wait_until(lambda: "is no longer the coordinator" in old.log,
               what="the cut-off coordinator to step down while still cut off", timeout=30,
               interval=0.1)

    net.heal(old.slot)
    wait_until(lambda: _runs_share(cluster, other, old),
               what="the healed member to run its share of the job again", timeout=90, interval=0.2)
    produce_events(bootstrap, source, batches[2])
    wait_until(lambda: out.has(3000),
               what="the sums on three members again", timeout=60, interval=0.2)
    _assert_exactly_once(out, events)
    # the healed member joins again as the youngest: it does not take coordination back
    # (its join is a rebalance, during which the group shows no coordinator)
    wait_until(lambda: cluster.coordinator(via=other) is new,
               what="the coordinator to stay the new one, not the healed member", timeout=30,
               interval=0.1)
    coordinators = {cluster.cluster(m)["coordinator"] for m in members}
    assert len(coordinators) == 1, f"the members disagree on the coordinator: {coordinators}"


def test_a_member_cut_off_from_its_peers_only_with_the_quorum_rule_on_and_off(
        cluster: NamespacedCluster, net: PartitionNetwork, outputs, tmp_path: Path) -> None:
    """A member loses its peers but not Kafka. The group keeps all three members, so the
    quorum rule counts three and a job with it (``sums-on``) is treated as one without it
    (``sums-off``): neither waits for a quorum. The coordinator's probes find the member out
    of reach, and both jobs restart without it and go on during the partition; afterwards the
    member runs its share of both again. Every sum is written once."""
    members = cluster.start(3)
    bootstrap = cluster.bootstrap
    source = new_topic(bootstrap)
    sinks = {"off": new_topic(bootstrap), "on": new_topic(bootstrap)}
    batches = [_batch(0, 600), _batch(600, 600), _batch(1200, 600)]
    events = batches[0] + batches[1] + batches[2]
    produce_events(bootstrap, source, batches[0])
    coordinator = cluster.coordinator()
    jobs = {"off": _submit(cluster, coordinator, tmp_path, source, sinks["off"], "sums-off"),
            "on": _submit(cluster, coordinator, tmp_path, source, sinks["on"], "sums-on",
                          "--split-brain-protection")}
    outs = {k: outputs(sink) for k, sink in sinks.items()}
    for k, out in outs.items():
        wait_until(lambda out=out: out.has(600),
                   what=f"the first sums of sums-{k}", timeout=60, interval=0)
    victim = next(m for m in members if m is not coordinator)
    victim_host = victim.address.rpartition(":")[0]

    net.isolate_from_peers(victim.slot)
    assert net.reaches(victim.slot, net.host_address, int(bootstrap.rpartition(":")[2]))
    assert not net.reaches(victim.slot, coordinator.address.rpartition(":")[0], CLIENT_PORT)
    view = wait_until(lambda: (v := _view(cluster, coordinator)).get(victim_host, {}).get(
        "state") == "UNREACHABLE" and v,
                      what="the coordinator to find the member unreachable", timeout=30,
                      interval=0.1)
    assert len(view) == 3, "Kafka should still count the member cut off from its peers only"
    produce_events(bootstrap, source, batches[1])
    wait_until(lambda: all(out.has(1200) for out in outs.values()),
               what="both jobs to go on without the member", timeout=30, interval=0.2)
    for k, job in jobs.items():
        status = _status(cluster, coordinator, job["id"])
        assert "quorum" not in (status.get("failure") or ""), f"sums-{k}: {status}"

    net.rejoin_peers(victim.slot)
    wait_until(lambda: _runs_share(cluster, coordinator, victim, jobs=2),
               what="the member to run its share of both jobs again", timeout=60, interval=0.2)
    produce_events(bootstrap, source, batches[2])
    for k, out in outs.items():
        wait_until(lambda out=out: out.has(1800),
                   what=f"every sum of sums-{k}", timeout=60, interval=0.2)
        _assert_exactly_once(out, events)
        assert _status(cluster, coordinator, jobs[k]["id"])["status"] == "RUNNING"
