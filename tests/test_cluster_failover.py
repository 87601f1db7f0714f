"""Members fail and the cluster carries on: a member SIGKILLed in the middle of an
exactly-once Kafka job, and the coordinator itself; the job goes on from its last snapshot on
the survivors and a read_committed consumer sees every output record exactly once."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

from support.cluster_processes import ClusterProcesses
from support.kafka_broker import session_timeout_ms
from support.cluster_sums import (
    Output, SumsRun, by_key, job_status, new_topic, produce_events, running_sums, submit_sums,
)
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.faults]


@pytest.fixture
def cluster(tmp_path: Path, kafka_bootstrap: str):
    c = ClusterProcesses(tmp_path, kafka_bootstrap)
    yield c
    c.stop_all()


@pytest.mark.parametrize("victim", ["member", "coordinator"])
def test_a_killed_member_s_job_goes_on_from_the_last_snapshot_on_the_survivors_exactly_once(
        cluster: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str, victim: str) -> None:
    # Kafka drops a killed member (not the coordinator) after its session timeout
    members = cluster.start(3, "--session-timeout", str(session_timeout_ms(kafka_bootstrap)))
    coordinator = cluster.coordinator()
    submit_to = next(m for m in members if m is not coordinator)
    run = SumsRun(cluster, submit_to, tmp_path, kafka_bootstrap, 19, count=2000, snapshots=2)
    dead = coordinator if victim == "coordinator" else \
        next(m for m in members if m is not coordinator and m is not submit_to)
    dead.kill()
    survivor = next(m for m in members if m is not dead)
    run.feed(2000)
    run.wait_for_all("the sums after the member loss", 120)
    assert run.status(survivor)["status"] == "RUNNING"
    # the job went on before Kafka dropped the dead member; the cluster shows it gone soon
    wait_until(lambda: len(cluster.cluster(survivor)["members"]) == 2,
               what="the cluster to show two members", timeout=30, interval=0.1)
    run.assert_exactly_once()


def test_with_split_brain_protection_a_job_waits_without_a_quorum_and_resumes_when_a_member_returns(
        cluster: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str) -> None:
    members = cluster.start(3)
    coordinator = cluster.coordinator()
    run = SumsRun(cluster, coordinator, tmp_path, kafka_bootstrap, 7,
                  "--split-brain-protection", count=500)
    for m in members:
        if m is not coordinator:
            m.kill()
    wait_until(lambda: run.status(coordinator)["status"] == "NOT_RUNNING",
               what="the job to stop without a quorum", timeout=60, interval=0.1)
    assert "quorum of 2" in (run.status(coordinator)["failure"] or "")
    run.feed(500)
    cluster.start(1)  # two members again: a quorum
    run.wait_for_all("the sums after the quorum is back", 120)
    run.assert_exactly_once()
    assert run.status(coordinator)["status"] == "RUNNING"

def test_without_auto_scaling_losing_a_member_suspends_the_job(
        cluster: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str) -> None:
    members = cluster.start(2)
    source, sink = new_topic(kafka_bootstrap), new_topic(kafka_bootstrap)
    produce_events(kafka_bootstrap, source, [("k", 1)])
    coordinator = cluster.coordinator()
    job = submit_sums(cluster, coordinator, tmp_path, kafka_bootstrap, source, sink,
                       "--no-auto-scaling")
    out = Output(kafka_bootstrap, sink)
    wait_until(lambda: out.has(1), what="the first sum", timeout=60, interval=0)
    out.close()
    other = next(m for m in members if m is not coordinator)
    other.kill()
    wait_until(lambda: job_status(cluster, coordinator, job["id"])["status"] == "SUSPENDED",
               what="the job to be suspended", timeout=60, interval=0.1)


def test_a_member_that_joins_is_used_after_the_scale_up_delay(
        cluster: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str) -> None:
    cluster.start(2)
    coordinator = cluster.coordinator()
    run = SumsRun(cluster, coordinator, tmp_path, kafka_bootstrap, 11)
    (newcomer,) = cluster.start(1)
    # the coordinator's scale-up delay is 1 s in these tests (ClusterProcesses starts members
    # with --scale-up-delay 1000)
    wait_until(lambda: any(m["address"] == newcomer.address and m["jobs"] >= 1
                           for m in cluster.cluster(newcomer)["members"]),
               what="the new member to run its share of the job", timeout=60, interval=0.1)
    assert run.status(coordinator)["restart_count"] >= 1
    run.feed(1000)
    run.wait_for_all("the sums on three members", 60)
    run.assert_exactly_once()

def test_a_member_stopped_gracefully_hands_its_work_over_through_a_terminal_snapshot(
        cluster: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str) -> None:
    members = cluster.start(3)
    coordinator = cluster.coordinator()
    run = SumsRun(cluster, coordinator, tmp_path, kafka_bootstrap, 13)
    before = run.status(coordinator)["snapshot_count"]
    leaving = next(m for m in members if m is not coordinator)
    assert leaving.stop() == 0
    assert "handed its share of 1 job(s) over" in leaving.log
    # the terminal snapshot taken for the hand-over
    assert run.status(coordinator)["snapshot_count"] > before
    run.feed(1000)
    run.wait_for_all("the sums on two members", 60)
    run.assert_exactly_once()

def test_a_coordinator_paused_past_the_session_timeout_is_deposed_and_rejoins_as_a_member(
        cluster: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str) -> None:
    members = cluster.start(3, "--session-timeout", str(session_timeout_ms(kafka_bootstrap)))
    old = cluster.coordinator()
    other = next(m for m in members if m is not old)
    run = SumsRun(cluster, other, tmp_path, kafka_bootstrap, 5)
    old.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: cluster.coordinator(via=other) not in (old, None),
                   what="another coordinator", timeout=60, interval=0.1)
        new = cluster.coordinator(via=other)
        wait_until(lambda: run.status(new)["status"] == "RUNNING",
                   what="the job to run under the new coordinator", timeout=60, interval=0.1)
    finally:
        old.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: "is no longer the coordinator" in old.log, what="the old coordinator to "
               "step down", timeout=60, interval=0.1)
    wait_until(lambda: len(cluster.cluster(new)["members"]) == 3, what="the old coordinator back "
               "as a member", timeout=60, interval=0.1)
    infos = [cluster.cluster(m) for m in members]
    assert {i["coordinator"] for i in infos} == {infos[0]["coordinator"]}
    run.feed(1000)
    run.wait_for_all("the sums after the pause", 120)
    run.assert_exactly_once()

@pytest.mark.parametrize("point,where", [
    ("member-phase1", "member"),          # before phase 1 ends
    ("member-before-phase2", "member"),   # between the commit record and phase 2
    ("member-phase2", "member"),          # during phase 2
    ("snapshot-phase1", "coordinator"),
    ("after-commit-record", "coordinator"),
    ("member-phase2", "coordinator"),     # the coordinator's own share, during phase 2
])
def test_a_member_killed_at_each_point_of_the_snapshot_protocol_loses_and_duplicates_nothing(
        cluster: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str, point: str,
        where: str) -> None:
    crash = {"JETWAKE_CRASH_AT": f"{point}:3"}  # the third time: two snapshots went well
    if where == "coordinator":  # the oldest member coordinates: start it first
        victim = cluster.start_member(env=crash)
        wait_until(victim.ready, what="the first member to serve", timeout=30)
        wait_until(lambda: len(cluster.cluster(victim)["members"]) == 1,
                   what="it to join", timeout=30)
        cluster.start(2)
        assert cluster.coordinator() is victim
    else:
        cluster.start(2)
        victim = cluster.start_member(env=crash)
        wait_until(victim.ready, what="the third member to serve", timeout=30)
        wait_until(lambda: len(cluster.cluster(victim)["members"]) == 3,
                   what="three members", timeout=30)
    source, sink = new_topic(kafka_bootstrap), new_topic(kafka_bootstrap)
    first = [(f"k{i % 17}", i) for i in range(1500)]
    produce_events(kafka_bootstrap, source, first)
    survivor = next(m for m in cluster.members if m is not victim)
    job = submit_sums(cluster, survivor, tmp_path, kafka_bootstrap, source, sink)
    victim.proc.wait(90)  # it kills itself at the crash point
    assert victim.proc.returncode == -signal.SIGKILL
    second = [(f"k{i % 17}", i) for i in range(1500, 3000)]
    produce_events(kafka_bootstrap, source, second)
    out = Output(kafka_bootstrap, sink)
    wait_until(lambda: out.has(len(first) + len(second)), what=f"every sum after a kill at {point}",
               timeout=120, interval=0)
    out.drain()
    out.close()
    assert job_status(cluster, survivor, job["id"])["status"] == "RUNNING"
    assert len(out.records) == len(first) + len(second), "a record was written twice"
    assert by_key(out.records) == running_sums(first + second)


def test_map_contents_and_journal_positions_survive_a_member_loss(
        cluster: ClusterProcesses, tmp_path: Path) -> None:
    members = cluster.start(3)
    coordinator = cluster.coordinator()
    others = [m for m in members if m is not coordinator]
    with others[0].client() as client:
        client.get_map("in").put_all({i: i * 10 for i in range(500)})
    src = tmp_path / "journal.py"
    src.write_text(textwrap.dedent("""
        from jetwake import Pipeline, Sinks, Sources
        pipeline = Pipeline()
        events = pipeline.read_from(Sources.map_journal("in", start="oldest"))
        events.write_to(Sinks.list("seen"))
        events.write_to(Sinks.map("copy"))
    """))
    job = cluster.cli_json(others[0], "submit", str(src), "--name", "journal", "--guarantee",
                           "exactly_once", "--snapshot-interval", "200")
    with coordinator.client() as client:
        wait_until(lambda: len(client.get_list("seen")) >= 500,
                   what="the first 500 events", timeout=60, interval=0.2)
        wait_until(lambda: (job_status(cluster, coordinator, job["id"])["snapshot_count"] or 0)
                   >= 2, what="two snapshots", timeout=30, interval=0.2)
    # the journal is read by processor 0, on the member with the smallest id: kill that one
    info = cluster.cluster(coordinator)
    first_id = min(m["id"] for m in info["members"])
    address = next(m["address"] for m in info["members"] if m["id"] == first_id)
    victim = next(m for m in members if m.address == address)
    victim.kill()
    survivor = next(m for m in members if m is not victim)
    with survivor.client() as client:
        client.get_map("in").put_all({i: i * 10 for i in range(500, 1000)})
    with survivor.client() as client:
        wait_until(lambda: len(client.get_list("seen")) >= 1000, what="every event after the loss",
                   timeout=120, interval=0.2)
        seen = list(client.get_list("seen"))
        copy = client.get_map("copy").to_dict()
    assert sorted(tuple(e) for e in seen) == [(i, i * 10) for i in range(1000)], \
        "an event was lost or seen twice"
    assert copy == {i: i * 10 for i in range(1000)}
    other = next(m for m in members if m is not victim and m is not survivor)
    with other.client() as client:  # the same from another member
        assert client.get_map("copy").to_dict() == copy


def test_the_coordinator_then_another_member_killed_return_and_the_job_scales_back_up(
        cluster: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str) -> None:
    members = cluster.start(3)
    first_coordinator = cluster.coordinator()
    last = next(m for m in members if m is not first_coordinator)
    run = SumsRun(cluster, last, tmp_path, kafka_bootstrap, 23, count=800)
    first_coordinator.kill()  # the coordinator
    run.feed(800)
    run.wait_for_all("the sums after the coordinator's loss", 120)
    second = next(m for m in members if m is not first_coordinator and m is not last)
    second.kill()  # then another member: one is left
    run.feed(800)
    run.wait_for_all("the sums on the last member", 120)
    back = [cluster.revive(first_coordinator), cluster.revive(second)]
    wait_until(lambda: all(m.ready() for m in back),
               what="the killed members to serve again", timeout=60)
    wait_until(lambda: len(cluster.cluster(last)["members"]) == 3
               and all((m["jobs"] or 0) >= 1 for m in cluster.cluster(last)["members"]),
               what="the job to scale back up to three members", timeout=90, interval=0.1)
    run.feed(800)
    run.wait_for_all("the sums on three members again", 120)
    assert run.status(last)["status"] == "RUNNING"
    assert len(run.events) == 3200
    run.assert_exactly_once()
