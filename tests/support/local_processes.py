"""The processes a local runner starts, their ports, locks and logs.

Shared by the standalone runner scripts tests/support/local_kafka/kafka_local.py (a Kafka
broker) and tests/support/local_postgres/postgres_local.py (a PostgreSQL server), which each
had a copy of these helpers. Standard library only: both scripts run by path, outside the
project's virtualenv.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

HOST = "127.0.0.1"


@contextlib.contextmanager
def file_lock(path: Path):
    """Exclusive inter-process lock (two `up`s, an `up` and a `down`, or pytest workers racing
    on one port or one fetch)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def port_in_use(port: int, host: str = HOST) -> bool:
    """True when something accepts TCP connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def can_bind(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(count: int = 1, avoid: set[int] | None = None,
              error: type[Exception] = RuntimeError) -> int:
    """A loopback port P such that P .. P+count-1 are all currently free (and not in `avoid`);
    raises `error` when 200 tries find none."""
    def kernel_choice() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            return s.getsockname()[1]
    return _free_span(kernel_choice, count, avoid, 200, error)


def _free_span(pick: Callable[[], int], count: int, avoid: set[int] | None, tries: int,
               error: type[Exception]) -> int:
    """The first base ``pick()`` offers whose ``count`` ports are all free and not in
    ``avoid``."""
    avoid = avoid or set()
    for _ in range(tries):
        base = pick()
        span = range(base, base + count)
        if base + count < 65536 and not (avoid & set(span)) and all(can_bind(p) for p in span):
            return base
    raise error(f"could not find {count} consecutive free loopback port(s)")


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for the source end of outgoing connections (and bind to
    port 0)."""
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def server_port(count: int = 1, avoid: set[int] | None = None,
                error: type[Exception] = RuntimeError) -> int:
    """A loopback port P below the kernel's ephemeral range such that P .. P+count-1 are all
    free now: for a server that is stopped and started again on its port.

    A port of the ephemeral range can be taken, while its server is down, by a client that
    keeps connecting to it: the kernel may give the client that very port as its source port,
    and the connection then connects to itself (a TCP simultaneous open) and holds the port.
    A broker started again then failed to bind its listener, seconds after it had joined its
    cluster. No client's source port lies below the range."""
    low, top = 10_000, ephemeral_range()[0] - count
    if top <= low:  # a machine whose ephemeral range starts low: no such port to pick
        return free_port(count, avoid, error)
    rng = random.SystemRandom()
    return _free_span(lambda: rng.randrange(low, top), count, avoid, 500, error)


def pid_alive(pid: int, marker: bytes, permission_means_alive: bool = False) -> bool:
    """True while `pid` runs and is still the program whose command line holds `marker`: an
    exited child of ours is reaped, a zombie counts as gone, and so does a recycled pid (the
    command line reads empty for a moment inside execve(), so empty counts as ours). When the
    pid belongs to another account, `permission_means_alive` answers True at once instead of
    reading /proc."""
    try:  # reap it if it is our own (exited) child, so it does not linger as a zombie
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        if permission_means_alive:
            return True
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        if status.rpartition(")")[2].split()[0] in ("Z", "X"):
            return False
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        return not cmdline or marker in cmdline
    except OSError:
        return True


def log_tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text[-lines:])


def run_checked(cmd: list[str], what: str, log: Path, error: type[Exception],
                echo_command: bool = False, **kwargs) -> str:
    """Runs `cmd`, appends its output to `log` (after a `$ cmd` line with `echo_command`), and
    raises `error` with the output's last 30 lines when it fails. Returns the output."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          **kwargs)
    with open(log, "a") as fh:
        fh.write((f"$ {' '.join(cmd)}\n" if echo_command else "") + proc.stdout)
    if proc.returncode != 0:
        raise error(f"{what} failed (exit {proc.returncode}):\n"
                    + "\n".join(proc.stdout.splitlines()[-30:]))
    return proc.stdout


def terminate(pids: int | Iterable[int], stages: list[tuple[signal.Signals, float]],
              alive: Callable[[int], bool], log: Callable[[str], None],
              poll: float = 0.05) -> None:
    """Stops one pid or many: each stage sends its signal (the first to every pid, the later
    ones to those still alive) and waits up to its seconds; the log says which pids outlived a
    stage that is not the last."""
    pids = [pids] if isinstance(pids, int) else list(pids)
    for i, (sig, wait) in enumerate(stages):
        for pid in (pids if i == 0 else [p for p in pids if alive(p)]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(poll)
        left = [p for p in pids if alive(p)]
        if not left:
            return
        if i < len(stages) - 1:
            for pid in left:
                log(f"pid {pid} did not stop on {sig.name} within {wait:.0f}s")
