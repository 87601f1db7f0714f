#!/usr/bin/env python3
"""Run a real PostgreSQL server (the operating system's packages, no Docker) on loopback.

    postgres_local.py up     [--port P] [--max-prepared-transactions N] [--no-fsync]
                                                   start (no-op if ours already runs on P)
    postgres_local.py down   [--port P]            stop what `up` started on P, delete its data
    postgres_local.py status [--port P]

The port defaults to $POSTGRES_PORT, else 5432. The server's programs (initdb, postgres,
pg_isready, psql) are found in $POSTGRES_BIN, else next to an `initdb` on the PATH, else in the
newest /usr/lib/postgresql/<version>/bin (Debian and Ubuntu keep them there, off the PATH);
`apt-get install postgresql` installs them (`make test` does, as root).

Everything a server writes lives in .cache/postgres/run-<port>/: the data directory (data/),
the Unix socket's directory (socket/), the server's log (postgres.log) and state.json (the
postmaster's pid and the settings it was started with); `down` removes that directory. The
server listens on TCP 127.0.0.1 only, trusts every connection from there (it is for
development and tests: nothing but local processes reach it), and has a superuser `jetwake`
and a database `jetwake`: its DSN is postgresql://jetwake@127.0.0.1:<port>/jetwake.

PostgreSQL refuses to run as root: run as root, the script runs initdb and the server as an
unprivileged account ($POSTGRES_RUN_AS, else the `postgres` account the OS package creates,
else `nobody`) and gives it the run directory.

`max_prepared_transactions` (default 64) allows PREPARE TRANSACTION, which a two-phase commit
into PostgreSQL needs (PostgreSQL's default is 0). --no-fsync (start_server(fsync=False)) turns
off fsync, synchronous_commit and full_page_writes: a server for tests, whose data an
operating system crash may lose, several times faster at commits.

The functions start_server(), stop_server(), server_status(), dsn_for() and find_bin_dir()
are the importable API (used by tests/support/postgres_server.py). Only the standard library
and the server's own programs are used.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

# These scripts are run by path and loaded by path (spec_from_file_location), never as part of a
# package, so the sibling module is found through sys.path: the folder tests/support goes on it
# (once, only if absent) and `import local_processes` then gives every loader the same module,
# which a plain import is the least surprising way to do.
_SUPPORT = str(Path(__file__).resolve().parent.parent)
if _SUPPORT not in sys.path:
    sys.path.append(_SUPPORT)
import local_processes as _lp  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent.parent
CACHE = REPO_ROOT / ".cache" / "postgres"

HOST = "127.0.0.1"
DEFAULT_PORT = 5432
SUPERUSER = "jetwake"
DATABASE = "jetwake"
DEFAULT_MAX_PREPARED_TRANSACTIONS = 64
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
INSTALL_HINT = ("install the operating system's PostgreSQL (`apt-get install postgresql`, which "
                "`make test` runs as root) or set POSTGRES_BIN to the folder of its initdb, or "
                "set POSTGRES_DSN to use a server that runs elsewhere")
# a Unix socket's path is at most 107 bytes (sun_path); the server's is <dir>/.s.PGSQL.<port>
_SOCKET_PATH_MAX = 100


class PostgresLocalError(RuntimeError):
    """Raised for every failure a caller should report (programs missing, initdb, start-up,
    port taken, readiness)."""


def _log(msg: str) -> None:
    print(f"[postgres-local] {msg}", file=sys.stderr, flush=True)


def default_port() -> int:
    return int(os.environ.get("POSTGRES_PORT") or DEFAULT_PORT)


def run_dir(port: int) -> Path:
    return CACHE / f"run-{port}"


def dsn_for(port: int, dbname: str = DATABASE, host: str = HOST) -> str:
    """The libpq URI of database `dbname` on the server started on `port`."""
    return f"postgresql://{SUPERUSER}@{host}:{port}/{dbname}"


def socket_dir(port: int) -> str:
    """The folder of the server's Unix socket, in its run directory; "" (no Unix socket, TCP
    only) when the socket's path would be too long for one (a checkout deep in folders)."""
    folder = run_dir(port) / "socket"
    return str(folder) if len(f"{folder}/.s.PGSQL.{port}") <= _SOCKET_PATH_MAX else ""


