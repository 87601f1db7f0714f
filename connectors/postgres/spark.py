"""``Sinks.postgres`` on the Spark backfill (``Sources.postgres``'s reader is in
:mod:`.source`). The rows are made and written by the sink's own functions
(:class:`~.rows.RowMaker`, :func:`~.statements.write_batch`, :mod:`.prepared_transactions`).

- Without exactly-once, each task writes its partition ``batch_size`` rows at a time and
  commits every batch: with ``key_columns`` an upsert, so a retried task writes the same
  contents again; without, plain inserts (at-least-once: a retried task's rows of its failed
  attempt stay).
- With ``exactly_once=True`` each task attempt writes its partition in one transaction and
  prepares it under the gid ``jetwake:backfill.<run>:<sink>:<partition>:<task attempt id>``.
  Once the Spark job has succeeded the driver settles the run (:func:`settle_run`): it rolls
  back every prepared transaction of the run but the successful attempt's of each partition
  (failed and speculative attempts), prepares an empty *decision* transaction (writer index
  -1) that says the run commits, commits the winners and removes the decision. A run that
  fails rolls back all of its prepared transactions.
- A driver that dies leaves prepared transactions; the next run with a sink stage of the same
  name settles them before it writes (:func:`settle_leftovers`): those of a run with a
  decision are committed (it had decided), every other one rolled back.

With ``key_columns`` the items are first placed by key (jetwake's partitioning), so the rows of
one key are written by one task: two tasks never wait for each other's row locks (with
exactly-once, a lock held by a prepared transaction is only released by the driver, after
every task has ended).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Iterator

from jetwake.engine.backfill.chunks import chunked
from jetwake.engine.backfill.connector_forms import SparkWriter
from jetwake.engine.core.partitioning import partition_of
from jetwake.connectors.postgres.connection import connect
from jetwake.connectors.postgres.prepared_transactions import (
    PreparedGid, commit_prepared, list_prepared, make_gid, prepare, rollback_prepared,
    sink_key,
)
from jetwake.connectors.postgres.rows import PostgresSinkError, RowMaker
from jetwake.connectors.postgres.statements import write_batch

__all__ = ["PostgresSparkWriter", "write_partition", "settle_run", "settle_leftovers",
           "run_prepared", "BACKFILL_JOB_PREFIX", "DECISION_INDEX"]

log = logging.getLogger("jetwake.postgres")

BACKFILL_JOB_PREFIX = "backfill."
"""The job part of a backfill's gids starts with this, followed by the run's id."""

DECISION_INDEX = -1
"""The writer index of a run's decision transaction (see the module docstring)."""


