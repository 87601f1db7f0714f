"""The PostgreSQL sink's processors (see docs/postgres.md, "Writing to PostgreSQL").

:class:`PostgresSinkProcessor` commits every batch as it is written: with ``key_columns`` an
upsert, idempotent, so the at-least-once replay after a restart gives exact table contents;
without, plain inserts (at-least-once: a replay may write rows twice).

:class:`PostgresExactlyOnceSinkProcessor` writes the rows each processor receives between two
snapshots in one transaction, ``batch_size`` rows at a time (COPY, or the upsert), so the rows
are on the server, not held until the snapshot. At phase 1 of snapshot N it runs ``PREPARE
TRANSACTION`` under the gid ``jetwake:<job>:<sink>:<index>:N``
(:mod:`.prepared_transactions`); at phase 2 ``COMMIT PREPARED`` (``ROLLBACK PREPARED`` when N
failed: its rows go into the next transaction). After a restore from snapshot R, before it
writes anything, each processor lists the job's prepared transactions of this sink: the one of
snapshot R is committed (R committed, its phase 2 may not have run), every other one rolled
back (its snapshot never committed, or failed and its rows were written again after it). A
processor settles the gids of the old indices ``j`` with ``j % parallelism == its index``, so a
restore with another parallelism settles every old processor's once.

Both keep the rows of their open transaction (since the last phase 1) in memory: a connection
lost in the middle of it (a server restart) loses the transaction, so the processor reconnects
(tenacity, bounded, exponential back-off) and writes them again. Prepared transactions survive
both. Both are non-cooperative: every call to the server blocks only their own thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from jetwake.engine.core.processor import Inbox, Processor, ProcessorContext
from jetwake.connectors.postgres.connection import connect, is_connection_lost, retrying
from jetwake.connectors.postgres.prepared_transactions import (
    check_max_prepared_transactions, commit_prepared, list_prepared, make_gid, prepare,
    rollback_prepared,
)
from jetwake.connectors.postgres.rows import PostgresSinkError, RowMaker
from jetwake.connectors.postgres.statements import (
    CopyStream, array_types, check_columns, check_unique_key, table_columns, write_batch,
)

__all__ = ["PostgresSinkSpec", "PostgresSinkProcessor", "PostgresExactlyOnceSinkProcessor",
           "open_checked", "METRICS"]

log = logging.getLogger("jetwake.postgres")

CLOSE_VERDICT_WAIT_S = 5.0
"""How long a processor that closes with a prepared transaction waits for its snapshot's
verdict (see PostgresExactlyOnceSinkProcessor.close)."""

METRICS = ("rows_written", "batches_written", "transactions_prepared",
           "transactions_committed", "transactions_rolled_back", "reconnects")


@dataclass(frozen=True)
class PostgresSinkSpec:
    """What ``Sinks.postgres(...)`` was given, checked."""

    table: str
    dsn: str
    columns: tuple[str, ...] | None
    key_columns: tuple[str, ...] | None
    value_fn: Callable[[Any], Any] | None
    exactly_once: bool | None
    batch_size: int
    where: str = field(default="")


def open_checked(spec: PostgresSinkSpec, transactional: bool,
                 parallelism: int = 1) -> tuple[Any, tuple[str, ...]]:
    """Connects and checks the table, its columns, the key and (``transactional``) the
    server's ``max_prepared_transactions``; returns the connection and the columns written."""
    conn = connect(spec.dsn, spec.where)
    try:
        if spec.columns is None:
            columns = tuple(table_columns(conn, spec.table, spec.where))
        else:
            check_columns(conn, spec.table, spec.columns, spec.where)
            columns = spec.columns
        if spec.key_columns:
            missing = [c for c in spec.key_columns if c not in columns]
            if missing:
                raise PostgresSinkError(
                    f"{spec.where}: key_columns {missing} are not among the columns written "
                    f"{list(columns)}; add them to columns=[...]")
            check_unique_key(conn, spec.table, spec.key_columns, spec.where)
        if transactional:
            check_max_prepared_transactions(conn, spec.where, parallelism)
        conn.rollback()
        return conn, columns
    except BaseException:
        conn.close()
        raise


def _refused(error: BaseException) -> bool:
    """Whether ``error`` is the server refusing a statement or a row (not a lost connection,
    not an error of the sink's own)."""
    import psycopg

    return isinstance(error, psycopg.Error) and not is_connection_lost(error)


