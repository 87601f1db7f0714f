"""``Sinks.postgres`` against a real PostgreSQL server (tests/support/postgres_server.py):
rows in insert and upsert mode, the exactly-once sink's two phases driven by hand (prepare,
commit, a failed snapshot, the settling after a restore, with another parallelism), a server
restarted in the middle of a job, the refusal of ``max_prepared_transactions = 0``, and bad
input. Kills of real member processes are in tests/test_postgres_sink_kills.py."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from jetwake import JobConfig, Member, Pipeline, Sinks, Sources
from jetwake.connectors.postgres.rows import PostgresSinkError
from jetwake.engine.core.processor import Inbox
from support.postgres_server import postgres_local
from support.sink_processors import sink_processor
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

VERTEX = "pg-sink"


def sql(dsn: str, statement: str, params: tuple = ()) -> list:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def prepared_gids(dsn: str) -> list[str]:
    return [r[0] for r in sql(dsn, "SELECT gid FROM pg_prepared_xacts WHERE database = "
                                   "current_database() ORDER BY gid")]


class HandDriven:
    """One sink processor made the way a job makes it and driven through the processor
    contract by hand (a "crash" is a processor dropped with its connections cut)."""

    def __init__(self, sink, job_id: str, *, restored_id: int = -1, index: int = 0,
                 total: int = 1, guarantee: str = "exactly_once") -> None:
        self.proc, self.snap = sink_processor(sink, job_id, VERTEX, restored_id=restored_id,
                                              guarantee=guarantee, index=index, total=total)

    def process(self, items: list) -> None:
        self.proc.process(0, Inbox(list(items)))
        self.proc.try_process()

    def phase1(self, sid: int) -> None:
        self.proc.context.snapshot_id = sid
        assert self.proc.save_to_snapshot()
        assert self.proc.snapshot_commit_prepare()

    def phase2(self, sid: int, success: bool = True) -> None:
        self.proc.context.snapshot_id = sid
        assert self.proc.snapshot_commit_finish(success)

    def crash(self) -> None:
        """The process dies: its connections drop (the server rolls the open transactions
        back), and nothing of close() runs."""
        for conn in (self.proc.conn, self.proc._ctl_conn):
            if conn is not None:
                conn.close()

    @property
    def metrics(self) -> dict:
        return self.proc.context.metrics


@pytest.fixture
def events_table(postgres_database: str) -> str:
    sql(postgres_database, "CREATE TABLE events (id integer NOT NULL, name text NOT NULL)")
    return postgres_database


def rows(dsn: str, table: str = "events") -> list:
    return sql(dsn, f"SELECT * FROM {table} ORDER BY 1, 2")


# --- insert and upsert -----------------------------------------------------------------------

def test_tuples_and_dicts_become_rows_of_the_table_s_columns(events_table: str) -> None:
    p = Pipeline()
    src = p.read_from(Sources.items(list(range(300))))
    src.write_to(Sinks.postgres("events", events_table, batch_size=64,
                                value_fn=lambda i: (i, f"t{i}")))     # the catalog's columns
    src.write_to(Sinks.postgres("events", events_table, columns=["name", "id"],
                                value_fn=lambda i: {"id": -i - 1, "name": f"d{i}"}))
    with Member() as m:
        job = m.new_job(p)
        job.join()
        metrics = job.metrics()
    assert rows(events_table) == sorted([(i, f"t{i}") for i in range(300)]
                                        + [(-i - 1, f"d{i}") for i in range(300)])
    written = [v for k, v in metrics.items() if k.startswith("postgres-sink")]
    assert sum(v["rows_written"] for v in written) == 600
    assert sum(v["batches_written"] for v in written) >= 300 // 64 + 1


def test_upsert_leaves_the_last_row_of_each_key(postgres_database: str) -> None:
    sql(postgres_database, "CREATE TABLE totals (k text PRIMARY KEY, total integer)")
    sql(postgres_database, "INSERT INTO totals VALUES ('k0', -1), ('other', 7)")
    p = Pipeline()
    (p.read_from(Sources.items([(f"k{i % 7}", i) for i in range(700)]))
      .write_to(Sinks.postgres("totals", postgres_database, key_columns=["k"], batch_size=50,
                               value_fn=lambda kv: {"k": kv[0], "total": kv[1]})))
    with Member(local_parallelism=2) as m:
        m.new_job(p).join()
    assert rows(postgres_database, "totals") == sorted(
        [(f"k{k}", 693 + k) for k in range(7)] + [("other", 7)])


def test_upsert_of_values_of_mixed_python_types_and_of_other_column_types(
        postgres_database: str) -> None:
    """A batch whose column holds ints and floats, or a jsonb column, cannot go over arrays:
    the rows go one by one (executemany), with the same result."""
    from psycopg.types.json import Jsonb

    sql(postgres_database, "CREATE TABLE mixed (k integer PRIMARY KEY, x float8)")
    sql(postgres_database, "CREATE TABLE docs (k integer PRIMARY KEY, doc jsonb)")
    p = Pipeline()
    src = p.read_from(Sources.items(list(range(40))))
    src.write_to(Sinks.postgres("mixed", postgres_database, key_columns=["k"],
                                value_fn=lambda i: (i % 10, i if i % 2 else i + 0.5)))
    src.write_to(Sinks.postgres("docs", postgres_database, key_columns=["k"],
                                value_fn=lambda i: (i % 10, Jsonb({"i": i}))))
    with Member() as m:
        m.new_job(p).join()
    assert rows(postgres_database, "mixed") == [
        (k, 30 + k if k % 2 else 30 + k + 0.5) for k in range(10)]
    assert sql(postgres_database, "SELECT k, doc->>'i' FROM docs ORDER BY k") == [
        (k, str(30 + k)) for k in range(10)]


def test_upsert_under_at_least_once_replays_into_exact_contents(postgres_database: str) -> None:
    """The job restarts before its first snapshot, so the source replays every event: the
    replayed upserts write every row of the first wave again (each row's xmin changes) and
    the table ends exact."""
    sql(postgres_database, "CREATE TABLE latest (k integer PRIMARY KEY, v integer)")

    def row(e):   # the first 500 events on keys 0..49, the next 500 on keys 50..99
        return (e[0] % 50 + (50 if e[0] >= 500 else 0), e[1])
    p = Pipeline()
    (p.read_from(Sources.map_journal("in", start="oldest"))
      .write_to(Sinks.postgres("latest", postgres_database, key_columns=["k"],
                               columns=["k", "v"], value_fn=row)))
    first = [(k, 450 + k) for k in range(50)]
    with Member(local_parallelism=2) as m:
        src = m.get_map("in")
        src.put_all({i: i for i in range(500)})
        job = m.new_job(p, JobConfig(processing_guarantee="at_least_once",
                                     snapshot_interval_ms=60_000))
        wait_until(lambda: rows(postgres_database, "latest") == first,
                   what="the first wave", timeout=30)
        versions = sql(postgres_database, "SELECT k, xmin::text FROM latest ORDER BY k")
        job.restart()
        src.put_all({i: i for i in range(500, 1000)})
        wait_until(lambda: rows(postgres_database, "latest")
                   == first + [(50 + k, 950 + k) for k in range(50)],
                   what="the last value of every key", timeout=30)
        again = sql(postgres_database, "SELECT k, xmin::text FROM latest WHERE k < 50 "
                                       "ORDER BY k")
        job.cancel()
    assert all(a != b for a, b in zip(versions, again)), "the first wave was not replayed"


# --- the two phases, driven by hand ----------------------------------------------------------

def eo_sink(dsn: str, **kw):
    return Sinks.postgres("events", dsn, columns=["id", "name"], exactly_once=True,
                          batch_size=10, **kw)


def test_rows_are_written_before_the_snapshot_and_visible_after_its_phase2(
        events_table: str) -> None:
    job = uuid.uuid4().hex[:12]
    sink = HandDriven(eo_sink(events_table), job)
    sink.process([(i, "a") for i in range(25)])
    assert sink.metrics["batches_written"] == 3   # sent, in the open transaction
    assert rows(events_table) == []
    sink.phase1(1)
    assert prepared_gids(events_table) == [f"jetwake:{job}:{VERTEX}:0:1"]
    assert rows(events_table) == []
    sink.phase2(1)
    assert prepared_gids(events_table) == []
    assert rows(events_table) == [(i, "a") for i in range(25)]
    assert {k: sink.metrics[k] for k in ("rows_written", "transactions_prepared",
                                         "transactions_committed")} == {
        "rows_written": 25, "transactions_prepared": 1, "transactions_committed": 1}
    sink.crash()


def test_a_failed_snapshot_s_rows_go_into_the_next_transaction(events_table: str) -> None:
    job = uuid.uuid4().hex[:12]
    sink = HandDriven(eo_sink(events_table), job)
    sink.process([(1, "x"), (2, "x")])
    sink.phase1(1)
    sink.process([(3, "y")])
    sink.phase2(1, success=False)            # snapshot 1 does not exist
    assert prepared_gids(events_table) == [] and rows(events_table) == []
    sink.phase1(2)
    sink.phase2(2)
    assert rows(events_table) == [(1, "x"), (2, "x"), (3, "y")]
    assert sink.metrics["transactions_rolled_back"] == 1
    sink.crash()


def test_a_restore_commits_the_restored_snapshot_s_transaction_and_rolls_back_later_ones(
        events_table: str) -> None:
    job = uuid.uuid4().hex[:12]
    first = HandDriven(eo_sink(events_table), job)
    first.process([(1, "s1")])
    first.phase1(1)                          # snapshot 1 committed; its phase 2 never ran
    first.process([(2, "s2")])
    first.phase1(2)                          # snapshot 2 never committed
    first.process([(3, "open")])             # in the open transaction
    first.crash()
    assert len(prepared_gids(events_table)) == 2

    again = HandDriven(eo_sink(events_table), job, restored_id=1)
    again.proc.try_process()
    assert rows(events_table) == [(1, "s1")]
    assert prepared_gids(events_table) == []
    assert (again.metrics["transactions_committed"],
            again.metrics["transactions_rolled_back"]) == (1, 1)
    again.crash()


def test_a_restore_with_fewer_processors_settles_every_old_processor_s_transactions(
        events_table: str) -> None:
    job = uuid.uuid4().hex[:12]
    old = [HandDriven(eo_sink(events_table), job, index=i, total=3) for i in range(3)]
    for i, s in enumerate(old):
        s.process([(i, "s4")])
        s.phase1(4)                          # snapshot 4 committed, phase 2 never ran
        s.process([(10 + i, "s5")])
        s.phase1(5)
        s.crash()
    new = [HandDriven(eo_sink(events_table), job, restored_id=4, index=i, total=2)
           for i in range(2)]
    for s in new:
        s.proc.try_process()
    assert rows(events_table) == [(0, "s4"), (1, "s4"), (2, "s4")]
    assert prepared_gids(events_table) == []
    for s in new:
        s.crash()


def test_complete_waits_for_phase2_then_commits_what_came_after_the_snapshot(
        events_table: str) -> None:
    job = uuid.uuid4().hex[:12]
    sink = HandDriven(eo_sink(events_table), job)
    sink.process([(1, "before")])
    sink.phase1(1)
    sink.process([(2, "after")])
    assert sink.proc.complete() is False
    sink.phase2(1)
    assert sink.proc.complete() is True
    assert rows(events_table) == [(1, "before"), (2, "after")]
    assert prepared_gids(events_table) == []
    sink.crash()


def test_upserts_in_a_prepared_transaction_are_committed_by_the_restore(
        postgres_database: str) -> None:
    sql(postgres_database, "CREATE TABLE latest (k integer PRIMARY KEY, v integer)")
    job = uuid.uuid4().hex[:12]
    sink = Sinks.postgres("latest", postgres_database, key_columns=["k"], exactly_once=True,
                          batch_size=4)
    first = HandDriven(sink, job)
    first.process([(i % 3, i) for i in range(10)])   # several rows of a key in a batch
    first.phase1(1)                                  # committed; phase 2 never ran
    first.crash()
    again = HandDriven(sink, job, restored_id=1)
    again.proc.try_process()
    assert rows(postgres_database, "latest") == [(0, 9), (1, 7), (2, 8)]
    assert prepared_gids(postgres_database) == []
    again.crash()


@pytest.mark.parametrize("committed", [True, False])
def test_a_processor_stopped_before_its_phase2_settles_by_the_snapshot_s_verdict(
        events_table: str, committed: bool) -> None:
    """A cancel in the middle of a snapshot: the processor closes with a prepared transaction
    whose phase 2 it never ran; the coordinator's verdict decides, and nothing stays
    prepared."""
    sink = HandDriven(eo_sink(events_table), uuid.uuid4().hex[:12])
    sink.process([(1, "a"), (2, "b")])
    sink.phase1(1)
    sink.snap.start_phase2(1, committed)   # announced; the processor stops before running it
    sink.proc.close()
    assert prepared_gids(events_table) == []
    assert rows(events_table) == ([(1, "a"), (2, "b")] if committed else [])


def test_a_cancelled_job_leaves_no_prepared_transaction(events_table: str) -> None:
    import threading

    p = Pipeline()
    (p.read_from(Sources.map_journal("in", start="oldest"))
      .rebalance(lambda e: e[0])
      .write_to(Sinks.postgres("events", events_table, value_fn=lambda e: (e[0], "x"))))
    with Member(local_parallelism=2) as m:
        src = m.get_map("in")
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                     snapshot_interval_ms=20))
        stop = threading.Event()

        def feed() -> None:   # items flow while snapshots run every 20 ms (the cancel in
            i = 0             # the middle of one: the test of the verdict above)
            while not stop.is_set():
                src.put_all({i + k: i + k for k in range(20)})
                i += 20
                stop.wait(0.002)
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            wait_until(lambda: job.metrics()["postgres-sink-events"]["transactions_committed"]
                       >= 4, what="a few snapshots", timeout=30)
            job.cancel()
        finally:
            stop.set()
            feeder.join(10)
    assert prepared_gids(events_table) == []
    ids = [r[0] for r in rows(events_table)]
    assert len(ids) == len(set(ids)), "a row was written twice"


# --- the server restarted --------------------------------------------------------------------

@pytest.fixture
def own_server():
    """A PostgreSQL server of the test's own, which it may restart."""
    from support.postgres_server import skip_unless_installed

    skip_unless_installed()
    pl = postgres_local()
    port = pl.free_port()
    dsn = pl.start_server(port, fsync=False)
    try:
        yield pl, port, dsn
    finally:
        pl.stop_server(port)


def test_a_server_restarted_mid_job_loses_and_duplicates_no_row(own_server) -> None:
    pl, port, dsn = own_server
    sql(dsn, "CREATE TABLE events (id integer NOT NULL, name text NOT NULL)")
    p = Pipeline()
    (p.read_from(Sources.map_journal("in", start="oldest"))
      .rebalance(lambda e: e[0])
      .write_to(Sinks.postgres("events", dsn, value_fn=lambda e: (e[0], str(e[1])),
                               batch_size=20)))
    with Member(local_parallelism=2) as m:
        src = m.get_map("in")
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                     snapshot_interval_ms=100))
        src.put_all({i: i for i in range(1000)})
        wait_until(lambda: sql(dsn, "SELECT count(*) FROM events")[0][0] == 1000,
                   what="the first rows", timeout=30)
        for i in range(1000, 2000):
            src.put(i, i)
            if i == 1500:
                pl.restart_server(port)        # a crash: open transactions are lost
        wait_until(lambda: sql(dsn, "SELECT count(*) FROM events")[0][0] >= 2000,
                   what="the rows after the restart", timeout=60)
        job.suspend()
        metrics = job.metrics()["postgres-sink-events"]
        job.cancel()
    assert metrics["reconnects"] >= 1, "the server restart did not reach the sink"
    assert rows(dsn) == sorted((i, str(i)) for i in range(2000))
    assert prepared_gids(dsn) == []


