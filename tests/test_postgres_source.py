"""``Sources.postgres``: the rows of a query, read by one processor or split into key ranges
over processors and members, on a member, on a cluster of two member processes and in the
Spark backfill, against a real PostgreSQL server (tests/support/postgres_server.py).

Every test has a database of its own; the rows read are compared with the table's rows.
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from jetwake import JobConfig, Member, Pipeline, Sinks, Sources
from jetwake.connectors.postgres import source as pg_source
from jetwake.connectors.postgres.source import (
    PostgresSourceError, PostgresSourceSpec, find_snapshot, plan_reads, publish_snapshot,
    read_range, snapshot_tag, split_key_range,
)
from support.spark_fixtures import spark_runner  # noqa: F401 - a fixture
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


def _create(dsn: str, rows: list[tuple]) -> None:
    """A table ``events (id int primary key, k int, name text, amount numeric, at date)``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id integer PRIMARY KEY, k integer, name text, "
                     "amount numeric(10, 2), at date)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO events VALUES (%s, %s, %s, %s, %s)", rows)


def _row(i: int, k: int | None) -> tuple:
    return (i, k, f"event-{i}", Decimal(i % 1000) / 4, dt.date(2024, 1, 1) + dt.timedelta(i % 365))


def _as_row(d: dict) -> tuple:
    return (d["id"], d["k"], d["name"], d["amount"], d["at"])


def _read_on_member(pipeline: Pipeline, name: str = "out", **config) -> list:
    with Member() as m:
        m.new_job(pipeline, JobConfig(**config)).join()
        return list(m.get_list(name))


def _pipeline(source) -> Pipeline:
    p = Pipeline()
    p.read_from(source).write_to(Sinks.list("out"))
    return p


# --- the split ----------------------------------------------------------------------------

def test_key_ranges_are_cut_at_equal_widths_for_each_kind_of_column():
    assert split_key_range(0, 99, 4, "int") == [25, 50, 75]
    assert split_key_range(5, 7, 10, "int") == [6, 7]  # three values: three ranges
    assert split_key_range(Decimal("0"), Decimal("1"), 4, "numeric") == [
        Decimal("0.25"), Decimal("0.5"), Decimal("0.75")]
    assert split_key_range(dt.date(2024, 1, 1), dt.date(2024, 1, 31), 3, "date") == [
        dt.date(2024, 1, 11), dt.date(2024, 1, 21)]
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert split_key_range(t0, t0 + dt.timedelta(hours=2), 2, "timestamp") == [
        t0 + dt.timedelta(hours=1)]
    assert split_key_range(3, 3, 8, "int") == []


def test_the_split_reads_every_row_once_with_nulls_and_a_skewed_key(postgres_database):
    # nine in ten keys in 0..9, the rest spread up to 100000; every 50th key NULL
    rows = [_row(i, None if i % 50 == 0 else (i % 10 if i % 10 else i * 37 % 100_000))
            for i in range(3000)]
    _create(postgres_database, rows)
    source = Sources.postgres("SELECT * FROM events", postgres_database, partition_column="k",
                              partitions=6)

    out = _read_on_member(_pipeline(source), local_parallelism=3)

    assert sorted(map(_as_row, out)) == sorted(rows)


def test_more_partitions_than_rows_reads_each_row_once(postgres_database):
    rows = [_row(i, i * 10) for i in range(3)]
    _create(postgres_database, rows)

    out = _read_on_member(_pipeline(Sources.postgres(
        "SELECT * FROM events;", postgres_database, partition_column="k", partitions=64)),
        local_parallelism=4)

    assert sorted(map(_as_row, out)) == rows


def test_a_date_column_splits_the_read_and_values_come_as_psycopg_adapts_them(
        postgres_database):
    rows = [_row(i, i) for i in range(500)]
    _create(postgres_database, rows)

    out = _read_on_member(_pipeline(Sources.postgres(
        "SELECT id, k, name, amount, at FROM events", postgres_database,
        partition_column="at")), local_parallelism=4)

    assert sorted(map(_as_row, out)) == rows
    first = min(out, key=lambda d: d["id"])
    assert first == {"id": 0, "k": 0, "name": "event-0", "amount": Decimal("0.00"),
                     "at": dt.date(2024, 1, 1)}


