"""The SQL of the PostgreSQL sink, one function per statement, identifiers quoted by
``psycopg.sql`` (a table or column name is never pasted into SQL text), and the catalog checks
made when a sink starts. Shared by the member's processors and the Spark backfill's tasks.

Writing a batch (:func:`write_batch`, or :class:`CopyStream` for the batches of one
transaction):

- *insert* mode (no ``key_columns``): ``COPY table (columns) FROM STDIN``, the fastest way
  into PostgreSQL. A COPY costs about a millisecond to open and close (two round trips), as
  much as a thousand rows: the batches of one transaction go into one COPY kept open
  (:class:`CopyStream`), each batch sent as it comes, the COPY ended before the transaction
  is prepared or committed;
- *upsert* mode (``key_columns``): ``INSERT ... ON CONFLICT (key_columns) DO UPDATE SET``
  every other column to ``EXCLUDED``'s value. When every column has a plain type (numbers,
  text, booleans, dates and times, uuid: :func:`array_types`), one statement per batch over
  arrays, ``INSERT ... SELECT * FROM unnest(%s::int4[], %s::text[], ...) ON CONFLICT ...``
  (about 2.5 times the rows per second of ``executemany``), after keeping the last row of each
  key in the batch (one statement may not update a row twice; the last row is what applying
  them in order leaves). Otherwise, or when a column's values in a batch are of mixed Python
  types (psycopg dumps a list of one type), ``executemany`` in pipeline mode (one round trip
  per batch). (A temporary table to COPY into is out: a transaction that touched one cannot be
  prepared.)
"""

from __future__ import annotations

from typing import Any, Sequence

from jetwake.connectors.postgres.rows import PostgresSinkError

__all__ = [
    "parse_table", "table_identifier", "table_columns", "check_columns", "check_unique_key",
    "insert_statement", "copy_statement", "upsert_statement", "write_batch", "CopyStream",
    "array_types", "unnest_upsert_statement",
]


def parse_table(table: str) -> tuple[str, ...]:
    """``"name"`` or ``"schema.name"`` as the parts of a qualified name (no quoting: the parts
    are the names as stored in the catalog)."""
    if not isinstance(table, str) or not table.strip():
        raise PostgresSinkError(f"Sinks.postgres() needs a table name, got {table!r}")
    parts = tuple(table.split("."))
    if len(parts) > 2 or not all(parts):
        raise PostgresSinkError(f"Sinks.postgres({table!r}): a table is 'name' or "
                                "'schema.name'")
    return parts


def table_identifier(table: str) -> Any:
    """The table's name as a quoted SQL identifier."""
    from psycopg import sql

    return sql.Identifier(*parse_table(table))


def _regclass(table: str) -> str:
    """The table as text ``to_regclass`` resolves, each part quoted."""
    return ".".join('"' + p.replace('"', '""') + '"' for p in parse_table(table))


def table_columns(conn: Any, table: str, where: str) -> list[str]:
    """The table's columns in order, generated and dropped ones left out; an error naming the
    table (and the database) when it does not exist."""
    row = conn.execute("SELECT to_regclass(%s)::oid, current_database()",
                       (_regclass(table),)).fetchone()
    if row is None or row[0] is None:
        db = row[1] if row is not None else "?"
        raise PostgresSinkError(
            f"{where}: table {table!r} does not exist in database {db!r} (search path "
            "resolved); create it first, or name it as 'schema.name'")
    cols = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
        "AND NOT attisdropped AND attgenerated = '' ORDER BY attnum", (row[0],)).fetchall()
    return [c[0] for c in cols]


def check_columns(conn: Any, table: str, columns: Sequence[str], where: str) -> list[str]:
    """Checks that every one of ``columns`` exists in ``table`` (an error naming the unknown
    ones and the table's columns); returns the table's columns."""
    have = table_columns(conn, table, where)
    unknown = [c for c in columns if c not in have]
    if unknown:
        raise PostgresSinkError(
            f"{where}: table {table!r} has no column(s) {unknown}; its columns are {have}. "
            "Fix columns=[...] (names are case-sensitive, as stored in the catalog)")
    return have


def check_unique_key(conn: Any, table: str, key_columns: Sequence[str], where: str) -> None:
    """``ON CONFLICT (key_columns)`` needs a unique index or primary key on exactly those
    columns: an error saying so when the table has none."""
    row = conn.execute("SELECT to_regclass(%s)::oid", (_regclass(table),)).fetchone()
    indexes = conn.execute(
        "SELECT ARRAY(SELECT a.attname FROM unnest(i.indkey) k "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k) "
        "FROM pg_index i WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL "
        "AND i.indexprs IS NULL", (row[0],)).fetchall()
    want = set(key_columns)
    if not any(set(cols) == want for (cols,) in indexes):
        keys = [list(cols) for (cols,) in indexes]
        raise PostgresSinkError(
            f"{where}: key_columns {list(key_columns)} are not a unique key of table "
            f"{table!r} (its unique keys: {keys or 'none'}); INSERT ... ON CONFLICT needs a "
            "primary key or a unique index on exactly those columns: create one (ALTER TABLE "
            "... ADD PRIMARY KEY (...) or CREATE UNIQUE INDEX ... ON ... (...)) or pass the "
            "key_columns of an existing one")


def insert_statement(table: str, columns: Sequence[str]) -> Any:
    """``INSERT INTO table (columns) VALUES (%s, ...)``."""
    from psycopg import sql

    return sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        table_identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)))


