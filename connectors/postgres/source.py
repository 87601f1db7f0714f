"""``Sources.postgres``: the rows of a query, read by one processor or split into key ranges
over the processors of every member (see docs/postgres.md, "Reading from PostgreSQL").

The split (:func:`plan_reads`, :func:`split_key_range`, :func:`range_query`) is one set of
functions for a member's processors and the Spark backfill's tasks. Its steps:

- the query's result is described (``SELECT * FROM (query) q LIMIT 0``): its columns must
  have distinct names (a row is a dict), and the ``partition_column`` must be one of them and
  of a numeric, date or timestamp type;
- ``min``, ``max`` and whether there are NULLs are read in one REPEATABLE READ transaction
  that exports its snapshot (``pg_export_snapshot()``); the readers import it (``SET
  TRANSACTION SNAPSHOT``), so every range is read from the same state of the database. On a
  cluster the first member's connection exports it and shows its name to the other members
  as its ``application_name`` (:func:`publish_snapshot`, under a tag of the execution); each
  other member finds it in ``pg_stat_activity`` (:func:`find_snapshot`) while it builds its
  share, imports it into a connection of its own, plans the same ranges in it and exports it
  again for its processors. The first member's connection stays open until its processors
  start, which is after every member has built its share;
- ``[min, max]`` is cut into ``partitions`` ranges of equal width; the first range is open
  below and the last open above (a boundary is only a place to cut), and the rows whose key
  is NULL are a range of their own.

A processor reads its ranges (range ``r`` belongs to processor ``r % total parallelism``)
through a server-side cursor, ``CHUNK_ROWS`` rows per fetch. In a job that takes snapshots it
reads each range in key order and saves, per range, the last key of which every row has left
(a restored job reads from the key after it) and, for the NULL range and a query without
``partition_column``, the count of rows emitted (a restored job skips that many rows: exact
when the query's order is deterministic).
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from jetwake.engine.core.chunk_emitter import CHUNK_SIZE
from jetwake.engine.core.errors import RestartableError
from jetwake.engine.core.meta_supplier import (
    MetaSupplierContext, ProcessorMetaSupplier, ProcessorSupplier, SupplierContext,
)
from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext
from jetwake.engine.backfill.connector_forms import SparkReader
from jetwake.engine.backfill.stage_output import StageOut

__all__ = [
    "PostgresSourceError", "PostgresSourceSpec", "KeyRange", "ReadPlan", "CHUNK_ROWS",
    "source_spec", "split_key_range", "plan_reads", "range_query", "read_range",
    "snapshot_tag", "publish_snapshot", "find_snapshot",
    "PostgresSourceMetaSupplier", "PostgresSourceProcessor", "PostgresSparkReader",
]

log = logging.getLogger("jetwake.postgres")

CHUNK_ROWS = CHUNK_SIZE
"""Rows fetched from the server-side cursor at a time (and emitted as one chunk)."""

CONNECT_TIMEOUT_S = 10.0
"""How long a server that does not answer is retried when a read starts."""

SHARE_TIMEOUT_S = 100.0
"""How long a member waits for the first member's snapshot (within the 120 s a member has to
build its share of an execution)."""

_KEY = "postgres-source"

# type OIDs of the partition column's accepted types -> the kind of arithmetic that splits it
_KINDS = {20: "int", 21: "int", 23: "int", 26: "int", 1700: "numeric", 700: "float",
          701: "float", 1082: "date", 1114: "timestamp", 1184: "timestamp"}


class PostgresSourceError(ValueError):
    """A PostgreSQL source cannot read: bad settings, a query that fails, a partition column
    that cannot be split."""


@dataclass(frozen=True)
class PostgresSourceSpec:
    """What ``Sources.postgres(...)`` was given, checked."""

    query: str
    dsn: str
    partition_column: str | None
    partitions: int | None
    where: str


@dataclass(frozen=True)
class KeyRange:
    """One read of the query: rows with ``lo <= key < hi`` (None: unbounded on that side),
    the rows whose key is NULL (``nulls``), or every row (``whole``, no partition column)."""

    index: int
    lo: Any = None
    hi: Any = None
    nulls: bool = False
    whole: bool = False

    def to_entry(self) -> list:
        return [self.index, self.lo, self.hi, self.nulls, self.whole]

    @staticmethod
    def from_entry(e: Sequence[Any]) -> "KeyRange":
        return KeyRange(e[0], e[1], e[2], e[3], e[4])


@dataclass
class ReadPlan:
    """The ranges of one read and the exported snapshot they are read in (None: each reader
    takes its own, when there is one reader)."""

    ranges: list[KeyRange]
    snapshot: str | None


def _safe_dsn(dsn: str) -> str:
    """The dsn without its password, for messages."""
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        parts = conninfo_to_dict(dsn)
        if "password" in parts:
            parts["password"] = "***"
        return make_conninfo("", **parts)
    except Exception:  # noqa: BLE001 - a message only
        return "<dsn>"


def source_spec(query: Any, dsn: Any, partition_column: Any, partitions: Any) -> \
        PostgresSourceSpec:
    """Checks what ``Sources.postgres`` was given, when the pipeline is built."""
    from jetwake.connectors.postgres.connection import check_dsn
    from jetwake.connectors.postgres.rows import PostgresSinkError

    if not isinstance(query, str) or not query.strip():
        raise PostgresSourceError(f"Sources.postgres() needs a query (a SELECT, or a table "
                                  f"name wrapped as 'SELECT * FROM t'), got {query!r}")
    text = query.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()  # the query becomes a subquery: no statement terminator
    short = text if len(text) <= 60 else text[:57] + "..."
    where = f"Sources.postgres({short!r})"
    try:
        check_dsn(dsn, where)
    except PostgresSinkError as e:
        raise PostgresSourceError(str(e)) from None
    if partition_column is not None and (not isinstance(partition_column, str)
                                         or not partition_column):
        raise PostgresSourceError(f"{where}: partition_column must be the name of a column "
                                  f"of the query's result, got {partition_column!r}")
    if partitions is not None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise PostgresSourceError(f"{where}: partitions must be an int >= 1 (or None: "
                                      f"one range per processor), got {partitions!r}")
        if partition_column is None:
            raise PostgresSourceError(f"{where}: partitions={partitions} needs a "
                                      "partition_column to split the rows by")
    return PostgresSourceSpec(text, dsn, partition_column, partitions, where)


# --- the split ----------------------------------------------------------------------------

def split_key_range(lo: Any, hi: Any, n: int, kind: str) -> list[Any]:
    """The inner boundaries that cut ``[lo, hi]`` into up to ``n`` ranges of equal width (of
    ``kind``: "int", "numeric", "float", "date", "timestamp"), ascending and distinct; fewer
    when the range holds fewer distinct values (an int range of 3 values gives 3 ranges)."""
    if n <= 1 or lo == hi:
        return []
    out: list[Any] = []
    for i in range(1, n):
        if kind == "int":
            b: Any = lo + (hi - lo + 1) * i // n
        elif kind == "numeric":
            b = lo + (hi - lo) * decimal.Decimal(i) / decimal.Decimal(n)
        elif kind == "float":
            b = lo + (hi - lo) * i / n
        elif kind == "date":
            b = lo + dt.timedelta(days=(hi - lo).days * i // n)
        else:  # timestamps: whole microseconds
            span = hi - lo
            micros = (span.days * 86_400_000_000 + span.seconds * 1_000_000
                      + span.microseconds) * i // n
            b = lo + dt.timedelta(microseconds=micros)
        if lo < b <= hi and (not out or b > out[-1]):
            out.append(b)
    return out


def _ranges(cuts: list[Any], nulls: bool) -> list[KeyRange]:
    bounds = [None, *cuts, None]
    ranges = [KeyRange(i, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    if nulls:
        ranges.append(KeyRange(len(ranges), nulls=True))
    return ranges


def _query_error(spec: PostgresSourceSpec, e: BaseException) -> PostgresSourceError:
    return PostgresSourceError(
        f"{spec.where}: the query failed on the server: {type(e).__name__}: "
        f"{str(e).strip()}; the query was: {spec.query}")


def _connect(spec: PostgresSourceSpec) -> Any:
    from jetwake.connectors.postgres.connection import connect
    from jetwake.connectors.postgres.rows import PostgresSinkError

    try:
        return connect(spec.dsn, spec.where, CONNECT_TIMEOUT_S)
    except PostgresSinkError as e:
        raise PostgresSourceError(f"{e} (dsn {_safe_dsn(spec.dsn)})") from None
    except RestartableError as e:
        raise PostgresSourceError(f"{spec.where}: PostgreSQL at {_safe_dsn(spec.dsn)} did "
                                  f"not answer for {CONNECT_TIMEOUT_S:.0f} s: {e.__cause__}; "
                                  "start the server or fix the dsn") from None


def _check_names(spec: PostgresSourceSpec, cur: Any) -> list[str]:
    """The names of the columns of ``cur``'s result, which must be distinct: a row is a dict
    by column name, and a name given twice would lose a value."""
    names = [c.name for c in cur.description or ()]
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise PostgresSourceError(
            f"{spec.where}: the query's result names column(s) {twice} more than once, and a "
            "row is a dict by column name; give them distinct names in the query (... AS "
            "other_name)")
    return names


def _partition_kind(conn: Any, spec: PostgresSourceSpec) -> str | None:
    """Describes the query's result: distinct column names, and the kind of the partition
    column (None without one)."""
    import psycopg

    try:
        cur = conn.execute(f"SELECT * FROM (\n{spec.query}\n) q LIMIT 0")
    except psycopg.Error as e:
        raise _query_error(spec, e) from None
    cols = [(c.name, c.type_code) for c in cur.description or ()]
    names = _check_names(spec, cur)
    col = spec.partition_column
    if col is None:
        return None
    types = dict(cols)
    if col not in types:
        raise PostgresSourceError(
            f"{spec.where}: partition_column {col!r} is not a column of the query's result "
            f"(its columns: {names}); name one of them (case-sensitive), or select it")
    kind = _KINDS.get(types[col])
    if kind is None:
        type_name = conn.execute("SELECT format_type(%s, NULL)", (types[col],)).fetchone()[0]
        raise PostgresSourceError(
            f"{spec.where}: partition_column {col!r} is of type {type_name}; a key range is "
            "split over a numeric, date or timestamp column: name such a column, or select "
            "one (for text, e.g. abs(hashtext(name)) % 1000 AS part) and partition by it")
    return kind


def plan_reads(conn: Any, spec: PostgresSourceSpec, partitions: int, *,
               snapshot: str | None = None,
               publish: Callable[[str], None] | None = None) -> ReadPlan:
    """The ranges to read, found on ``conn`` (fresh, not in a transaction), which it leaves
    in the REPEATABLE READ transaction whose snapshot they are read in (exported, when there
    is a partition column): the caller keeps ``conn`` open until every reader has imported
    it. ``snapshot``: the transaction imports that snapshot first (another member's), so the
    plan is the same as there; ``publish`` is given the exported snapshot's name before the
    key range is read."""
    import psycopg
    from psycopg import sql

    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    if snapshot is not None:
        try:
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        except psycopg.Error as e:
            raise RestartableError(
                f"{spec.where}: cannot read in the snapshot {snapshot} that the job's first "
                f"member exported: {type(e).__name__}: {e}; its member or its connection went "
                "away: the job restarts") from None
    kind = _partition_kind(conn, spec)
    if kind is None:
        return ReadPlan([KeyRange(0, whole=True)], None)
    assert spec.partition_column is not None  # a kind is found for a partition column only
    col = sql.Identifier(spec.partition_column)
    try:
        exported = conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
        if publish is not None:
            publish(exported)
        lo, hi, nulls = conn.execute(sql.SQL(
            "SELECT min({c}), max({c}), bool_or({c} IS NULL) FROM (\n{q}\n) q").format(
                c=col, q=sql.SQL(spec.query))).fetchone()  # type: ignore[arg-type]
    except psycopg.Error as e:
        raise _query_error(spec, e) from None
    if lo is None:  # no row with a key: one range (it holds the NULLs, if any)
        return ReadPlan([KeyRange(0, nulls=bool(nulls))], exported)
    cuts = split_key_range(lo, hi, partitions, kind)
    return ReadPlan(_ranges(cuts, bool(nulls)), exported)


def snapshot_tag(execution_key: str, vertex_name: str) -> str:
    """The name under which the first member of an execution shows the snapshot it exported
    (the ``application_name`` of its connection, ``<tag>:<snapshot>``): new for every
    execution, so no member finds the snapshot of an earlier one."""
    digest = hashlib.sha1(f"{execution_key}/{vertex_name}".encode()).hexdigest()[:16]
    return f"jetwake-pg:{digest}"


def publish_snapshot(conn: Any, tag: str, snapshot: str) -> None:
    """Shows ``snapshot`` to the other members: the connection's application_name, which
    ``pg_stat_activity`` shows to every session of the same role."""
    conn.execute("SELECT set_config('application_name', %s, false)", (f"{tag}:{snapshot}",))


def find_snapshot(conn: Any, tag: str, where: str,
                  timeout_s: float | None = None) -> str:
    """The snapshot the first member published under ``tag``, waited for (the members build
    their share of an execution side by side); ``conn`` in autocommit."""
    timeout_s = SHARE_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    while True:
        row = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s "
            "AND datname = current_database() ORDER BY backend_start DESC LIMIT 1",
            (tag + ":%",)).fetchone()
        if row is not None:
            return str(row[0])[len(tag) + 1:]
        if time.monotonic() > deadline:
            raise PostgresSourceError(
                f"{where}: the job's first member did not show its snapshot of the database "
                f"in {timeout_s:.0f} s (a connection named {tag}:... in pg_stat_activity); "
                "it failed to start, or the role cannot see the other sessions of its role")
        time.sleep(0.05)


def range_query(spec: PostgresSourceSpec, r: KeyRange, ordered: bool,
                after: Any = None, skip: int = 0) -> tuple[Any, list[Any]]:
    """The statement and parameters that read range ``r``: in key order when ``ordered``
    (resumed after the key ``after``), skipping ``skip`` rows (the NULL range, a whole
    query)."""
    from psycopg import sql

    # the statement goes with parameters: a % of the query's own text is doubled
    q = sql.SQL(spec.query.replace("%", "%%"))  # type: ignore[arg-type]
    if r.whole:
        stmt = sql.SQL("SELECT * FROM (\n{}\n) q").format(q)
        params: list[Any] = []
    else:
        col = sql.Identifier(spec.partition_column)  # type: ignore[arg-type]
        if r.nulls:
            conds = [sql.SQL("{} IS NULL").format(col)]
            params = []
        else:
            conds, params = [], []
            lo = r.lo if after is None else after
            if lo is not None:
                conds.append(sql.SQL("{} > %s" if after is not None else "{} >= %s").format(col))
                params.append(lo)
            if r.hi is not None:
                conds.append(sql.SQL("{} < %s").format(col))
                params.append(r.hi)
            if not conds:
                conds = [sql.SQL("{} IS NOT NULL").format(col)]
        stmt = sql.SQL("SELECT * FROM (\n{}\n) q WHERE {}").format(
            q, sql.SQL(" AND ").join(conds))
        if ordered and not r.nulls:
            stmt = sql.SQL("{} ORDER BY {}").format(stmt, col)
    if skip:
        stmt = sql.SQL("{} OFFSET %s").format(stmt)
        params.append(skip)
    return stmt, params


def _begin_read(conn: Any, snapshot: str | None) -> None:
    """Starts the reader's REPEATABLE READ transaction, in ``snapshot`` when given."""
    import psycopg
    from psycopg import sql

    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    if snapshot is not None:
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))