def test_without_a_partition_column_one_processor_reads_the_query_in_its_order(
        postgres_database):
    rows = [_row(i, i % 7) for i in range(2500)]
    _create(postgres_database, rows)

    out = _read_on_member(_pipeline(Sources.postgres(
        "SELECT * FROM events ORDER BY id DESC", postgres_database)), local_parallelism=4)

    assert [d["id"] for d in out] == list(range(2499, -1, -1))


@pytest.mark.parametrize("partition_column", [None, "k"])
def test_a_query_with_percent_signs_and_a_closing_comment_reads_as_written(
        postgres_database, partition_column):
    _create(postgres_database, [_row(i, i) for i in range(300)])
    query = "SELECT * FROM events WHERE name LIKE 'event-1%' -- the hundreds and the ones"

    out = _read_on_member(_pipeline(Sources.postgres(
        query, postgres_database, partition_column=partition_column)), local_parallelism=2)

    assert sorted(d["id"] for d in out) == [i for i in range(300) if str(i).startswith("1")]


def test_every_range_is_read_in_the_snapshot_the_plan_was_made_in(postgres_database):
    _create(postgres_database, [_row(i, i) for i in range(100)])
    spec = PostgresSourceSpec("SELECT * FROM events", postgres_database, "k", 4, "test")
    with psycopg.connect(postgres_database) as holder:
        plan = plan_reads(holder, spec, 4)
        # committed after the plan's snapshot: no range may see these
        with psycopg.connect(postgres_database, autocommit=True) as other:
            other.execute("INSERT INTO events SELECT g, g, 'late', 0, NULL "
                          "FROM generate_series(100, 199) g")
            other.execute("DELETE FROM events WHERE id < 10")
        read = [row["id"] for r in plan.ranges
                for chunk in read_range(spec, r, plan.snapshot) for row in chunk]

    assert len(plan.ranges) == 4 and plan.snapshot
    assert sorted(read) == list(range(100))


def test_another_member_finds_the_first_members_snapshot_and_plans_the_same_ranges(
        postgres_database):
    _create(postgres_database, [_row(i, i) for i in range(100)])
    spec = PostgresSourceSpec("SELECT * FROM events", postgres_database, "k", None, "test")
    tag = snapshot_tag("execution-1", "postgres-source")
    with psycopg.connect(postgres_database) as first, \
            psycopg.connect(postgres_database, autocommit=True) as second:
        plan = plan_reads(first, spec, 4, publish=lambda s: publish_snapshot(first, tag, s))
        with psycopg.connect(postgres_database, autocommit=True) as other:
            other.execute("INSERT INTO events SELECT g, g, 'late', 0, NULL "
                          "FROM generate_series(100, 199) g")
        shared = find_snapshot(second, tag, "test")
        second.autocommit = False
        again = plan_reads(second, spec, 4, snapshot=shared)
        first.close()  # the second member's own export outlives the first's
        read = [row["id"] for r in again.ranges
                for chunk in read_range(spec, r, again.snapshot) for row in chunk]

    assert shared == plan.snapshot
    assert again.ranges == plan.ranges
    assert sorted(read) == list(range(100))


def test_a_member_that_finds_no_snapshot_of_the_first_member_says_why(postgres_database):
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        with pytest.raises(PostgresSourceError, match="the job's first member did not show "
                                                      "its snapshot of the database in 0 s"):
            find_snapshot(conn, snapshot_tag("execution-2", "postgres-source"), "test",
                          timeout_s=0.2)


def test_a_reference_table_read_into_a_map_enriches_a_stream(postgres_database):
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id integer PRIMARY KEY, tier text)")
        conn.execute("INSERT INTO customers SELECT g, 'tier-' || (g % 3) "
                     "FROM generate_series(1, 200) g")
    load = Pipeline()
    (load.read_from(Sources.postgres("SELECT id, tier FROM customers", postgres_database,
                                     partition_column="id"))
         .write_to(Sinks.map("customers", key_fn=lambda r: r["id"],
                             value_fn=lambda r: r["tier"])))
    orders = [(n, 1 + n * 7 % 250) for n in range(300)]  # customers 201..250 do not exist
    enrich = Pipeline()
    (enrich.read_from(Sources.items(orders))
           .map_using_map("customers", lambda o: o[1], lambda o, tier: (*o, tier))
           .write_to(Sinks.list("enriched")))

    with Member() as m:
        m.new_job(load).join()
        m.new_job(enrich).join()
        enriched = list(m.get_list("enriched"))

    assert sorted(enriched) == sorted(
        (n, c, f"tier-{c % 3}" if c <= 200 else None) for n, c in orders)


