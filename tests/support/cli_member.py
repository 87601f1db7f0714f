"""A ``jetwake member start`` process and ``jetwake`` commands run against it, as a user runs
them: what the CLI tests share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from jetwake import Client
from support.ports import free_port
from support.waiting import wait_until

TOKEN = "tok-123"


class MemberProc:
    """A ``jetwake member start`` process; its log goes to a file."""

    def __init__(self, tmp: Path, data_dir: Path | None, token: str | None = TOKEN,
                 metrics: bool = False, env: dict | None = None) -> None:
        self.port = free_port()
        self.metrics_port = free_port() if metrics else None
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = tmp / f"member-{self.port}.log"
        cmd = [sys.executable, "-m", "jetwake.engine.server.cli", "member", "start",
               "--port", str(self.port), "--cooperative-threads", "1",
               "--local-parallelism", "1"]
        if data_dir is not None:
            cmd += ["--data-dir", str(data_dir)]
        if token:
            cmd += ["--token", token]
        if self.metrics_port:
            cmd += ["--metrics-port", str(self.metrics_port)]
        self.token = token
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        self._wait_ready()

    def _wait_ready(self, timeout: float = 20.0) -> None:
        """Returns once the member takes a client's connection; fails with its log when the
        process exits or the time runs out first."""
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"member exited with {self.proc.returncode}:\n{self.log}")
            try:
                Client(self.address, token=self.token).close()
                return True
            except Exception:  # noqa: BLE001 - not listening yet
                return False
        wait_until(ready, timeout=timeout, interval=0.05,
                   what=lambda: f"the member to take a client's connection:\n{self.log}")

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def client(self) -> Client:
        return Client(self.address, token=self.token)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


def cli(*args: str, address: str | None = None, token: str | None = TOKEN,
        timeout: float = 60.0, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs ``jetwake ARGS`` in a process of its own, the member's address and token given as
    a user gives them (JETWAKE_ADDRESS, JETWAKE_TOKEN), and no other JETWAKE_ variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JETWAKE_")}
    if address:
        env["JETWAKE_ADDRESS"] = address
    if token:
        env["JETWAKE_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "jetwake.engine.server.cli", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def ok(r: subprocess.CompletedProcess) -> str:
    """The output of a command that must succeed."""
    assert r.returncode == 0, f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r.stdout

