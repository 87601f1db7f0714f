"""job.state(stage) on a cluster of member processes: reads routed to the member owning a
key's partition answer the same through every member's Client, and while a member is killed
(SIGKILL) each read answers correctly or fails with the retryable StateUnavailableError."""

from __future__ import annotations

from pathlib import Path

import pytest

from jetwake import StateQueryError, StateUnavailableError
from support.cluster_processes import ClusterProcesses
from support.cluster_sums import new_topic, produce_events, rolling_sums_job
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.faults]


def _totals_job(tmp: Path, bootstrap: str, source: str) -> Path:
    return rolling_sums_job(tmp, bootstrap, source, "Sinks.noop()", stage="totals")


def _sums(events: list[tuple[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in events:
        out[k] = out.get(k, 0) + v
    return out


def _read(view, keys):
    try:
        return view.get_all(keys)
    except (StateQueryError, StateUnavailableError):
        return None


@pytest.fixture
def cluster(tmp_path: Path, kafka_bootstrap: str):
    c = ClusterProcesses(tmp_path, kafka_bootstrap)
    yield c
    c.stop_all()


def test_reads_on_a_cluster_are_routed_to_the_owner_and_survive_a_member_killed(
        cluster: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str) -> None:
    members = cluster.start(2)
    source = new_topic(kafka_bootstrap)
    events = [(f"k{i % 23}", i) for i in range(600)]
    produce_events(kafka_bootstrap, source, events)
    expected = _sums(events)
    keys = sorted(expected)
    cluster.cli_json(members[0], "submit", str(_totals_job(tmp_path, kafka_bootstrap, source)),
                     "--name", "totals-job", "--guarantee", "exactly_once",
                     "--snapshot-interval", "200")
    clients = [m.client() for m in members]
    try:
        # every key lives on one of the two members: each answer needs the owner's share
        for client in clients:
            live = client.job("totals-job").state("totals", consistency="latest")
            wait_until(lambda: _read(live, keys) == expected, timeout=60,
                       what="every key's live total through this member")
            assert live.count() == len(expected)  # counted on each member, nothing copied
            committed = client.job("totals-job").state("totals")
            wait_until(lambda: _read(committed, keys) == expected, timeout=60,
                       what="every key's committed total through this member")
            assert committed.count() == len(expected)

        coordinator = cluster.coordinator()
        assert coordinator is not None
        victim = next(m for m in members if m is not coordinator)
        survivor = clients[members.index(coordinator)]
        live = survivor.job("totals-job").state("totals", consistency="latest")
        restarts = survivor.job("totals-job").refresh().get("restart_count", 0)
        victim.kill()
        assert not victim.alive(), "the member was not killed"
        answers = failures = 0
        # reads while the cluster notices the loss and restarts the job on the survivor
        def settled() -> bool:
            nonlocal answers, failures
            try:
                got = live.get_all(keys)
            except StateUnavailableError:  # the retryable error, and no other
                failures += 1
                return False
            answers += 1
            assert got == expected  # an answer is always the right one
            info = survivor.job("totals-job").refresh()
            return info.get("restart_count", 0) > restarts and info["status"] == "RUNNING"
        wait_until(settled, timeout=90, what="the job running again without the killed member")
        wait_until(lambda: _read(live, keys) == expected, timeout=60,
                   what="every key's total after the member's loss")
        assert answers >= 1 and failures >= 1, (answers, failures)
    finally:
        for c in clients:
            c.close()