def test_a_restarted_job_goes_on_from_the_saved_ranges_and_emits_each_row_once(
        postgres_database):
    rows = [_row(i, i // 3) for i in range(30_000)]  # three rows per key
    _create(postgres_database, rows)
    p = Pipeline()
    (p.read_from(Sources.postgres("SELECT * FROM events", postgres_database,
                                  partition_column="k", partitions=5))
      .map(_slowly)
      .write_to(Sinks.list("out")))

    with Member() as m:
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                     snapshot_interval_ms=60_000, local_parallelism=2))
        out = m.get_list("out")
        wait_until(lambda: job.metrics().get("postgres-source", {}).get("records_in", 0) > 0,
                   what="the source to read rows", timeout=30, interval=0.01)
        job.take_snapshot()  # in the middle of the read: the restart goes on from it
        in_snapshot = len(out)
        job.restart()
        job.join()
        metrics = job.metrics()

    assert 0 < in_snapshot < len(rows)
    assert sorted(map(_as_row, out)) == sorted(rows)
    # the restarted execution read only what the snapshot had not seen
    assert metrics["postgres-source"]["records_in"] == len(rows) - in_snapshot


def _slowly(row: dict) -> dict:
    if row["id"] % 200 == 0:
        import time
        time.sleep(0.005)  # throttles the stream so that snapshots fall inside the read
    return row


# --- bad input ------------------------------------------------------------------------------

def test_a_query_that_fails_names_the_servers_message_and_the_query(postgres_database):
    p = _pipeline(Sources.postgres("SELECT * FROM no_such_table", postgres_database))

    with pytest.raises(Exception) as failure:
        _read_on_member(p)

    assert 'relation "no_such_table" does not exist' in str(failure.value)
    assert "the query was: SELECT * FROM no_such_table" in str(failure.value)


def test_a_partition_column_not_in_the_result_names_the_columns(postgres_database):
    _create(postgres_database, [_row(1, 1)])
    p = _pipeline(Sources.postgres("SELECT id, name FROM events", postgres_database,
                                   partition_column="k"))

    with pytest.raises(Exception, match=r"partition_column 'k' is not a column of the query's "
                                        r"result \(its columns: \['id', 'name'\]\)"):
        _read_on_member(p)


def test_a_text_partition_column_is_refused_with_the_fix(postgres_database):
    _create(postgres_database, [_row(1, 1)])
    p = _pipeline(Sources.postgres("SELECT * FROM events", postgres_database,
                                   partition_column="name"))

    with pytest.raises(Exception, match="partition_column 'name' is of type text; .* numeric, "
                                        "date or timestamp column"):
        _read_on_member(p)


def test_columns_of_the_same_name_are_refused(postgres_database):
    _create(postgres_database, [_row(1, 1)])
    p = _pipeline(Sources.postgres("SELECT e.id, f.id FROM events e JOIN events f USING (id)",
                                   postgres_database))

    with pytest.raises(Exception, match=r"names column\(s\) \['id'\] more than once"):
        _read_on_member(p)


@pytest.mark.parametrize("kwargs, message", [
    ({"partition_column": "k", "partitions": 0}, "partitions must be an int >= 1"),
    ({"partitions": 4}, "partitions=4 needs a partition_column"),
    ({"partition_column": ""}, "partition_column must be the name of a column"),
])
def test_bad_settings_fail_when_the_pipeline_is_built(kwargs, message):
    with pytest.raises(PostgresSourceError, match=message):
        Sources.postgres("SELECT 1", "postgresql://u@127.0.0.1/db", **kwargs)


def test_a_dsn_that_is_not_one_fails_when_the_pipeline_is_built():
    with pytest.raises(PostgresSourceError, match="the dsn is not a libpq connection string"):
        Sources.postgres("SELECT 1", "host=127.0.0.1 port")
    with pytest.raises(PostgresSourceError, match="needs a query"):
        Sources.postgres("  ", "postgresql://u@127.0.0.1/db")


