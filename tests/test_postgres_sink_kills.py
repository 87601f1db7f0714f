"""The exactly-once PostgreSQL sink through real process kills: a member process is SIGKILLed
at each point of the two-phase commit (rows written in the open transaction, the transaction
prepared, the snapshot committed but not COMMIT PREPARED, half of the processors' COMMIT
PREPARED done) and restarted on its data directory; the table must then hold every event's row
exactly once, and once the job has ended no prepared transaction of the job is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psycopg
import pytest

from support.restores import restored_snapshots

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.faults]

SCRIPT = os.path.join(os.path.dirname(__file__), "support", "postgres_job_process.py")
EVENTS = 1500


def start(data_dir: str, dsn: str, *, env_extra: dict | None = None,
          check: bool = False) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items()
           if k not in ("JETWAKE_CRASH_AT", "JETWAKE_PG_DIE_AT")}
    env.update(env_extra or {})
    args = [sys.executable, SCRIPT, data_dir, dsn, str(EVENTS)] + (["check"] if check else [])
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


@pytest.mark.parametrize("env", [
    {"JETWAKE_PG_DIE_AT": "processing:4"},        # rows in the open transaction
    {"JETWAKE_PG_DIE_AT": "after-prepare:3"},      # prepared, snapshot not committed
    {"JETWAKE_CRASH_AT": "after-commit-record:3"},  # committed, COMMIT PREPARED not run
    {"JETWAKE_PG_DIE_AT": "during-commit:1"},      # one processor committed, one not
], ids=lambda env: next(iter(env.values())).split(":")[0])
def test_a_member_killed_at_each_point_of_the_two_phase_commit_writes_every_row_once(
        tmp_path, postgres_database: str, env: dict) -> None:
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id integer NOT NULL, v integer NOT NULL)")
    data_dir = str(tmp_path / "member")
    proc = start(data_dir, postgres_database, env_extra=env)
    try:
        proc.wait(30)  # it kills itself at the point
    finally:
        kill(proc)
    assert proc.returncode == -signal.SIGKILL, "the process did not reach the kill point"

    proc = start(data_dir, postgres_database, check=True)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        kill(proc)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert restored_snapshots(data_dir), "the restarted job was not restored from a snapshot"
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        rows = conn.execute("SELECT id, v FROM events ORDER BY id, v").fetchall()
        prepared = conn.execute("SELECT gid FROM pg_prepared_xacts "
                                "WHERE database = current_database()").fetchall()
    assert len(rows) == EVENTS, "a row was lost or written twice"
    assert rows == [(i, i) for i in range(EVENTS)]
    assert prepared == []
