"""Rows per second into PostgreSQL: ``Sinks.postgres`` beside psycopg loops written by hand.

Run ``python -m bench postgres`` (or ``python -m bench.bench_postgres [rows]``). The server is
``$POSTGRES_DSN`` if set, else one that tests/support/local_postgres/postgres_local.py starts
for the run on a free loopback port (fsync off, as in the tests) and stops after it. Each
measurement writes the same ``ROWS`` rows ``(id integer, name text, amount float8)`` into an
empty table, measured in the same run:

- the exactly-once sink (insert mode: COPY into one transaction per processor and snapshot,
  prepared and committed at each snapshot, every 200 ms) beside a plain psycopg loop that
  COPYs the rows in one transaction;
- the upsert sink (``key_columns=["id"]``, every batch committed: one INSERT ... SELECT over
  arrays per batch) beside a psycopg loop of ``executemany`` upserts in batches of the same
  size, one commit each, and beside the COPY loop;
- the upsert sink under exactly-once (the upserts in prepared transactions).

The sink's rates include the job's start and end (the rows come from ``Sources.items``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from jetwake import JobConfig, Member, Pipeline, Sinks, Sources

from .report import line, timer

ROWS = 500_000
BATCH = 1000
TABLE = "bench_rows"


def _postgres_local():
    path = Path(__file__).resolve().parent.parent / "tests" / "support" / "local_postgres" / \
        "postgres_local.py"
    spec = importlib.util.spec_from_file_location("postgres_local", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fresh_table(dsn: str, keyed: bool) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        key = " PRIMARY KEY" if keyed else ""
        conn.execute(f"CREATE TABLE {TABLE} (id integer{key}, name text, amount float8)")


def _count(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]


def copy_loop(dsn: str, rows: list[tuple]) -> float:
    import psycopg

    _fresh_table(dsn, keyed=False)
    with timer() as t:
        with psycopg.connect(dsn) as conn:
            with conn.cursor() as cur, cur.copy(
                    f"COPY {TABLE} (id, name, amount) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            conn.commit()
    assert _count(dsn) == len(rows)
    return len(rows) / t[0]


def executemany_loop(dsn: str, rows: list[tuple]) -> float:
    import psycopg

    _fresh_table(dsn, keyed=True)
    statement = (f"INSERT INTO {TABLE} (id, name, amount) VALUES (%s, %s, %s) ON CONFLICT (id) "
                 "DO UPDATE SET name = EXCLUDED.name, amount = EXCLUDED.amount")
    with timer() as t:
        with psycopg.connect(dsn) as conn:
            for i in range(0, len(rows), BATCH):
                with conn.cursor() as cur:
                    cur.executemany(statement, rows[i:i + BATCH])
                conn.commit()
    assert _count(dsn) == len(rows)
    return len(rows) / t[0]


def sink_job(dsn: str, rows: list[tuple], guarantee: str, keyed: bool) -> float:
    _fresh_table(dsn, keyed=keyed)
    p = Pipeline()
    p.read_from(Sources.items(rows)).write_to(Sinks.postgres(
        TABLE, dsn, key_columns=["id"] if keyed else None, batch_size=BATCH))
    with Member() as m:
        with timer() as t:
            m.new_job(p, JobConfig(processing_guarantee=guarantee,
                                   snapshot_interval_ms=200)).join()
    assert _count(dsn) == len(rows)
    return len(rows) / t[0]


def run(dsn: str, count: int) -> None:
    rows = [(i, f"name-{i}", i * 0.25) for i in range(count)]
    copy = copy_loop(dsn, rows)
    line("Sinks.postgres exactly-once (insert, COPY)", sink_job(dsn, rows, "exactly_once", False),
         copy, "rows", "psycopg COPY loop")
    many = executemany_loop(dsn, rows)
    upsert = sink_job(dsn, rows, "at_least_once", True)
    line("Sinks.postgres upsert (at-least-once)", upsert, many, "rows", "psycopg executemany")
    line("Sinks.postgres upsert exactly-once", sink_job(dsn, rows, "exactly_once", True),
         many, "rows", "psycopg executemany")
    line("Sinks.postgres upsert (at-least-once)", upsert, copy, "rows", "psycopg COPY loop")
    line("psycopg executemany upsert", many, copy, "rows", "psycopg COPY loop")


def main(count: int = ROWS) -> None:
    dsn = os.environ.get("POSTGRES_DSN", "").strip()
    if dsn:
        run(dsn, count)
        return
    pl = _postgres_local()
    port = pl.free_port()
    dsn = pl.start_server(port, fsync=False)
    try:
        run(dsn, count)
    finally:
        pl.stop_server(port)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else ROWS)
