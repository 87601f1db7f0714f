"""Member processes of a fresh cluster for ``python -m bench cluster``.

:class:`BenchCluster` starts ``jetwake member start --cluster NAME --kafka ...`` processes on
free loopback ports, each with a fresh data directory and a log file under one temporary
directory, waits until the cluster lists every one of them, and stops them all at the end
(SIGTERM, then SIGKILL after a grace period) and removes the directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-cluster-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MemberProcess:
    """One member process; its output goes to ``log_path``."""

    def __init__(self, root: Path, index: int, cluster: str, bootstrap: str,
                 extra: list[str]) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.data_dir = root / f"member-{index}"
        self.log_path = root / f"member-{index}.log"
        cmd = [sys.executable, "-m", "jetwake.engine.server.cli", "member", "start",
               "--cluster", cluster, "--kafka", bootstrap, "--data-dir", str(self.data_dir),
               "--port", str(self.port), "--token", TOKEN, "--log-level", "WARNING", *extra]
        env = {k: v for k, v in os.environ.items() if not k.startswith("JETWAKE_")}
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def client(self) -> Any:
        from jetwake import Client
        return Client(self.address, token=TOKEN)

    def serving(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"member {self.address} exited with {self.proc.returncode}: "
                               f"{self.tail()}")
        try:
            self.client().close()
            return True
        except Exception:  # noqa: BLE001 - not listening yet
            return False


class BenchCluster:
    """``size`` member processes of a new cluster (a context manager)."""

    def __init__(self, bootstrap: str, size: int, member_args: list[str]) -> None:
        if size < 1:
            raise ValueError(f"BenchCluster: size must be at least 1, got {size}")
        self.bootstrap = bootstrap
        self.size = size
        self.member_args = member_args
        self.name = f"bench{uuid.uuid4().hex[:10]}"
        self.root = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
        self.members: list[MemberProcess] = []

    def __enter__(self) -> "BenchCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 90.0) -> None:
        self.members = [MemberProcess(self.root, i, self.name, self.bootstrap, self.member_args)
                        for i in range(self.size)]
        deadline = time.monotonic() + timeout
        while not all(m.serving() for m in self.members):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the members did not serve clients in {timeout:.0f} s")
            time.sleep(0.1)
        while True:
            with self.members[0].client() as c:
                listed = len(c.cluster()["members"])
            if listed == self.size:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster showed {listed} of {self.size} members after "
                                   f"{timeout:.0f} s")
            time.sleep(0.2)

    def client(self) -> Any:
        return self.members[0].client()

    def pids(self) -> list[int]:
        return [m.pid for m in self.members]

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM to every member, SIGKILL to those still running after ``grace`` s."""
        for m in self.members:
            if m.proc.poll() is None:
                try:
                    os.killpg(m.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for m in self.members:
            try:
                m.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(m.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                m.proc.wait(10)
            m._log.close()
        shutil.rmtree(self.root, ignore_errors=True)