class _PostgresSinkBase(Processor):
    """A connection, a row maker, the batch being gathered and the rows of the open
    transaction (written again on a new connection if the old one is lost)."""

    transactional = False

    def __init__(self, spec: PostgresSinkSpec) -> None:
        self.spec = spec
        self.conn: Any = None
        self._batch: list[tuple] = []     # rows not sent yet
        self._open: list[tuple] = []      # rows sent in the open transaction

    def is_cooperative(self) -> bool:
        return False

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        for k in METRICS:
            context.metrics.setdefault(k, 0)
        self.where = f"{self.spec.where} ({context.vertex_name}#{context.global_processor_index})"
        self.conn, self.columns = open_checked(self.spec, self.transactional,
                                               context.total_parallelism)
        self.rows = RowMaker(self.columns, self.spec.value_fn, self.spec.where)
        self.types = None   # upserts over arrays when every column's type allows it
        if self.spec.key_columns:
            self.types = array_types(self.conn, self.spec.table, self.columns)
            self.conn.rollback()

    # --- the connection -----------------------------------------------------------------------

    def _reconnect(self, error: BaseException) -> None:
        log.warning("%s: connection lost (%s); reconnecting", self.where, error)
        self.context.metrics["reconnects"] += 1
        old, self.conn = self.conn, None
        try:
            old.close()
        except Exception:  # noqa: BLE001 - it is gone already
            pass

    def _ensure_conn(self) -> Any:
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.spec.dsn, self.where)
        return self.conn

    def _call(self, step: Callable[[Any], Any], what: str) -> Any:
        """Runs ``step(conn)`` on the data connection, reconnecting and running it again while
        the connection is lost; ``step`` must be repeatable on a new connection."""
        def attempt() -> Any:
            conn = self._ensure_conn()
            try:
                return step(conn)
            except Exception as e:
                if is_connection_lost(e):
                    self._reconnect(e)
                raise
        return retrying(attempt, what, self.where)

    _ctl_conn: Any = None

    def _control(self, step: Callable[[Any], Any], what: str) -> Any:
        """Runs ``step(conn)`` on the control connection (autocommit: COMMIT PREPARED and
        ROLLBACK PREPARED cannot run in the data connection's open transaction), reconnecting
        while it is lost."""
        def attempt() -> Any:
            if self._ctl_conn is None or self._ctl_conn.closed:
                self._ctl_conn = connect(self.spec.dsn, self.where)
                self._ctl_conn.autocommit = True
            try:
                return step(self._ctl_conn)
            except Exception as e:
                if is_connection_lost(e):
                    self.context.metrics["reconnects"] += 1
                    self._ctl_conn.close()
                    self._ctl_conn = None
                raise
        return retrying(attempt, what, self.where)

    _open_conn: Any = None      # the connection whose transaction holds self._open
    _stream: CopyStream | None = None   # the open transaction's COPY (insert mode)

    def _write_open(self, conn: Any, rows: Sequence[tuple]) -> None:
        """Writes ``rows`` in the open transaction; on a new connection (the old one was lost
        with its transaction) the open transaction's earlier rows first."""
        if conn is not self._open_conn:
            self._stream = None
            self._open_conn = conn
            self._put(conn, self._open)
        self._put(conn, rows)

    def _put(self, conn: Any, rows: Sequence[tuple]) -> None:
        if not rows:
            return
        if self.spec.key_columns:
            write_batch(conn, self.spec.table, self.columns, self.spec.key_columns, rows,
                        self.types)
            return
        if self._stream is None:
            self._stream = CopyStream(conn, self.spec.table, self.columns)
        self._stream.write(rows)

    def _end_stream(self) -> None:
        """Ends the open transaction's COPY, before another statement on its connection."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.finish()

    def _forget_open(self) -> None:
        """The open transaction ended (committed, prepared or lost)."""
        self._open, self._open_conn, self._stream = [], None, None

    def _rows_refused(self, error: Exception, rows: Sequence[tuple]) -> PostgresSinkError:
        """The server refused a row: an error naming the table, the row (from the COPY's line
        number when there is one) and the fix."""
        import re

        context = getattr(getattr(error, "diag", None), "context", None) or ""
        found = re.search(r"line (\d+)", context)
        row = rows[int(found.group(1)) - 1] if found and int(found.group(1)) <= len(rows) \
            else rows[0] if rows else None
        which = "the row" if found else "a row of the batch starting with"
        return PostgresSinkError(
            f"{self.where}: table {self.spec.table!r} refused {which} {row!r} (columns "
            f"{list(self.columns)}): {type(error).__name__}: {str(error).strip()}; make "
            "value_fn give values that fit the table's types and constraints")

    def _send_batch(self) -> None:
        """Sends the gathered rows in the open transaction, ``batch_size`` at a time."""
        size = self.spec.batch_size
        while self._batch:
            rows, self._batch = self._batch[:size], self._batch[size:]
            self._send(rows)

    def _send(self, rows: list[tuple]) -> None:
        try:
            self._call(lambda conn: self._write_open(conn, rows), "writing a batch")
        except Exception as e:
            if not _refused(e):
                raise   # ours, or a connection that did not come back (RestartableError)
            error = self._rows_refused(e, self._open + rows)
            self._fail_open()
            raise error from e
        self._open.extend(rows)
        self.context.metrics["batches_written"] += 1

    def _fail_open(self) -> None:
        """Rolls the open transaction back (a statement of it failed, or its rows go into
        another one)."""
        stream = self._stream
        self._forget_open()
        if self.conn is not None and not self.conn.closed:
            try:
                if stream is not None:
                    stream.abort()
                self.conn.rollback()
            except Exception:  # noqa: BLE001 - the job fails with the first error
                log.debug("rollback after a failure failed", exc_info=True)

    def _end_open(self, conn: Any, finish: Callable[[Any], None]) -> None:
        """Ends the open transaction on ``conn`` with ``finish`` (commit, prepare): the open
        rows again first on a new connection, the COPY ended, rows the server refuses named."""
        self._write_open(conn, [])
        try:
            self._end_stream()
        except Exception as e:
            if not _refused(e):
                raise
            error = self._rows_refused(e, self._open)
            self._fail_open()
            raise error from e
        finish(conn)

    def _receive(self, inbox: Inbox) -> None:
        self._batch.extend(self.rows.rows(inbox.drain()))
        if len(self._batch) >= self.spec.batch_size:
            self._send_batch()

    def _commit_open(self) -> None:
        """Commits the open transaction (sending what is gathered first)."""
        self._send_batch()
        if not self._open:
            return

        self._call(lambda conn: self._end_open(conn, lambda c: c.commit()), "committing")
        self.context.metrics["rows_written"] += len(self._open)
        self.context.metrics["transactions_committed"] += 1
        self._forget_open()

    def close(self) -> None:
        for name in ("conn", "_ctl_conn"):
            conn = getattr(self, name)
            setattr(self, name, None)
            if conn is not None:
                try:
                    conn.close()   # an open transaction is rolled back with it
                except Exception:  # noqa: BLE001 - closing after a failure
                    log.debug("closing the connection failed", exc_info=True)


class PostgresSinkProcessor(_PostgresSinkBase):
    """Writes and commits every batch as it comes (upsert: exact contents after replays;
    insert: at-least-once). Everything received before a snapshot's barrier is committed before
    the processor's part of the snapshot is done."""

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self._receive(inbox)
        if self._open:
            self._commit_open()

    def try_process(self) -> bool:
        """Nothing waiting in the inbox: commit what is gathered (a small batch, not a late
        one)."""
        self._commit_open()
        return True

    def save_to_snapshot(self) -> bool:
        self._commit_open()
        return True

    def complete(self) -> bool:
        self._commit_open()
        return True