_file_lock = _lp.file_lock


# --------------------------------------------------------------------------------------------
# programs and the account that runs them
# --------------------------------------------------------------------------------------------

_PROGRAMS = ("initdb", "postgres", "pg_isready", "psql")


def _has_programs(folder: Path) -> bool:
    return all(os.access(folder / name, os.X_OK) for name in _PROGRAMS)


def _version_key(folder: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", folder.parent.name)) or (0,)


def find_bin_dir() -> Path | None:
    """The folder holding initdb, postgres, pg_isready and psql, or None when PostgreSQL is not
    installed (see the module's docstring for where it looks)."""
    env = os.environ.get("POSTGRES_BIN", "").strip()
    if env:
        return Path(env) if _has_programs(Path(env)) else None
    on_path = shutil.which("initdb")
    if on_path:
        folder = Path(on_path).resolve().parent  # Debian's links in /usr/bin go to the real one
        if _has_programs(folder):
            return folder
    versions = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if _has_programs(p)]
    return max(versions, key=_version_key) if versions else None


def bin_dir() -> Path:
    folder = find_bin_dir()
    if folder is None:
        where = (f"POSTGRES_BIN={os.environ['POSTGRES_BIN']} lacks one of {', '.join(_PROGRAMS)}"
                 if os.environ.get("POSTGRES_BIN", "").strip()
                 else "no initdb on the PATH nor in /usr/lib/postgresql/*/bin")
        raise PostgresLocalError(f"PostgreSQL is not installed ({where}): {INSTALL_HINT}")
    return folder


def server_version(folder: Path | None = None) -> str:
    out = subprocess.run([str((folder or bin_dir()) / "postgres"), "--version"],
                         capture_output=True, text=True).stdout
    found = re.search(r"PostgreSQL\)\s+(\S+)", out)  # postgres (PostgreSQL) 15.18 (Debian ...)
    return found.group(1) if found else "?"


def run_as_account() -> pwd.struct_passwd | None:
    """The account the server runs as when this process is root (None when it is not root: the
    server then runs as this process's user)."""
    if os.geteuid() != 0:
        return None
    wanted = os.environ.get("POSTGRES_RUN_AS", "").strip()
    for name in ([wanted] if wanted else ["postgres", "nobody"]):
        try:
            account = pwd.getpwnam(name)
        except KeyError:
            continue
        if account.pw_uid != 0:
            return account
    raise PostgresLocalError(
        "running as root, and PostgreSQL refuses to run as root: no unprivileged account to "
        f"run it as ({'POSTGRES_RUN_AS=' + wanted + ' is not one' if wanted else 'neither postgres nor nobody exists'}); "
        "create one (`useradd --system jetwake-pg`) and set POSTGRES_RUN_AS to it")


def _check_reachable(path: Path, account: pwd.struct_passwd) -> None:
    """The account must be able to pass through every folder above the run directory."""
    for folder in reversed(path.parents):
        mode = folder.stat()
        if mode.st_uid == account.pw_uid:
            allowed = mode.st_mode & stat.S_IXUSR
        elif mode.st_gid == account.pw_gid:
            allowed = mode.st_mode & stat.S_IXGRP
        else:
            allowed = mode.st_mode & stat.S_IXOTH
        if not allowed:
            raise PostgresLocalError(
                f"the account {account.pw_name!r} that runs PostgreSQL (root may not) cannot "
                f"enter {folder} (mode {stat.filemode(mode.st_mode)}), above {path}: allow it "
                f"(`chmod o+x {folder}`), set POSTGRES_RUN_AS to an account that can, or set "
                "POSTGRES_DSN to use a server that runs elsewhere")


