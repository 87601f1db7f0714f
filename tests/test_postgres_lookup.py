"""A PostgreSQL table looked up through an async driver: ``Stage.map_using_service_async`` with
a psycopg ``AsyncConnectionPool`` as the service, against a real PostgreSQL server
(tests/support/postgres_server.py, docs/postgres.md).

Each test has a database of its own with a table of customers; a job enriches orders with their
customer's name and tier, one query per order. The pool connects under an application name of
the test's own, so that ``pg_stat_activity`` shows which of the server's connections are the
job's.
"""
from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from jetwake import JobConfig, Member, Pipeline, ServiceError, ServiceFactory, Sinks, Sources
from support.ports import free_port
from support.spark_fixtures import run_on_spark, spark_runner  # noqa: F401 - a fixture
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

TIERS = ("bronze", "silver", "gold")
CUSTOMERS = {c: (f"customer-{c}", TIERS[c % 3]) for c in range(1, 301)}
# customer ids 301..320 are in no row: those orders find nothing
ORDERS = [(n, 1 + (n * 7919) % 320, (n * 37) % 1000 / 10) for n in range(1000)]


def _create_customers(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, "
                     "tier text NOT NULL)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO customers VALUES (%s, %s, %s)",
                            [(c, name, tier) for c, (name, tier) in CUSTOMERS.items()])


def _joined(orders: list[tuple], customers: dict[int, tuple[str, str]]) -> list[tuple]:
    """The expected output: each order with its customer's row, computed in plain Python."""
    return [(*order, *customers[order[1]]) for order in orders if order[1] in customers]


def _pool_factory(dsn: str, application_name: str, max_size: int = 4) -> ServiceFactory:
    """A connection pool per processor, opened on the stage's event loop and closed with the
    job."""
    async def open_pool() -> AsyncConnectionPool:
        pool = AsyncConnectionPool(dsn, min_size=1, max_size=max_size, open=False,
                                   kwargs={"application_name": application_name,
                                           "autocommit": True})
        await pool.open(wait=True, timeout=30)
        return pool

    async def close_pool(pool: AsyncConnectionPool) -> None:
        await pool.close()

    return ServiceFactory(create_fn=open_pool, destroy_fn=close_pool)


async def _with_customer(pool: AsyncConnectionPool, order: tuple) -> tuple | None:
    """The order with its customer's name and tier; None (the order is dropped) for a
    customer the table does not have."""
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT name, tier FROM customers WHERE id = %s", (order[1],))
        row = await cur.fetchone()
    return None if row is None else (*order, *row)


def _job_connections(dsn: str, application_name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           (application_name,)).fetchone()
    assert row is not None
    return int(row[0])


def _application_name() -> str:
    return f"jetwake-test-{uuid.uuid4().hex[:8]}"


def test_each_order_gets_its_customers_row_as_the_table_joined_in_python(postgres_database):
    dsn, app = postgres_database, _application_name()
    _create_customers(dsn)
    p = Pipeline()
    (p.read_from(Sources.items(ORDERS))
      .map_using_service_async(_pool_factory(dsn, app), _with_customer, max_concurrent=8)
      .write_to(Sinks.list("enriched")))

    with Member() as m:
        m.new_job(p).join(timeout=120)
        enriched = list(m.get_list("enriched"))

    assert sorted(map(tuple, enriched)) == sorted(_joined(ORDERS, CUSTOMERS))
    assert len(enriched) < len(ORDERS)  # the orders of customers 301..320 found nothing
    # the job's pools were closed when it completed: none of its connections is left
    wait_until(lambda: _job_connections(dsn, app) == 0, timeout=10,
               what=lambda: f"{_job_connections(dsn, app)} connection(s) of the job to close")


@pytest.mark.spark
def test_the_spark_backfill_gives_each_order_its_customers_row_too(postgres_database,
                                                                 spark_runner):
    dsn, app = postgres_database, _application_name()
    _create_customers(dsn)

    def build(p: Pipeline) -> None:
        (p.read_from(Sources.items(ORDERS))
          .map_using_service_async(_pool_factory(dsn, app), _with_customer, max_concurrent=8)
          .write_to(Sinks.list("enriched")))

    on_spark, result = run_on_spark(spark_runner, build, ["enriched"])

    assert sorted(map(tuple, on_spark["enriched"])) == sorted(_joined(ORDERS, CUSTOMERS))
    assert result.counters["calls"] == len(ORDERS)
    # each task's pool was closed when the task ended
    wait_until(lambda: _job_connections(dsn, app) == 0, timeout=10,
               what=lambda: f"{_job_connections(dsn, app)} connection(s) of the run to close")


def test_a_row_updated_while_the_job_runs_is_seen_by_the_orders_after_it(postgres_database):
    dsn, app = postgres_database, _application_name()
    _create_customers(dsn)
    first, second = ORDERS[:200], ORDERS[200:400]
    p = Pipeline()
    (p.read_from(Sources.map_journal("orders", start="oldest"))
      .map(lambda entry: entry[1])
      .map_using_service_async(_pool_factory(dsn, app), _with_customer, max_concurrent=8)
      .write_to(Sinks.list("enriched")))

    with Member() as m:
        orders, enriched = m.get_map("orders"), m.get_list("enriched")
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                     snapshot_interval_ms=200))
        orders.put_all([(o[0], o) for o in first])
        wait_until(lambda: len(enriched) == len(_joined(first, CUSTOMERS)), timeout=60,
                   what=lambda: f"the first orders enriched ({len(enriched)} so far)")
        assert _job_connections(dsn, app) >= 1  # the job's pool is connected while it runs

        # every customer's tier changes; the orders after the change see the new one
        promoted = {c: (name, "platinum") for c, (name, _) in CUSTOMERS.items()}
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE customers SET tier = 'platinum'")
        orders.put_all([(o[0], o) for o in second])
        expected = _joined(first, CUSTOMERS) + _joined(second, promoted)
        wait_until(lambda: len(enriched) == len(expected), timeout=60,
                   what=lambda: f"the later orders enriched ({len(enriched)} so far)")
        job.cancel()
        got = list(enriched)

    assert sorted(map(tuple, got)) == sorted(expected)
    # the cancelled job's pools were closed: none of its connections is left
    wait_until(lambda: _job_connections(dsn, app) == 0, timeout=10,
               what=lambda: f"{_job_connections(dsn, app)} connection(s) of the job to close")


def test_a_service_that_cannot_connect_fails_the_job_naming_the_stage_and_the_error():
    port = free_port()  # nothing listens there
    dsn = f"postgresql://jetwake@127.0.0.1:{port}/jetwake"

    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(dsn, connect_timeout=10)

    async def close(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.close()

    async def lookup(conn: psycopg.AsyncConnection[Any], order: tuple) -> tuple:
        raise AssertionError("no call reaches a service that was never created")

    p = Pipeline()
    (p.read_from(Sources.items(ORDERS[:10]))
      .map_using_service_async(ServiceFactory(create_fn=connect, destroy_fn=close), lookup)
      .set_name("customer-lookup")
      .write_to(Sinks.list("enriched")))

    with Member() as m, pytest.raises(ServiceError) as failure:
        m.new_job(p).join(timeout=60)

    message = str(failure.value)
    assert "'customer-lookup'" in message
    assert f'connection to server at "127.0.0.1", port {port} failed: Connection refused' \
        in message