class PostgresExactlyOnceSinkProcessor(_PostgresSinkBase):
    """One transaction per processor and snapshot, prepared at phase 1 and committed at phase 2
    (see the module's docstring)."""

    transactional_sink = True
    transactional = True

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        if context.processing_guarantee != "exactly_once":
            raise PostgresSinkError(
                f"{self.spec.where}: exactly_once=True needs a job with exactly-once "
                f"snapshots, but job '{context.job_name}' runs with processing_guarantee="
                f"'{context.processing_guarantee}'; submit it with JobConfig(processing_"
                "guarantee='exactly_once'), or pass exactly_once=None (follow the job)")
        self._prepared: dict[int, tuple[str, list[tuple]]] = {}  # snapshot id -> gid, rows
        self._settled = False
        snap = context.snapshot
        self.restored_id = snap.restored_snapshot_id if snap is not None else -1

    def gid(self, snapshot_id: int, index: int | None = None) -> str:
        ctx = self.context
        return make_gid(ctx.job_id, ctx.vertex_name,
                        ctx.global_processor_index if index is None else index, snapshot_id)

    # --- after a restore ------------------------------------------------------------------

    def _settle(self) -> None:
        """Commits the prepared transaction of the restored snapshot and rolls back every other
        one of this sink's (old) processors this processor settles."""
        self._settled = True
        ctx = self.context
        index, total = ctx.global_processor_index, ctx.total_parallelism

        def settle(conn: Any) -> None:
            for p in list_prepared(conn, ctx.job_id, ctx.vertex_name):
                if p.writer_index % total != index:
                    continue
                if p.snapshot_id == self.restored_id:
                    if commit_prepared(conn, p.gid):
                        log.info("%s: committed %s, prepared for the restored snapshot %d",
                                 self.where, p.gid, self.restored_id)
                        ctx.metrics["transactions_committed"] += 1
                elif rollback_prepared(conn, p.gid):
                    log.info("%s: rolled back %s (restored snapshot: %d)", self.where, p.gid,
                             self.restored_id)
                    ctx.metrics["transactions_rolled_back"] += 1
        self._control(settle, "settling the prepared transactions")

    def _start(self) -> None:
        if not self._settled:
            self._settle()

    # --- the processor contract -------------------------------------------------------------

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self._start()
        self._receive(inbox)

    def try_process(self) -> bool:
        """Nothing waiting in the inbox: send what is gathered into the open transaction."""
        self._start()
        self._send_batch()
        return True

    def snapshot_commit_prepare(self) -> bool:
        """Phase 1: the rows since the last snapshot, sent and prepared under this snapshot's
        gid (nothing to prepare when none came)."""
        self._start()
        self._send_batch()
        if not self._open:
            return True
        sid = self.context.snapshot_id
        gid = self.gid(sid)

        def do_prepare(conn: Any) -> None:
            if conn is not self._open_conn and self._control(lambda c: any(
                    p.gid == gid for p in list_prepared(c, self.context.job_id,
                                                        self.context.vertex_name)), "listing"):
                return  # prepared before the connection was lost
            self._end_open(conn, lambda c: prepare(c, gid))
        self._call(do_prepare, f"preparing {gid}")
        self._prepared[sid] = (gid, self._open)
        self._forget_open()
        self.context.metrics["transactions_prepared"] += 1
        return True

    def snapshot_commit_finish(self, success: bool) -> bool:
        """Phase 2: COMMIT PREPARED (ROLLBACK PREPARED when the snapshot failed: its rows go
        into the next transaction, before the rows that came after it)."""
        self._start()
        sid = self.context.snapshot_id
        due = sorted(s for s in self._prepared if s <= sid)
        for s in due:
            gid, rows = self._prepared.pop(s)
            if success:
                self._control(lambda conn: commit_prepared(conn, gid), f"committing {gid}")
                self.context.metrics["transactions_committed"] += 1
                self.context.metrics["rows_written"] += len(rows)
            else:
                self._control(lambda conn: rollback_prepared(conn, gid), f"rolling back {gid}")
                self.context.metrics["transactions_rolled_back"] += 1
                self._batch[:0] = rows + self._open
                self._fail_open()
        return True

    def complete(self) -> bool:
        """The input ended: wait for the phase 2 of what is prepared, then commit what came
        after the last snapshot (no later snapshot could)."""
        self._start()
        if self._prepared:
            return False
        self._commit_open()
        return True

    def close(self) -> None:
        """The open transaction ends with the connection (rolled back). A transaction prepared
        for snapshot N whose phase 2 has not run here (the job is cancelled or restarted in
        the middle of a snapshot) is settled by the snapshot's verdict, which the coordinator
        announces at once, even to a stopping execution: waited for up to
        ``CLOSE_VERDICT_WAIT_S``, N committed -> COMMIT PREPARED (what the restore from N
        would do), N failed -> ROLLBACK PREPARED (the restore from an earlier snapshot would).
        Without a verdict in time (the coordinator died) it stays for the restore to settle:
        a cancelled job leaves nothing prepared unless its coordinator dies with it."""
        import time

        snap = self.context.snapshot if hasattr(self, "context") else None
        prepared = getattr(self, "_prepared", None)
        if prepared and snap is not None:
            last = max(prepared)
            deadline = time.monotonic() + CLOSE_VERDICT_WAIT_S
            while snap.phase2_id < last and time.monotonic() < deadline:
                time.sleep(0.01)
            for sid in sorted(prepared):
                if sid != snap.phase2_id:
                    continue
                gid = prepared.pop(sid)[0]
                commit = snap.phase2_success
                try:
                    if self._ctl_conn is None or self._ctl_conn.closed:
                        self._ctl_conn = connect(self.spec.dsn, self.where, timeout_s=5)
                        self._ctl_conn.autocommit = True
                    if commit:
                        commit_prepared(self._ctl_conn, gid)
                    else:
                        rollback_prepared(self._ctl_conn, gid)
                    self.context.metrics["transactions_committed" if commit
                                         else "transactions_rolled_back"] += 1
                except Exception:  # noqa: BLE001 - the restore settles it
                    log.warning("%s: settling %s at close failed; the restore of the job "
                                "settles it", self.where, gid, exc_info=True)
        super().close()