# --- refusals ----------------------------------------------------------------------------------

def test_a_server_without_prepared_transactions_is_refused_at_job_start() -> None:
    from support.postgres_server import skip_unless_installed

    skip_unless_installed()
    pl = postgres_local()
    port = pl.free_port()
    dsn = pl.start_server(port, fsync=False, max_prepared_transactions=0)
    try:
        sql(dsn, "CREATE TABLE events (id integer)")
        p = Pipeline()
        p.read_from(Sources.items([1, 2])).write_to(
            Sinks.postgres("events", dsn, value_fn=lambda i: (i,)))
        with Member() as m, pytest.raises(PostgresSinkError) as err:
            m.new_job(p, JobConfig(processing_guarantee="exactly_once")).join(30)
    finally:
        pl.stop_server(port)
    text = str(err.value)
    assert "max_prepared_transactions is 0" in text
    assert "ALTER SYSTEM SET max_prepared_transactions = 64" in text and "restart" in text


def run_failing(sink, items=(1,), guarantee: str = "none") -> str:
    p = Pipeline()
    p.read_from(Sources.items(list(items))).write_to(sink)
    with Member() as m, pytest.raises(PostgresSinkError) as err:
        m.new_job(p, JobConfig(processing_guarantee=guarantee)).join(30)
    return str(err.value)