def test_a_server_that_does_not_answer_fails_the_job_naming_it(monkeypatch):
    from support.ports import free_port

    monkeypatch.setattr(pg_source, "CONNECT_TIMEOUT_S", 1.0)
    dsn = f"postgresql://jetwake:secret@127.0.0.1:{free_port()}/jetwake"
    p = _pipeline(Sources.postgres("SELECT 1 AS x", dsn))

    with pytest.raises(Exception) as failure:
        _read_on_member(p)

    text = str(failure.value)
    assert "did not answer" in text and "start the server or fix the dsn" in text
    assert "secret" not in text


# --- on a cluster and on Spark ------------------------------------------------------------

@pytest.mark.kafka
def test_the_members_of_a_cluster_split_the_read_and_give_every_row_once(
        postgres_database, tmp_path: Path, three):
    rows = [_row(i, i % 997) for i in range(4000)]
    _create(postgres_database, rows)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    job_file = tmp_path / "pg_job.py"
    job_file.write_text(
        "import os\n"
        "from jetwake import Pipeline, Sinks, Sources\n"
        "pipeline = Pipeline()\n"
        f"(pipeline.read_from(Sources.postgres('SELECT * FROM events', {postgres_database!r}, "
        "partition_column='k'))\n"
        "    .map(lambda r: f\"{os.getpid()} {r['id']}\")\n"
        f"    .write_to(Sinks.files({str(out_dir)!r})))\n")
    job = three.cli_json(three.members[0], "submit", str(job_file), "--name", "pg")
    wait_until(lambda: three.status(three.members[1], job["id"])
               ["status"] in ("COMPLETED", "FAILED"), what="the job to end", timeout=60,
               interval=0.05)
    status = three.status(three.members[1], job["id"])

    assert status["status"] == "COMPLETED", status
    lines = [line.split() for f in out_dir.iterdir() for line in f.read_text().splitlines()]
    assert sorted(int(i) for _, i in lines) == list(range(4000))
    assert len({pid for pid, _ in lines}) == 3  # every member read ranges


@pytest.mark.spark
def test_the_backfill_reads_one_spark_partition_per_range(postgres_database, spark_runner,
                                                          tmp_path: Path):
    rows = [_row(i, None if i % 100 == 0 else i) for i in range(2000)]
    _create(postgres_database, rows)
    p = Pipeline()
    (p.read_from(Sources.postgres("SELECT * FROM events", postgres_database,
                                  partition_column="k", partitions=4))
      .map(lambda r: r["id"])
      .write_to(Sinks.files(str(tmp_path / "out"))))

    result = spark_runner.run(p)

    ids = sorted(int(line) for f in (tmp_path / "out").iterdir()
                 for line in f.read_text().splitlines())
    assert ids == list(range(2000))
    assert result.counters["records_in"] == 2000
    # the driver's connection that held the snapshot is closed with the run (and the
    # executors' ones: a server backend leaves pg_stat_activity a moment after its client
    # disconnects, so the count is polled; a connection left open keeps it above 0)
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        def others() -> int:
            return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                "current_database() AND pid <> pg_backend_pid()").fetchone()[0]
        wait_until(lambda: others() == 0, timeout=15, interval=0.1,
                   what=lambda: f"every other connection closed ({others()} open)")


@pytest.mark.spark
def test_a_job_started_from_the_backfills_snapshot_does_not_read_the_rows_again(
        postgres_database, spark_runner):
    rows = [_row(i, i) for i in range(1000)]
    _create(postgres_database, rows)
    p = _pipeline(Sources.postgres("SELECT * FROM events", postgres_database,
                                   partition_column="k", partitions=3))

    with Member() as m:
        spark_runner.run(p, export_snapshot="after-backfill", member=m)
        backfilled = len(m.get_list("out"))
        job = m.new_job(p, JobConfig(initial_snapshot_name="after-backfill",
                                     processing_guarantee="exactly_once"))
        job.join()
        metrics = job.metrics()
        out = list(m.get_list("out"))

    assert backfilled == 1000
    assert sorted(map(_as_row, out)) == rows
    assert metrics["postgres-source"]["records_in"] == 0
