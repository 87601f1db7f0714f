"""``Sinks.postgres`` in the Spark backfill: upserts in batches per task, and exactly-once per
task with prepared transactions settled by the driver (connectors/postgres/spark.py), against
a real PostgreSQL server (tests/support/postgres_server.py). Each test has a database of its
own; the table is compared row by row with the expected rows, and no prepared transaction may
be left behind."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from jetwake import Pipeline, Sinks, Sources
from jetwake.connectors.postgres.prepared_transactions import make_gid, prepare
from jetwake.connectors.postgres.spark import DECISION_INDEX, settle_leftovers, settle_run
from support.spark_fixtures import spark_runner  # noqa: F401 - a fixture

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

BIN = Path(sys.executable).parent
SINK = "postgres-sink-kv"


def _table(dsn: str, key: bool = True) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE kv (id integer {'PRIMARY KEY' if key else ''}, v integer)")


def _rows(dsn: str) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT id, v FROM kv ORDER BY id, v").fetchall()


def _prepared(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")]


def _prepare_rows(dsn: str, gid: str, rows: list[tuple]) -> None:
    """A transaction that inserts ``rows``, prepared under ``gid`` (what a task leaves)."""
    with psycopg.connect(dsn) as conn:
        conn.cursor().executemany("INSERT INTO kv VALUES (%s, %s)", rows)
        prepare(conn, gid)


@pytest.mark.spark
def test_the_backfill_upserts_each_tasks_rows_in_batches(postgres_database, spark_runner):
    _table(postgres_database)
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("INSERT INTO kv SELECT g, -1 FROM generate_series(0, 999) g")
    p = Pipeline()
    (p.read_from(Sources.items(range(3000)))
      .write_to(Sinks.postgres("kv", postgres_database, key_columns=["id"], batch_size=500,
                               value_fn=lambda i: {"id": i, "v": 2 * i})))

    first = spark_runner.run(p)
    second = spark_runner.run(p)  # a backfill run again gives the same table

    assert _rows(postgres_database) == [(i, 2 * i) for i in range(3000)]
    assert first.counters["stages"][SINK]["items_out"] == 3000
    assert second.counters["stages"][SINK]["items_out"] == 3000


@pytest.mark.spark
def test_the_exactly_once_backfill_commits_one_transaction_per_partition(postgres_database,
                                                                          spark_runner):
    _table(postgres_database, key=False)
    p = Pipeline()
    (p.read_from(Sources.items(range(6000)))
      .write_to(Sinks.postgres("kv", postgres_database, value_fn=lambda i: (i, i % 7),
                               exactly_once=True, batch_size=700)))

    spark_runner.run(p)

    assert _rows(postgres_database) == [(i, i % 7) for i in range(6000)]
    assert _prepared(postgres_database) == []


@pytest.mark.spark
def test_a_backfill_that_fails_rolls_back_every_prepared_transaction(postgres_database,
                                                                      spark_runner, tmp_path):
    _table(postgres_database, key=False)
    mark = tmp_path / "seen"
    dsn = postgres_database

    def fail_once_the_other_task_has_prepared(i: int) -> int:
        if i == 3999:  # the last item of the second of two partitions
            from support.waiting import poll_until
            poll_until(lambda: _prepared(dsn) or None, timeout=60, interval=0.05)
            mark.write_text(str(len(_prepared(dsn))))
            raise RuntimeError("the second task fails after the first has prepared")
        return i
    p = Pipeline()
    (p.read_from(Sources.items(range(4000)))
      .map(fail_once_the_other_task_has_prepared)
      .write_to(Sinks.postgres("kv", dsn, value_fn=lambda i: (i, 0), exactly_once=True)))

    with pytest.raises(Exception, match="the second task fails after the first has prepared"):
        spark_runner.run(p)

    assert int(mark.read_text()) >= 1, "no task had prepared its transaction"
    assert _prepared(dsn) == []
    assert _rows(dsn) == []


# A Spark task writes its partition in one transaction; its first attempt fails after it has
# sent two batches, and the retried attempt's rows are the ones committed.
RETRIED_TASK_FILE = '''
import sys
from jetwake import Pipeline, Sinks, Sources

dsn, n, fail_at, mark = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def fail_on_first_attempt(i):
    from pyspark import TaskContext
    if i == fail_at and TaskContext.get().attemptNumber() == 0:
        open(mark, "w").write("failed")
        raise RuntimeError("the first attempt of this task fails half-way")
    return i

pipeline = Pipeline()
(pipeline.read_from(Sources.items(range(n)))
    .map(fail_on_first_attempt)
    .write_to(Sinks.postgres("kv", dsn, value_fn=lambda i: (i, i), exactly_once=True,
                             batch_size=500)))
'''


@pytest.mark.spark
def test_a_retried_task_leaves_each_row_once_and_no_prepared_transaction(postgres_database,
                                                                          tmp_path):
    _table(postgres_database, key=False)
    f = tmp_path / "retried.py"
    f.write_text(RETRIED_TASK_FILE)
    mark = tmp_path / "first-attempt"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    # local[1,2]: one core, and a failed task is tried twice; 1000 items are one partition
    proc = subprocess.run([str(BIN / "jetwake"), "backfill", str(f), "--master", "local[1,2]",
                           "--conf", "spark.ui.enabled=false", "--", postgres_database,
                           "1000", "900", str(mark)],
                          capture_output=True, text=True, timeout=240, env=env)

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert mark.read_text() == "failed"
    assert _rows(postgres_database) == [(i, i) for i in range(1000)]
    assert _prepared(postgres_database) == []


@pytest.mark.spark
def test_a_table_that_does_not_exist_fails_the_run_before_any_task(postgres_database,
                                                                    spark_runner):
    p = Pipeline()
    (p.read_from(Sources.items(range(10)))
      .map(lambda i: i // 0)  # never runs: the table is checked first
      .write_to(Sinks.postgres("missing", postgres_database, value_fn=lambda i: (i,),
                               exactly_once=True)))

    with pytest.raises(Exception, match="table 'missing' does not exist"):
        spark_runner.run(p)


# --- the driver's settling, on prepared transactions made as tasks make them ----------------

def test_the_driver_commits_the_winning_attempts_and_rolls_back_the_others(postgres_database):
    _table(postgres_database, key=False)
    run = "backfill.aaaa"
    won0, lost0, won1 = (make_gid(run, SINK, 0, 7), make_gid(run, SINK, 0, 3),
                         make_gid(run, SINK, 1, 5))
    _prepare_rows(postgres_database, won0, [(1, 1)])
    _prepare_rows(postgres_database, lost0, [(1, 100)])  # a failed or speculative attempt
    _prepare_rows(postgres_database, won1, [(2, 2)])

    with psycopg.connect(postgres_database, autocommit=True) as conn:
        settle_run(conn, run, SINK, {won0, won1})

    assert _rows(postgres_database) == [(1, 1), (2, 2)]
    assert _prepared(postgres_database) == []


def test_the_next_run_commits_a_dead_drivers_run_that_had_decided(postgres_database):
    _table(postgres_database, key=False)
    run = "backfill.bbbb"
    _prepare_rows(postgres_database, make_gid(run, SINK, 1, 4), [(2, 2)])
    _prepare_rows(postgres_database, make_gid(run, SINK, DECISION_INDEX, 2), [])
    # partition 0's transaction was committed before the driver died
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("INSERT INTO kv VALUES (1, 1)")
        settle_leftovers(conn, SINK, "test")

    assert _rows(postgres_database) == [(1, 1), (2, 2)]
    assert _prepared(postgres_database) == []


def test_the_next_run_rolls_back_a_dead_drivers_run_that_had_not_decided(postgres_database):
    _table(postgres_database, key=False)
    run, other_sink = "backfill.cccc", "postgres-sink-other"
    _prepare_rows(postgres_database, make_gid(run, SINK, 0, 1), [(1, 1)])
    _prepare_rows(postgres_database, make_gid(run, SINK, 1, 2), [(2, 2)])
    _prepare_rows(postgres_database, make_gid(run, other_sink, 0, 1), [(3, 3)])

    with psycopg.connect(postgres_database, autocommit=True) as conn:
        settle_leftovers(conn, SINK, "test")

    assert _rows(postgres_database) == []
    # another sink's run is not this run's to settle
    assert _prepared(postgres_database) == [make_gid(run, other_sink, 0, 1)]
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(f"ROLLBACK PREPARED '{make_gid(run, other_sink, 0, 1)}'")