def copy_statement(table: str, columns: Sequence[str]) -> Any:
    """``COPY table (columns) FROM STDIN``."""
    from psycopg import sql

    return sql.SQL("COPY {} ({}) FROM STDIN").format(
        table_identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)))


def _on_conflict_action(columns: Sequence[str], key_columns: Sequence[str]) -> Any:
    """What an upsert does with a row whose key is there: ``DO UPDATE SET c = EXCLUDED.c``
    for every column not in the key, ``DO NOTHING`` when every column is in the key."""
    from psycopg import sql

    rest = [c for c in columns if c not in key_columns]
    if not rest:
        return sql.SQL("DO NOTHING")
    return sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
        for c in rest))


def upsert_statement(table: str, columns: Sequence[str], key_columns: Sequence[str]) -> Any:
    """``INSERT ... ON CONFLICT (key_columns) DO UPDATE SET c = EXCLUDED.c`` for every column
    not in the key (``DO NOTHING`` when every column is in the key)."""
    from psycopg import sql

    action = _on_conflict_action(columns, key_columns)
    return sql.SQL("{} ON CONFLICT ({}) {}").format(
        insert_statement(table, columns), sql.SQL(", ").join(map(sql.Identifier, key_columns)),
        action)


_ARRAY_CATEGORIES = frozenset("BDNST")   # boolean, date/time, numeric, string, timespan


def array_types(conn: Any, table: str, columns: Sequence[str]) -> list[str] | None:
    """The SQL types of ``columns`` (``format_type``) when every one is a plain type whose
    values an array carries (numbers, text, booleans, dates and times, uuid); None otherwise
    (an array, json, a composite type...): the upsert then uses ``executemany``."""
    found = dict((name, (typ, cat, tname)) for name, typ, cat, tname in conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typcategory, t.typname "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
        (_regclass(table),)).fetchall())
    types = []
    for c in columns:
        typ, cat, tname = found[c]
        if cat not in _ARRAY_CATEGORIES and tname != "uuid":
            return None
        types.append(typ)
    return types


def unnest_upsert_statement(table: str, columns: Sequence[str], key_columns: Sequence[str],
                            types: Sequence[str]) -> Any:
    """``INSERT INTO table (columns) SELECT * FROM unnest(%s::type[], ...) ON CONFLICT ...``:
    one array per column. ``types`` come from the catalog (:func:`array_types`)."""
    from psycopg import sql

    action = _on_conflict_action(columns, key_columns)
    arrays = sql.SQL(", ").join(sql.SQL("%s::" + t + "[]") for t in types)
    return sql.SQL("INSERT INTO {} ({}) SELECT * FROM unnest({}) ON CONFLICT ({}) {}").format(
        table_identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)), arrays,
        sql.SQL(", ").join(map(sql.Identifier, key_columns)), action)


def _last_of_each_key(columns: Sequence[str], key_columns: Sequence[str],
                      rows: Sequence[tuple]) -> list[tuple]:
    at = [list(columns).index(k) for k in key_columns]
    last: dict = {}
    for row in rows:
        last[tuple(row[i] for i in at)] = row
    return list(last.values())


def write_batch(conn: Any, table: str, columns: Sequence[str],
                key_columns: Sequence[str] | None, rows: Sequence[tuple],
                types: Sequence[str] | None = None) -> None:
    """Writes ``rows`` in the connection's current transaction: COPY without ``key_columns``;
    with them an upsert, over arrays when ``types`` (:func:`array_types`) are given, else sent
    with ``executemany`` (pipelined)."""
    import psycopg

    if not rows:
        return
    with conn.cursor() as cur:
        if key_columns and types is not None:
            unique = _last_of_each_key(columns, key_columns, rows)
            try:
                cur.execute(unnest_upsert_statement(table, columns, key_columns, types),
                            [list(col) for col in zip(*unique)])
                return
            except psycopg.DataError as e:
                if getattr(e, "sqlstate", None):
                    raise   # the server refused a value
                # psycopg could not make an array of a column's values (mixed Python types):
                # nothing was sent; the rows one by one
        if key_columns:
            cur.executemany(upsert_statement(table, columns, key_columns), rows)
        else:
            with cur.copy(copy_statement(table, columns)) as copy:
                for row in rows:
                    copy.write_row(row)


class CopyStream:
    """One ``COPY table (columns) FROM STDIN`` kept open over the batches of a transaction:
    :meth:`write` sends a batch (psycopg holds back at most its 32 KB buffer), :meth:`finish`
    ends the COPY, after which the connection runs other statements again (PREPARE, COMMIT)."""

    def __init__(self, conn: Any, table: str, columns: Sequence[str]) -> None:
        self._cursor = conn.cursor()
        self._cm = self._cursor.copy(copy_statement(table, columns))
        self._copy = self._cm.__enter__()

    def write(self, rows: Sequence[tuple]) -> None:
        write_row = self._copy.write_row
        for row in rows:
            write_row(row)

    def abort(self) -> None:
        """Ends the COPY without its rows (the transaction is to be rolled back)."""
        cm, self._cm = self._cm, None
        if cm is not None:
            try:
                cm.__exit__(RuntimeError, RuntimeError("COPY aborted by jetwake"), None)
            finally:
                self._cursor.close()

    def finish(self) -> None:
        """Ends the COPY (its rows are then part of the transaction); a server error in the
        rows (a NULL in a NOT NULL column, a value of the wrong type) is raised here."""
        cm, self._cm = self._cm, None
        if cm is not None:
            cm.__exit__(None, None, None)
            self._cursor.close()