def read_range(spec: PostgresSourceSpec, r: KeyRange, snapshot: str | None,
               count: Callable[[str, int], None] | None = None) -> Iterator[list]:
    """The rows of one range as chunks of dicts, read in ``snapshot`` through a server-side
    cursor on a connection of its own (a Spark task's read)."""
    import psycopg
    from psycopg.rows import dict_row

    conn = _connect(spec)
    n = 0
    try:
        _begin_read(conn, snapshot)
        stmt, params = range_query(spec, r, ordered=False)
        with conn.cursor(name=f"jetwake_range_{r.index}", row_factory=dict_row) as cur:
            try:
                cur.execute(stmt, params)
                _check_names(spec, cur)
                while True:
                    rows = cur.fetchmany(CHUNK_ROWS)
                    if not rows:
                        break
                    n += len(rows)
                    yield rows
            except psycopg.Error as e:
                raise _query_error(spec, e) from None
    finally:
        if count is not None:
            count("records_in", n)
        conn.close()


# --- on a member ----------------------------------------------------------------------------

class _MemberRead:
    """One member's share of one execution: the plan, found in the snapshot a connection of
    this member exports and holds until each of the member's processors has imported it."""

    def __init__(self, spec: PostgresSourceSpec, context: SupplierContext, count: int) -> None:
        self.spec = spec
        self.total = context.total_parallelism
        self.plan: ReadPlan | None = None
        self._holder: Any = None
        self._waiting = count  # processors yet to import the snapshot
        self._lock = threading.Lock()
        if spec.partition_column is None:
            if context.member_index == 0:  # global processor 0 reads the whole query
                self.plan = ReadPlan([KeyRange(0, whole=True)], None)
            return
        self._holder = holder = _connect(spec)
        weakref.finalize(self, holder.close)  # a failed start never reaches the readers
        n = spec.partitions or self.total
        try:
            if context.member_count == 1:
                self.plan = plan_reads(holder, spec, n)
            elif context.member_index == 0:
                # the first member exports the snapshot and shows it to the others: it holds
                # it until its own processors start, which is after every member has built
                # its share (and imported it)
                tag = snapshot_tag(context.execution_key, context.vertex_name)
                self.plan = plan_reads(holder, spec, n,
                                       publish=lambda s: publish_snapshot(holder, tag, s))
            else:
                tag = snapshot_tag(context.execution_key, context.vertex_name)
                holder.autocommit = True
                shared = find_snapshot(holder, tag, spec.where)
                holder.autocommit = False
                self.plan = plan_reads(holder, spec, n, snapshot=shared)
        except BaseException:
            self._holder.close()
            raise

    def imported(self) -> None:
        """One processor no longer needs the exported snapshot (it imported it, or reads
        nothing); the last one closes the connection that holds it."""
        with self._lock:
            self._waiting -= 1
            if self._waiting == 0 and self._holder is not None:
                self._holder.close()
                self._holder = None