def test_an_unknown_table_names_the_table_and_the_database(postgres_database: str) -> None:
    text = run_failing(Sinks.postgres("missing", postgres_database))
    assert "table 'missing' does not exist in database" in text and "create it" in text


def test_an_unknown_column_names_the_table_s_columns(events_table: str) -> None:
    text = run_failing(Sinks.postgres("events", events_table, columns=["id", "nme"]))
    assert "has no column(s) ['nme']" in text and "['id', 'name']" in text


def test_a_row_of_the_wrong_shape_names_the_item_and_the_fix(events_table: str) -> None:
    text = run_failing(Sinks.postgres("events", events_table, value_fn=lambda i: (i,)),
                       items=[41])
    assert "item 41" in text and "1 value(s)" in text and "['id', 'name']" in text
    text = run_failing(Sinks.postgres("events", events_table, value_fn=lambda i: {"id": i}),
                       items=[42])
    assert "item 42" in text and "missing ['name']" in text


def test_a_row_the_table_refuses_names_the_table_and_the_row(events_table: str) -> None:
    text = run_failing(Sinks.postgres("events", events_table,
                                      value_fn=lambda i: (i, None)), items=[7])
    assert "table 'events'" in text and "(7, None)" in text and "NotNullViolation" in text


def test_a_dsn_that_does_not_answer_names_the_connection_error(postgres_database: str) -> None:
    bad = postgres_database.replace("dbname=", "dbname=nowhere_")
    text = run_failing(Sinks.postgres("events", bad))
    assert "cannot connect to PostgreSQL" in text and "does not exist" in text
    with pytest.raises(PostgresSinkError, match="not a libpq connection string"):
        Sinks.postgres("events", "host=127.0.0.1 port")


def test_a_server_that_does_not_answer_is_retried_then_restarts_the_job() -> None:
    from jetwake.connectors.postgres.connection import connect
    from jetwake.engine.core.errors import RestartableError
    from support.ports import free_port

    port = free_port()   # nothing listens there
    with pytest.raises(RestartableError) as err:
        connect(f"postgresql://jetwake@127.0.0.1:{port}/jetwake", "Sinks.postgres('t')",
                timeout_s=1)
    text = str(err.value)
    assert f"connecting to PostgreSQL at 127.0.0.1:{port}" in text
    assert "Connection refused" in text and "restarting the job" in text


def test_key_columns_without_a_unique_key_say_on_conflict_needs_one(events_table: str) -> None:
    text = run_failing(Sinks.postgres("events", events_table, key_columns=["id"]))
    assert "key_columns ['id'] are not a unique key of table 'events'" in text
    assert "ON CONFLICT needs a primary key or a unique index" in text


def test_exactly_once_true_in_a_job_without_snapshots_is_refused(events_table: str) -> None:
    text = run_failing(Sinks.postgres("events", events_table, exactly_once=True))
    assert "exactly_once=True needs a job with exactly-once snapshots" in text
