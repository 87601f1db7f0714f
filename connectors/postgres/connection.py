"""Connections of the PostgreSQL sink: opened and re-opened with tenacity, bounded, with
exponential back-off, so that a server restart or a lost network connection in the middle of
a job is waited out; errors that waiting cannot heal (authentication, a database that does not
exist, a bad DSN) fail at once, naming the server's message."""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

from jetwake.connectors.postgres.rows import PostgresSinkError

__all__ = ["RETRY_TIMEOUT_S", "connect", "is_connection_lost", "retrying", "check_dsn"]

log = logging.getLogger("jetwake.postgres")

RETRY_TIMEOUT_S = 30.0
"""How long a lost connection is retried before the sink gives up (the job then restarts
from its last snapshot)."""

T = TypeVar("T")

# SQLSTATE classes of errors a new connection will not heal: 28 (authorization), 3D (no such
# database), 42 (syntax or access rule)
_PERMANENT = ("28", "3D", "42")


def check_dsn(dsn: Any, where: str) -> str:
    """Parses ``dsn`` (a libpq connection string or URI) when the pipeline is built."""
    from psycopg.conninfo import conninfo_to_dict

    if not isinstance(dsn, str) or not dsn.strip():
        raise PostgresSinkError(f"{where} needs a dsn (a libpq connection string or "
                                f"postgresql:// URI), got {dsn!r}")
    try:
        conninfo_to_dict(dsn)
    except Exception as e:
        raise PostgresSinkError(f"{where}: the dsn is not a libpq connection string or URI: "
                                f"{e}") from None
    return dsn


def is_connection_lost(error: BaseException) -> bool:
    """Whether ``error`` means the connection (or the server) went away, not a bad statement."""
    import psycopg

    if isinstance(error, psycopg.OperationalError):
        state = getattr(error, "sqlstate", None) or ""
        return not state.startswith(_PERMANENT)
    return isinstance(error, psycopg.InterfaceError)


def retrying(call: Callable[[], T], what: str, where: str,
             timeout_s: float = RETRY_TIMEOUT_S,
             on_retry: Callable[[BaseException], None] | None = None) -> T:
    """Runs ``call`` again while it fails with a lost connection, waiting 0.1 s, 0.2 s, ...
    up to 2 s between attempts, for at most ``timeout_s``; then raises RestartableError (the
    job restarts from its last snapshot). ``on_retry`` runs before each new attempt."""
    import tenacity

    from jetwake.engine.core.errors import RestartableError

    def before_sleep(state: tenacity.RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome else None
        log.warning("%s: %s failed (%s); retrying", where, what, err)
        if on_retry is not None and err is not None:
            on_retry(err)

    try:
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_connection_lost),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
            stop=tenacity.stop_after_delay(timeout_s),
            before_sleep=before_sleep, reraise=True)(call)
    except Exception as e:
        if is_connection_lost(e):
            raise RestartableError(
                f"{where}: {what} failed for {timeout_s:.0f} s: {type(e).__name__}: {e}; "
                "restarting the job from its last snapshot") from e
        raise


def connect(dsn: str, where: str, timeout_s: float = RETRY_TIMEOUT_S) -> Any:
    """A connection (not autocommit), retried while the server does not answer; a server that
    refuses it for good (authentication, no such database) fails at once."""
    import psycopg

    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    # a server that vanishes without closing the connection (a host down, a network cut) is
    # noticed within about 25 s rather than hours, unless the dsn says otherwise
    for key, value in (("connect_timeout", 5), ("keepalives", 1), ("keepalives_idle", 10),
                       ("keepalives_interval", 5), ("keepalives_count", 3)):
        params.setdefault(key, value)
    conninfo = make_conninfo("", **params)

    def attempt() -> Any:
        try:
            return psycopg.connect(conninfo)
        except psycopg.OperationalError as e:
            if is_connection_lost(e) and not _permanent_message(str(e)):
                raise
            raise PostgresSinkError(f"{where}: cannot connect to PostgreSQL: {e}".rstrip()
                                    + "; fix the dsn or the server") from None

    server = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
    return retrying(attempt, f"connecting to PostgreSQL at {server} (is it running? is the dsn "
                    "right?)", where, timeout_s)


def _permanent_message(text: str) -> bool:
    """Connection failures psycopg reports without a SQLSTATE but that retrying cannot heal."""
    lowered = text.lower()
    return any(s in lowered for s in ("does not exist", "password authentication failed",
                                      "no pg_hba.conf entry", "role", "invalid dsn",
                                      "could not translate host name"))
