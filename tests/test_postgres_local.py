"""The PostgreSQL runner, tests/support/local_postgres/postgres_local.py (docs/postgres.md):
a server from the operating system's packages on a free loopback port, with its own data
directory, run as an unprivileged account, reused by a second `up`, removed by `down`.

A server starts in about half a second (initdb and start-up), so the tests of one server share
one, of settings they can check; `down` and the command line have a server each.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from support.postgres_server import postgres_local, skip_unless_installed

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

SCRIPT = Path(__file__).resolve().parent / "support" / "local_postgres" / "postgres_local.py"
# not PostgreSQL's 0 nor the runner's default 64: the server shows it was given this one
MAX_PREPARED = 23


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, str]]:
    skip_unless_installed()
    pl = postgres_local()
    port = pl.free_port()
    try:
        yield port, pl.start_server(port, fsync=False, max_prepared_transactions=MAX_PREPARED)
    finally:
        pl.stop_server(port)


def _one(dsn: str, sql: str) -> object:
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def test_up_starts_a_server_on_loopback_that_answers_a_query_in_database_jetwake(server):
    port, dsn = server
    assert dsn == f"postgresql://jetwake@127.0.0.1:{port}/jetwake"
    assert _one(dsn, "SELECT current_database() || ' ' || current_user") == "jetwake jetwake"
    assert _one(dsn, "SELECT inet_server_addr()::text") == "127.0.0.1/32"
    assert _one(dsn, "SELECT 6 * 7") == 42


def test_the_server_has_the_configured_max_prepared_transactions(server):
    _, dsn = server
    assert _one(dsn, "SHOW max_prepared_transactions") == str(MAX_PREPARED)
    with psycopg.connect(dsn, autocommit=True) as conn:  # and PREPARE TRANSACTION works
        conn.execute("CREATE TABLE prepared_probe (n int)")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO prepared_probe VALUES (1)")
        conn.execute("PREPARE TRANSACTION 'jetwake-probe'")
        assert _one(dsn, "SELECT gid FROM pg_prepared_xacts") == "jetwake-probe"
        conn.execute("COMMIT PREPARED 'jetwake-probe'")
        assert _one(dsn, "SELECT count(*) FROM prepared_probe") == 1


def test_its_data_lives_in_its_run_directory_and_the_server_runs_as_an_unprivileged_account(
        server):
    port, dsn = server
    pl = postgres_local()
    run = pl.run_dir(port)
    assert Path(_one(dsn, "SHOW data_directory")) == run / "data"
    assert _one(dsn, "SHOW unix_socket_directories") == pl.socket_dir(port)  # not /var/run
    assert pl.socket_dir(port) in (str(run / "socket"), "")
    pid = json.loads((run / "state.json").read_text())["pid"]
    owner = os.stat(f"/proc/{pid}").st_uid
    assert owner != 0
    assert owner == (os.geteuid() if os.geteuid() != 0 else pl.run_as_account().pw_uid)


def test_a_second_up_on_the_same_port_is_a_no_op(server):
    port, dsn = server
    pl = postgres_local()
    pid = pl.server_status(port)["alive_pid"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE survives_a_second_up (n int)")

    assert pl.start_server(port, fsync=False, max_prepared_transactions=MAX_PREPARED) == dsn

    assert pl.server_status(port)["alive_pid"] == pid
    assert _one(dsn, "SELECT count(*) FROM survives_a_second_up") == 0


def test_up_on_the_port_of_a_running_server_with_other_settings_says_to_stop_it(server):
    port, _ = server
    pl = postgres_local()
    with pytest.raises(pl.PostgresLocalError, match=f"down --port {port}"):
        pl.start_server(port, fsync=False, max_prepared_transactions=MAX_PREPARED + 1)


def test_up_on_a_port_taken_by_something_else_fails_naming_the_port_and_the_fix():
    skip_unless_installed()
    pl = postgres_local()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(pl.PostgresLocalError) as failure:
            pl.start_server(port)
    assert str(failure.value) == (f"port 127.0.0.1:{port} is taken by something that is not "
                                  "PostgreSQL; choose another with --port / POSTGRES_PORT")
    assert not pl.run_dir(port).exists()


def test_the_command_line_up_status_and_down_and_down_removes_the_process_and_its_data():
    skip_unless_installed()
    pl = postgres_local()
    port = pl.free_port()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), *args, "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
    try:
        up = run("up", "--no-fsync")
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == f"postgresql://jetwake@127.0.0.1:{port}/jetwake"
        pid = pl.server_status(port)["alive_pid"]
        status = run("status")
        assert status.returncode == 0
        assert status.stdout.startswith(f"running: {up.stdout.strip()} pid={pid} ")
        assert "fsync=False max_prepared_transactions=64" in status.stdout

        down = run("down")
        assert down.returncode == 0, down.stderr
        assert not pl._pid_alive(pid)
        assert not pl.run_dir(port).exists()
        assert not pl.port_in_use(port)
        assert run("status").returncode == 1
    finally:
        pl.stop_server(port)