class _MemberSupplier(ProcessorSupplier):
    def __init__(self, spec: PostgresSourceSpec) -> None:
        self.spec = spec
        self.context: SupplierContext | None = None

    def init(self, context: SupplierContext) -> None:
        self.context = context

    def get(self, count: int) -> list[Processor]:
        assert self.context is not None
        shared = _MemberRead(self.spec, self.context, count)
        return [PostgresSourceProcessor(self.spec, shared) for _ in range(count)]


class PostgresSourceMetaSupplier(ProcessorMetaSupplier):
    """A new supplier (a new plan) for every execution on every member; one processor per
    member without a partition column."""

    def __init__(self, spec: PostgresSourceSpec) -> None:
        self.spec = spec

    def preferred_local_parallelism(self) -> int:
        return 1 if self.spec.partition_column is None else -1

    def init(self, context: MetaSupplierContext) -> None:
        pass

    def get(self, member_indices: Sequence[int]) -> Callable[[int], ProcessorSupplier]:
        spec = self.spec
        return lambda member_index: _MemberSupplier(spec)


class PostgresSourceProcessor(Processor):
    """Reads its ranges of the plan (see the module docstring); non-cooperative: every fetch
    blocks only its own thread."""

    def __init__(self, spec: PostgresSourceSpec, shared: _MemberRead) -> None:
        self.spec = spec
        self.shared = shared
        self.restored: dict[int, list] = {}
        self.todo: list[list] | None = None  # [range entry, after key, rows skipped, done]
        self.conn: Any = None
        self.cursor: Any = None
        self.pending: list[dict] = []  # rows of the last key read, held until the next key
        self.ordered = False
        self._released = False

    def is_cooperative(self) -> bool:
        return False

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        context.metrics.setdefault("records_in", 0)
        context.metrics.setdefault("ranges_read", 0)
        self.ordered = context.processing_guarantee != "none"

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for key, value in inbox.drain():
            if type(key) is BroadcastKey and type(key.key) is tuple and key.key[0] == _KEY:
                self.restored[key.key[1]] = value

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self.shared.imported()

    def _mine(self) -> list[list]:
        """This processor's ranges with their progress: those of the restored plan when
        restored, else of the member's plan."""
        plan = self.shared.plan
        if self.restored:
            entries = [self.restored[i] for i in sorted(self.restored)]
        elif plan is not None:
            entries = [[r.to_entry(), None, 0, False] for r in plan.ranges]
        else:
            entries = []
        total, me = self.context.total_parallelism, self.context.global_processor_index
        return [list(e) for e in entries if e[0][0] % total == me]

    def _start(self) -> None:
        """Takes this processor's ranges and starts its transaction in the member's
        snapshot."""
        self.todo = self._mine()
        plan = self.shared.plan
        if any(not e[3] for e in self.todo):
            self.conn = _connect(self.spec)
            try:
                _begin_read(self.conn, plan.snapshot if plan is not None else None)
            except Exception as e:
                raise self._read_error(e) from None
        self._release()

    def _read_error(self, e: BaseException) -> BaseException:
        from jetwake.connectors.postgres.connection import is_connection_lost

        if is_connection_lost(e):
            return RestartableError(f"{self.spec.where}: the connection to PostgreSQL was "
                                    f"lost while reading: {e}; the job restarts from its "
                                    "last snapshot")
        return _query_error(self.spec, e)

    def _open_cursor(self, entry: list) -> None:
        from psycopg.rows import dict_row

        r = KeyRange.from_entry(entry[0])
        resumable_by_key = self.ordered and not r.whole and not r.nulls
        stmt, params = range_query(self.spec, r, self.ordered,
                                   entry[1] if resumable_by_key else None,
                                   0 if resumable_by_key else entry[2])
        self.cursor = self.conn.cursor(name=f"jetwake_{self.context.global_processor_index}"
                                            f"_{r.index}", row_factory=dict_row)
        self.cursor.execute(stmt, params)
        if r.whole:  # a partitioned plan checked the names already
            _check_names(self.spec, self.cursor)

    def complete(self) -> bool:
        import psycopg

        if self.todo is None:
            self._start()
        assert self.todo is not None
        current = next((e for e in self.todo if not e[3]), None)
        if current is None:
            self._close()
            return True
        if not self.outbox.has_room():
            return False
        try:
            if self.cursor is None:
                self._open_cursor(current)
            rows = self.cursor.fetchmany(CHUNK_ROWS)
        except psycopg.Error as e:
            raise self._read_error(e) from None
        self._emit(current, rows, len(rows) < CHUNK_ROWS)
        return False

    def _emit(self, entry: list, rows: list[dict], last: bool) -> None:
        """Emits fetched rows; in key order, the rows of the last key fetched wait until a
        greater key or the range's end, so the saved key is one whose rows have all left."""
        r = entry[0]
        by_key = self.ordered and not r[4] and not r[3]
        out = rows
        if by_key and not last:
            rows = self.pending + rows
            col = self.spec.partition_column
            top = rows[-1][col]
            cut = len(rows)
            while cut > 0 and rows[cut - 1][col] == top:
                cut -= 1
            out, self.pending = rows[:cut], rows[cut:]
            if out:
                entry[1] = out[-1][col]
        elif by_key:
            out = self.pending + rows
            self.pending = []
        if out:
            entry[2] += len(out)
            self.context.metrics["records_in"] += len(out)
            self.outbox.offer_chunk(-1, out)
        if last:
            entry[3] = True
            self.context.metrics["ranges_read"] += 1
            self.cursor.close()
            self.cursor = None

    def save_to_snapshot(self) -> bool:
        # not started yet: its ranges as planned (or restored), so that a restore never
        # lacks the ranges of a processor that had not begun
        todo = self.todo if self.todo is not None else self._mine()
        entries = [(BroadcastKey((_KEY, e[0][0])), list(e)) for e in todo]
        return self.outbox.offer_all_to_snapshot(entries) if entries else True

    def _close(self) -> None:
        if self.cursor is not None:
            try:
                self.cursor.close()
            except Exception:  # noqa: BLE001 - the connection may be gone
                pass
            self.cursor = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def close(self) -> None:
        self._close()
        self._release()


