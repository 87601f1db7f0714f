"""PostgreSQL's two-phase commit as the exactly-once sinks use it: global transaction ids
naming the job, the sink, the writer and the snapshot; listing, committing and rolling back
the prepared transactions of a job; the check of ``max_prepared_transactions``.

A gid is ``jetwake:<job id>:<sink>:<writer index>:<snapshot id>``: ``<sink>`` is the stage's
name with every character outside ``[A-Za-z0-9_.-]`` replaced by ``_`` and, when anything was
replaced or the name is longer than 80 characters, shortened and followed by ``~`` and 8 hex
digits of its SHA-1 (so two names never share a gid). A gid stays under PostgreSQL's limit
of 200 bytes. Shared by the member's sink processors and the Spark backfill's tasks (their
``writer index`` is the task's partition).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from jetwake.connectors.postgres.rows import PostgresSinkError

__all__ = [
    "GID_PREFIX", "PreparedGid", "sink_key", "make_gid", "parse_gid", "list_prepared",
    "commit_prepared", "rollback_prepared", "prepare", "check_max_prepared_transactions",
]

GID_PREFIX = "jetwake"
_SAFE = re.compile(r"[^A-Za-z0-9_.\-]")
_MAX_NAME = 80


@dataclass(frozen=True)
class PreparedGid:
    """The parts of a gid."""

    job_id: str
    sink: str
    writer_index: int
    snapshot_id: int
    gid: str


def sink_key(vertex_name: str) -> str:
    """The stage's name as it appears in gids (see the module's docstring)."""
    safe = _SAFE.sub("_", vertex_name)
    if safe != vertex_name or len(safe) > _MAX_NAME:
        digest = hashlib.sha1(vertex_name.encode()).hexdigest()[:8]
        safe = f"{safe[:_MAX_NAME]}~{digest}"
    return safe


def make_gid(job_id: str, vertex_name: str, writer_index: int, snapshot_id: int) -> str:
    """The global transaction id of one writer's transaction of one snapshot."""
    job = _SAFE.sub("_", str(job_id))[:64]
    gid = f"{GID_PREFIX}:{job}:{sink_key(vertex_name)}:{writer_index}:{snapshot_id}"
    assert len(gid.encode()) < 200, gid
    return gid


def parse_gid(gid: str) -> PreparedGid | None:
    """The parts of a gid made by :func:`make_gid`; None for any other gid."""
    parts = gid.split(":")
    if len(parts) != 5 or parts[0] != GID_PREFIX:
        return None
    try:
        return PreparedGid(parts[1], parts[2], int(parts[3]), int(parts[4]), gid)
    except ValueError:
        return None


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def list_prepared(conn: Any, job_id: str | None = None,
                  vertex_name: str | None = None) -> list[PreparedGid]:
    """The prepared transactions of jetwake in the connection's database (of one job, and of
    one of its sinks, when given), sorted by writer and snapshot."""
    prefix = f"{GID_PREFIX}:"
    if job_id is not None:
        prefix += f"{_SAFE.sub('_', str(job_id))[:64]}:"
        if vertex_name is not None:
            prefix += f"{sink_key(vertex_name)}:"
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND gid LIKE %s", (_like_escape(prefix) + "%",)).fetchall()
    found = [p for p in (parse_gid(r[0]) for r in rows) if p is not None]
    return sorted(found, key=lambda p: (p.job_id, p.sink, p.writer_index, p.snapshot_id))


def _finish(conn: Any, verb: str, gid: str) -> bool:
    """``COMMIT PREPARED`` / ``ROLLBACK PREPARED`` outside a transaction; False when no such
    transaction exists (already finished)."""
    from psycopg import errors, sql

    if not conn.autocommit:
        conn.rollback()
        conn.autocommit = True
    try:
        conn.execute(sql.SQL(verb + " {}").format(sql.Literal(gid)))
        return True
    except errors.UndefinedObject:
        return False


def commit_prepared(conn: Any, gid: str) -> bool:
    """Commits a prepared transaction; False when it no longer exists."""
    return _finish(conn, "COMMIT PREPARED", gid)


def rollback_prepared(conn: Any, gid: str) -> bool:
    """Rolls back a prepared transaction; False when it no longer exists."""
    return _finish(conn, "ROLLBACK PREPARED", gid)


def prepare(conn: Any, gid: str) -> None:
    """Prepares the connection's open transaction under ``gid``: from now on it belongs to the
    server, survives the connection and a server restart, and holds its locks until it is
    committed or rolled back by gid."""
    from psycopg import sql

    conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))


def check_max_prepared_transactions(conn: Any, where: str, needed: int = 1) -> int:
    """The server's ``max_prepared_transactions``; an error naming the setting, its value and
    how to change it when it is below ``needed`` (0, PostgreSQL's default, refuses
    ``PREPARE TRANSACTION``)."""
    value = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])
    if value < needed:
        raise PostgresSinkError(
            f"{where}: exactly-once needs prepared transactions, but the server's "
            f"max_prepared_transactions is {value} (it must be at least {needed}, the sink's "
            "parallelism, and at least max_connections is advised). Set it on the server and "
            "restart it: ALTER SYSTEM SET max_prepared_transactions = 64; (or "
            "max_prepared_transactions = 64 in postgresql.conf), then restart PostgreSQL; or "
            "use key_columns=[...] (upsert) or exactly_once=False")
    return value
