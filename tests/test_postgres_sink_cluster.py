"""The exactly-once PostgreSQL sink on a three-member cluster whose coordinator is SIGKILLed
at a point of the snapshot protocol: the job goes on from its last snapshot on the survivors,
the restored processors settle the dead member's prepared transactions, and the table holds
every running sum exactly once; once the job has ended no prepared transaction is left."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import pytest

from support.cluster_processes import ClusterProcesses
from support.cluster_sums import (
    job_status, new_topic, produce_events, rolling_sums_job, running_sums,
)
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.postgres,
              pytest.mark.faults]


@pytest.fixture
def cluster(tmp_path: Path, kafka_bootstrap: str):
    c = ClusterProcesses(tmp_path, kafka_bootstrap)
    yield c
    c.stop_all()


def sums_to_postgres_job(tmp: Path, bootstrap: str, source: str, dsn: str) -> Path:
    """A job file: Kafka ``source`` -> rolling sum per key -> the table ``sums`` (k, total)."""
    return rolling_sums_job(tmp, bootstrap, source,
                            f"Sinks.postgres('sums', {dsn!r}, batch_size=100)")


def table_rows(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT k, total FROM sums ORDER BY k, total").fetchall()


def prepared(dsn: str) -> list:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT gid FROM pg_prepared_xacts "
                            "WHERE database = current_database()").fetchall()


@pytest.mark.parametrize("point", ["after-commit-record", "member-phase2"])
def test_the_coordinator_killed_in_a_snapshot_leaves_every_sum_in_the_table_once(
        cluster: ClusterProcesses, tmp_path: Path, kafka_bootstrap: str,
        postgres_database: str, point: str) -> None:
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE sums (k text NOT NULL, total bigint NOT NULL)")
    victim = cluster.start_member(env={"JETWAKE_CRASH_AT": f"{point}:3"})
    wait_until(victim.ready, what="the first member to serve", timeout=30)
    cluster.start(2)
    assert cluster.coordinator() is victim
    source = new_topic(kafka_bootstrap)
    first = [(f"k{i % 13}", i) for i in range(600)]
    produce_events(kafka_bootstrap, source, first)
    survivor = next(m for m in cluster.members if m is not victim)
    job = cluster.cli_json(survivor, "submit", str(sums_to_postgres_job(
        tmp_path, kafka_bootstrap, source, postgres_database)), "--name", "pg-sums",
        "--guarantee", "exactly_once", "--snapshot-interval", "200")
    victim.proc.wait(90)  # it kills itself at the point, in its third snapshot
    assert victim.proc.returncode == -signal.SIGKILL
    second = [(f"k{i % 13}", i) for i in range(600, 1200)]
    produce_events(kafka_bootstrap, source, second)
    want = sorted((k, s) for k, sums in running_sums(first + second).items() for s in sums)
    wait_until(lambda: len(table_rows(postgres_database)) >= len(want),
               what=f"every sum after a kill at {point}", timeout=120, interval=0.2)
    assert job_status(cluster, survivor, job["id"])["status"] == "RUNNING"
    for command in ("suspend", "cancel"):   # the terminal snapshot commits what is prepared
        r = cluster.cli(survivor, command, job["id"])
        assert r.returncode == 0, r.stdout + r.stderr
    assert table_rows(postgres_database) == want, "a sum was lost or written twice"
    assert prepared(postgres_database) == []