class PostgresSparkWriter(SparkWriter):
    """``Sinks.postgres`` on the Spark backfill (see the module docstring)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    def write(self, backfill: Any, t: Any, chunks: Any) -> int:
        from jetwake.connectors.postgres.sink import open_checked

        spec = self.spec
        eo = bool(spec.exactly_once)
        # the table, its columns, the key and max_prepared_transactions checked on the driver,
        # before any task runs
        conn, columns = open_checked(spec, eo, chunks.getNumPartitions() + 1)
        try:
            if eo:
                settle_leftovers(conn, t.name, spec.where)
        finally:
            conn.close()
        key_fn = t.sink.partition_key_fn
        if key_fn is not None:
            n = max(1, chunks.getNumPartitions())
            chunks = chunks.flatMap(lambda c: c).keyBy(
                lambda item: partition_of(key_fn(item)) % n).partitionBy(
                n, lambda k: k).values().mapPartitions(chunked)
        run = f"{BACKFILL_JOB_PREFIX}{uuid.uuid4().hex[:12]}" if eo else None
        name = t.name
        try:
            written = chunks.mapPartitionsWithIndex(
                lambda i, it: [write_partition(i, it, spec, columns, name, run)]).collect()
        except BaseException:
            if run is not None:
                try:
                    _with_conn(spec, lambda c: settle_run(c, run, name, None), "rolling back")
                except Exception:  # noqa: BLE001 - the run's own failure is what to report
                    log.warning("%s: the failed run %s could not roll back its prepared "
                                "transactions; the next run of stage %r settles them",
                                spec.where, run, name, exc_info=True)
            raise
        if run is not None:
            winners = {gid for _, gid, _ in written if gid is not None}
            _with_conn(spec, lambda c: settle_run(c, run, name, winners), "committing")
        return sum(n for _, _, n in written)


def _with_conn(spec: Any, step: Any, what: str) -> None:
    conn = connect(spec.dsn, spec.where)
    try:
        conn.autocommit = True
        step(conn)
    except Exception as e:
        if isinstance(e, PostgresSinkError):
            raise
        raise PostgresSinkError(f"{spec.where}: {what} the backfill's prepared transactions "
                                f"failed: {type(e).__name__}: {e}; the next backfill run "
                                "settles them") from e
    finally:
        conn.close()


def write_partition(index: int, chunks: Iterator[list], spec: Any, columns: tuple[str, ...],
                    sink_name: str, run: str | None) -> tuple[int, str | None, int]:
    """Writes the items of one Spark task: ``(partition, gid prepared or None, rows)``.
    Without ``run`` every batch is committed; with it the task's one transaction is prepared
    under a gid naming the run, the sink, the partition and this attempt."""
    rows = RowMaker(columns, spec.value_fn, spec.where)
    conn = connect(spec.dsn, spec.where)
    n = 0
    batch: list[tuple] = []

    def send() -> None:
        try:
            write_batch(conn, spec.table, columns, spec.key_columns, batch)
        except Exception as e:
            raise PostgresSinkError(
                f"{spec.where}: writing {len(batch)} row(s) into table {spec.table!r} failed: "
                f"{type(e).__name__}: {e}".rstrip() + f"; the first row was {batch[0]!r} "
                f"(columns {list(columns)}); make value_fn give values that fit the table's "
                "types and constraints") from e
        if run is None:
            conn.commit()
        batch.clear()

    try:
        for chunk in chunks:
            for row in rows.rows(chunk):
                batch.append(row)
                n += 1
                if len(batch) >= spec.batch_size:
                    send()
        if batch:
            send()
        gid = None
        if run is not None:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            attempt = ctx.taskAttemptId() if ctx is not None else 0
            gid = make_gid(run, sink_name, index, attempt)
            prepare(conn, gid)
        else:
            conn.commit()
        return index, gid, n
    finally:
        conn.close()  # an open transaction (a failed attempt's) is rolled back with it


def run_prepared(conn: Any, sink_name: str) -> dict[str, list[PreparedGid]]:
    """The prepared transactions of the backfill runs of the sink stage ``sink_name``, by
    run."""
    key = sink_key(sink_name)
    out: dict[str, list[PreparedGid]] = {}
    for p in list_prepared(conn):
        if p.sink == key and p.job_id.startswith(BACKFILL_JOB_PREFIX):
            out.setdefault(p.job_id, []).append(p)
    return out


def settle_run(conn: Any, run: str, sink_name: str, winners: set[str] | None) -> None:
    """Ends the run's prepared transactions (``conn`` in autocommit): with ``winners`` (the
    Spark job succeeded) every other one is rolled back, the decision prepared, the winners
    committed and the decision removed; without (it failed), all rolled back."""
    mine = run_prepared(conn, sink_name).get(run, [])
    for p in mine:
        if winners is None or p.gid not in winners:
            rollback_prepared(conn, p.gid)
    if not winners:
        return
    decision = make_gid(run, sink_name, DECISION_INDEX, len(winners))
    conn.autocommit = False
    prepare(conn, decision)  # an empty transaction: the run's decision to commit
    for gid in sorted(winners):
        commit_prepared(conn, gid)
    rollback_prepared(conn, decision)


def settle_leftovers(conn: Any, sink_name: str, where: str) -> None:
    """Settles what earlier runs of this sink stage left prepared (their driver died): a run
    that had decided is committed, any other rolled back."""
    for run, prepared in run_prepared(conn, sink_name).items():
        decided = any(p.writer_index == DECISION_INDEX for p in prepared)
        for p in prepared:
            if p.writer_index == DECISION_INDEX:
                continue
            if decided:
                commit_prepared(conn, p.gid)
            else:
                rollback_prepared(conn, p.gid)
        for p in prepared:
            if p.writer_index == DECISION_INDEX:
                rollback_prepared(conn, p.gid)
        log.warning("%s: %s the prepared transactions of the earlier backfill run %s, which "
                    "did not end", where, "committed" if decided else "rolled back", run)
