"""pytest plugin: a real PostgreSQL server for the tests that use one.

Loaded from tests/conftest.py (``pytest_plugins``). Fixtures:

``postgres_dsn`` (session)
    The DSN of a database on a PostgreSQL server, from the first of these:

    1. ``$POSTGRES_DSN`` if set (a server that runs elsewhere; used as is, never stopped);
    2. a server started by tests/support/local_postgres/postgres_local.py from the operating
       system's PostgreSQL, on a free loopback port, with fsync off (its data is thrown away),
       stopped and deleted at the end of the session.

    Without either (PostgreSQL not installed) the requesting tests skip, saying how to install
    it; a server that is there but does not start fails them.

``postgres_database`` (function)
    The DSN of a database of its own for one test, ``test_<hex>``, created on that server and
    dropped (its connections closed) after the test.

``postgres_local()`` imports the runner script as the module ``postgres_local``.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest

from support.local_runners import load_runner
from support.local_runners import watch_for_orphaning as orphan_watch

_SCRIPT_DIR = Path(__file__).resolve().parent / "local_postgres"


def postgres_local() -> ModuleType:
    """Import tests/support/local_postgres/postgres_local.py (its folder is not a package)."""
    return load_runner(_SCRIPT_DIR / "postgres_local.py")


def skip_unless_installed() -> None:
    """Skips the calling test when the operating system's PostgreSQL is not installed."""
    pl = postgres_local()
    if pl.find_bin_dir() is None:
        pytest.skip(f"PostgreSQL is not installed: {pl.INSTALL_HINT}")


def dsn_with_database(dsn: str, dbname: str) -> str:
    """The same server and credentials as ``dsn``, another database."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def watch_for_orphaning(port: int) -> None:
    """Stops the server postgres_local started on ``port`` if this pytest process dies without
    its teardown."""
    orphan_watch(_SCRIPT_DIR / "postgres_local.py", "stop_server", port)


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    env = os.environ.get("POSTGRES_DSN", "").strip()
    if env:
        yield env
        return
    skip_unless_installed()
    pl = postgres_local()
    port = pl.free_port()
    try:
        dsn = pl.start_server(port, fsync=False)
    except pl.PostgresLocalError as e:
        pl.stop_server(port)
        pytest.fail(f"the tests' PostgreSQL (postgres_local.py, port {port}) did not start: {e}"
                    "\nSet POSTGRES_DSN to use an existing server.", pytrace=False)
    watch_for_orphaning(port)
    try:
        yield dsn
    finally:
        pl.stop_server(port)


@pytest.fixture
def postgres_database(postgres_dsn: str) -> Iterator[str]:
    import psycopg

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield dsn_with_database(postgres_dsn, name)
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