# --- on Spark -------------------------------------------------------------------------------

class _SparkPlan:
    """The plan of a backfill run and the driver's connection that holds its snapshot."""

    def __init__(self, plan: ReadPlan, holder: Any) -> None:
        self.plan, self.holder = plan, holder

    def close(self) -> None:
        if self.holder is not None:
            self.holder.close()
            self.holder = None


class PostgresSparkReader(SparkReader):
    """``Sources.postgres`` on the Spark backfill: the plan found on the driver before Spark
    starts (a failing query fails there), one Spark partition per range, each task reading
    in the snapshot the driver exports and holds until the run ends. With a hand-off, every
    range is saved as read, so the streaming job does not read the rows again."""

    def __init__(self, spec: PostgresSourceSpec) -> None:
        self.spec = spec

    def bounds(self, until: Any) -> _SparkPlan:
        import os

        conn = _connect(self.spec)
        try:
            n = self.spec.partitions or max(1, os.cpu_count() or 1)
            return _SparkPlan(plan_reads(conn, self.spec, n), conn)
        except BaseException:
            conn.close()
            raise

    def release(self, bounds: Any) -> None:
        if isinstance(bounds, _SparkPlan):
            bounds.close()

    def read(self, backfill: Any, t: Any, bounds: Any) -> StageOut:
        plan: ReadPlan = bounds.plan
        spec, snapshot, count = self.spec, plan.snapshot, backfill.task_counter()
        rdd = backfill.sc.parallelize(plan.ranges, len(plan.ranges)).flatMap(
            lambda r: read_range(spec, r, snapshot, count), preservesPartitioning=True)
        if backfill.export_state:
            backfill.driver_state.extend(
                (t.name, BroadcastKey((_KEY, r.index)), [r.to_entry(), None, 0, True])
                for r in plan.ranges)
        return StageOut(rdd, ordered=len(plan.ranges) == 1)