def _as_account(account: pwd.struct_passwd | None) -> dict:
    """Popen arguments that run the child as `account` (nothing when it is None)."""
    if account is None:
        return {}
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _child_env(account: pwd.struct_passwd | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C.UTF-8" if Path("/usr/lib/locale/C.utf8").exists() else "C"
    if account is not None:
        env.update(HOME=account.pw_dir or "/", USER=account.pw_name, LOGNAME=account.pw_name)
    return env


# --------------------------------------------------------------------------------------------
# ports and processes
# --------------------------------------------------------------------------------------------

port_in_use = _lp.port_in_use
_can_bind = _lp.can_bind


def free_port() -> int:
    """A loopback port nothing listens on now."""
    return _lp.free_port(error=PostgresLocalError)


def speaks_postgres(port: int, host: str = HOST, timeout: float = 1.0) -> bool:
    """True when what listens on host:port answers PostgreSQL's SSLRequest (the first message
    of libpq's start-up) with one of the two answers a PostgreSQL server gives, 'S' or 'N'."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack("!ii", 8, 80877103))
            return s.recv(1) in (b"S", b"N")
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    # a recycled pid is not ours: it must still be a postgres
    return _lp.pid_alive(pid, b"postgres")


def _read_state(port: int) -> dict | None:
    try:
        return json.loads((run_dir(port) / "state.json").read_text())
    except (OSError, ValueError):
        return None


def _alive_pid(state: dict | None) -> int | None:
    pid = (state or {}).get("pid")
    return pid if pid and _pid_alive(pid) else None


def _log_tail(path: Path, lines: int = 30) -> str:
    return _lp.log_tail(path, lines)


def _terminate(pid: int, timeout: float = STOP_TIMEOUT) -> None:
    """PostgreSQL's fast shutdown (SIGINT: clients disconnected, transactions rolled back, a
    checkpoint), then its immediate shutdown (SIGQUIT), then SIGKILL."""
    _lp.terminate(pid, [(signal.SIGINT, timeout), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 10.0)],
                  _pid_alive, _log)


def _rmtree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------

def _server_settings(port: int, socket_dir: str, fsync: bool,
                     max_prepared_transactions: int) -> str:
    settings = {
        "listen_addresses": f"'{HOST}'",
        "port": str(port),
        "unix_socket_directories": f"'{socket_dir}'",
        "max_connections": "100",
        "max_prepared_transactions": str(max_prepared_transactions),
        "shared_buffers": "32MB",  # small: it shares the machine with the tests
        "log_destination": "'stderr'",
        "logging_collector": "off",
        "log_min_messages": "warning",
        "log_line_prefix": "'%m [%p] '",
    }
    if not fsync:
        settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
    return ("\n# written by tests/support/local_postgres/postgres_local.py\n"
            + "".join(f"{key} = {value}\n" for key, value in settings.items()))


HBA = f"""\
# written by tests/support/local_postgres/postgres_local.py: loopback only, trusted
local all all trust
host  all all {HOST}/32 trust
"""


def _run_checked(cmd: list[str], what: str, log: Path, **kwargs) -> str:
    return _lp.run_checked(cmd, what, log, PostgresLocalError, echo_command=True,
                           stdin=subprocess.DEVNULL, **kwargs)


def _psql(folder: Path, port: int, sql: str, dbname: str = "postgres",
          timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run([str(folder / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                           "-h", HOST, "-p", str(port), "-U", SUPERUSER, "-d", dbname,
                           "-c", sql], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=_child_env(None))


def _ready(folder: Path, port: int) -> bool:
    return subprocess.run([str(folder / "pg_isready"), "-q", "-h", HOST, "-p", str(port),
                           "-U", SUPERUSER, "-d", "postgres", "-t", "2"],
                          stdin=subprocess.DEVNULL, env=_child_env(None)).returncode == 0


def _wait_ready(folder: Path, port: int, pid: int, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not _ready(folder, port):
        if not _pid_alive(pid):
            raise PostgresLocalError(f"the server (pid {pid}) exited during start-up; last "
                                     f"lines of {log}:\n{_log_tail(log)}")
        if time.monotonic() > deadline:
            raise PostgresLocalError(f"PostgreSQL on {HOST}:{port} did not accept connections "
                                     f"within {timeout:.0f}s; last lines of {log}:\n"
                                     f"{_log_tail(log)}")
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------

def server_status(port: int) -> dict:
    state = _read_state(port)
    return {
        "port": port,
        "dsn": dsn_for(port),
        "answering": speaks_postgres(port),
        "ours": state is not None,
        "pid": (state or {}).get("pid"),
        "alive_pid": _alive_pid(state),
        "run_dir": str(run_dir(port)),
        "version": (state or {}).get("version"),
        "settings": (state or {}).get("settings", {}),
    }


def _check_same_settings(port: int, state: dict, wanted: dict) -> None:
    have = state.get("settings", {})
    if have != wanted:
        raise PostgresLocalError(f"the PostgreSQL on port {port} runs with {have}, not "
                                 f"{wanted}; stop it (`postgres_local.py down --port {port}`) "
                                 "or choose another --port")


def start_server(port: int | None = None, *, fsync: bool = True,
                 max_prepared_transactions: int = DEFAULT_MAX_PREPARED_TRANSACTIONS,
                 timeout: float = READY_TIMEOUT) -> str:
    """Start a PostgreSQL server on 127.0.0.1:`port` with a fresh data directory and return
    the DSN of its database `jetwake` once it accepts connections. Returns at once when the
    server this script started on `port` runs there already (with the same settings). Raises
    PostgresLocalError when the port is taken by anything else, PostgreSQL is not installed,
    or the server does not start."""
    port = default_port() if port is None else int(port)
    if max_prepared_transactions < 0:
        raise PostgresLocalError("max_prepared_transactions must be >= 0")
    wanted = {"fsync": fsync, "max_prepared_transactions": max_prepared_transactions}
    rdir = run_dir(port)
    with _file_lock(CACHE / "locks" / f"run-{port}.lock"):
        state = _read_state(port)
        pid = _alive_pid(state)
        if pid is not None:
            assert state is not None
            _check_same_settings(port, state, wanted)
            folder = Path(state["bin_dir"])
            _wait_ready(folder, port, pid, timeout, rdir / "postgres.log")
            _log(f"PostgreSQL started by postgres_local already runs on {HOST}:{port} "
                 f"(pid {pid})")
            return dsn_for(port)
        if port_in_use(port) or not _can_bind(port):
            what = ("a PostgreSQL server that postgres_local did not start (set POSTGRES_DSN to "
                    "use it)" if speaks_postgres(port) else "something that is not PostgreSQL")
            raise PostgresLocalError(f"port {HOST}:{port} is taken by {what}; choose another "
                                     "with --port / POSTGRES_PORT")
        folder = bin_dir()
        account = run_as_account()
        _rmtree(rdir)  # a stale run of a server that was killed: its data is disposable
        rdir.mkdir(parents=True)
        data, sockets, log = rdir / "data", rdir / "socket", rdir / "postgres.log"
        sockets.mkdir()
        if account is not None:
            _check_reachable(rdir, account)
            for path in (rdir, sockets):
                os.chown(path, account.pw_uid, account.pw_gid)
        t0 = time.monotonic()
        as_account = _as_account(account)
        env = _child_env(account)
        _run_checked([str(folder / "initdb"), "-D", str(data), "-U", SUPERUSER, "-A", "trust",
                      "-E", "UTF8", "--no-locale", "--no-sync"],
                     "initdb", rdir / "initdb.log", env=env, cwd=rdir, **as_account)
        with open(data / "postgresql.conf", "a") as fh:
            fh.write(_server_settings(port, socket_dir(port), fsync, max_prepared_transactions))
        (data / "pg_hba.conf").write_text(HBA)
        version = server_version(folder)
        with open(log, "ab") as out:
            proc = subprocess.Popen([str(folder / "postgres"), "-D", str(data)],
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    close_fds=True, cwd=rdir, env=env, **as_account)
        state = {"port": port, "pid": proc.pid, "dsn": dsn_for(port), "bin_dir": str(folder),
                 "version": version, "settings": wanted,
                 "account": account.pw_name if account else None}
        (rdir / "state.json").write_text(json.dumps(state, indent=2) + "\n")
        try:
            _wait_ready(folder, port, proc.pid, timeout, log)
            created = _psql(folder, port, f"CREATE DATABASE {DATABASE}")
            if created.returncode != 0:
                raise PostgresLocalError(f"creating the database {DATABASE} failed:\n"
                                         f"{created.stderr.strip()}")
        except BaseException:
            _terminate(proc.pid, timeout=5)
            raise
        settings = ", ".join(f"{k}={v}" for k, v in wanted.items())
        _log(f"PostgreSQL {version} ready on {HOST}:{port} after {time.monotonic() - t0:.1f}s "
             f"(pid {proc.pid}, {settings}, as {state['account'] or 'this user'}; "
             f"files in {rdir})")
        return dsn_for(port)


def stop_server(port: int | None = None, timeout: float = STOP_TIMEOUT) -> bool:
    """Stop the server `start_server` started on `port` and delete its run directory (data
    included). Returns False when there was no server of ours running there."""
    port = default_port() if port is None else int(port)
    rdir = run_dir(port)
    with _file_lock(CACHE / "locks" / f"run-{port}.lock"):
        state = _read_state(port)
        pid = _alive_pid(state)
        if pid is not None:
            _log(f"stopping PostgreSQL on port {port} (pid {pid}) ...")
            _terminate(pid, timeout)
        _rmtree(rdir)
        if state is None and port_in_use(port):
            _log(f"something answers on {HOST}:{port} but it was not started by "
                 "postgres_local; left alone")
        return pid is not None


def restart_server(port: int | None = None, *, immediate: bool = True,
                   timeout: float = READY_TIMEOUT) -> str:
    """Stop the server `start_server` started on `port` and start it again on the same data
    directory, keeping its data (and its prepared transactions); returns the DSN once it
    accepts connections. ``immediate``: stop it as a crash would (SIGQUIT: no checkpoint,
    clients cut off, recovery from the WAL at the start), else PostgreSQL's fast shutdown."""
    port = default_port() if port is None else int(port)
    rdir = run_dir(port)
    with _file_lock(CACHE / "locks" / f"run-{port}.lock"):
        state = _read_state(port)
        if state is None:
            raise PostgresLocalError(f"no PostgreSQL started by postgres_local on port {port}")
        pid = _alive_pid(state)
        if pid is not None:
            if immediate:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGQUIT)
            _terminate(pid, STOP_TIMEOUT)
        folder = Path(state["bin_dir"])
        account = run_as_account() if state.get("account") else None
        log = rdir / "postgres.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([str(folder / "postgres"), "-D", str(rdir / "data")],
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    close_fds=True, cwd=rdir, env=_child_env(account),
                                    **_as_account(account))
        state["pid"] = proc.pid
        (rdir / "state.json").write_text(json.dumps(state, indent=2) + "\n")
        _wait_ready(folder, port, proc.pid, timeout, log)
        _log(f"PostgreSQL on port {port} restarted (pid {proc.pid}), data kept")
        return dsn_for(port)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("up", "down", "status"):
        p = sub.add_parser(name)
        p.add_argument("--port", type=int, default=None,
                       help=f"TCP port on {HOST} (default $POSTGRES_PORT, else {DEFAULT_PORT})")
        if name == "up":
            p.add_argument("--max-prepared-transactions", type=int,
                           default=DEFAULT_MAX_PREPARED_TRANSACTIONS,
                           help="PostgreSQL's max_prepared_transactions (default "
                                f"{DEFAULT_MAX_PREPARED_TRANSACTIONS})")
            p.add_argument("--no-fsync", action="store_true",
                           help="fsync, synchronous_commit and full_page_writes off (tests "
                                "only: an OS crash may lose data)")
            p.add_argument("--timeout", type=float, default=READY_TIMEOUT)
    args = ap.parse_args(argv)
    port = default_port() if args.port is None else args.port
    try:
        if args.cmd == "up":
            print(start_server(port, fsync=not args.no_fsync,
                               max_prepared_transactions=args.max_prepared_transactions,
                               timeout=args.timeout))
        elif args.cmd == "down":
            if not stop_server(port):
                _log(f"no PostgreSQL started by postgres_local runs on port {port}")
        else:
            st = server_status(port)
            settings = "".join(f" {k}={v}" for k, v in st["settings"].items())
            if st["answering"] and st["alive_pid"]:
                print(f"running: {st['dsn']} pid={st['alive_pid']} version={st['version']}"
                      f"{settings}")
            elif st["answering"]:
                print(f"a PostgreSQL not started by postgres_local answers on {HOST}:{port}")
            elif st["alive_pid"]:
                print(f"starting or unhealthy: pid={st['alive_pid']} (see {st['run_dir']})")
            else:
                print(f"not running on port {port}")
                return 1
    except PostgresLocalError as e:
        _log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
