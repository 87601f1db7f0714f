"""What the dashboard tests share: HTTP calls that keep the status of an error, a streaming job
file for `jetwake submit`, and a `jetwake member start` process with the dashboard on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jetwake import Client
from support.ports import free_port
from support.process_stop import stop_gracefully
from support.waiting import wait_until

TOKEN = "dashboard-token"

#: a windowed stream: 200 items a second, one in ten five seconds late (counted as late
#: events by the window), counts per key and half second into a list
STREAM_JOB_PY = '''
"""A windowed stream for the dashboard tests."""
from jetwake import AggregateOperations, Pipeline, Sinks, TestSources, WindowDefinition


def late_every_tenth(timestamp, sequence):
    return (timestamp - 5000 if sequence % 10 == 0 else timestamp, sequence)


pipeline = Pipeline()
(pipeline.read_from(TestSources.item_stream(200, late_every_tenth))
    .with_timestamps(lambda e: e[0], 100)
    .map(lambda e: (e[1] % 4, e))
    .window(WindowDefinition.tumbling(500))
    .aggregate(AggregateOperations.counting())
    .write_to(Sinks.list("counts")))
'''


@dataclass
class Reply:
    status: int
    body: bytes
    headers: Any

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


class Http:
    """Calls to one dashboard; an error status is a reply like any other."""

    def __init__(self, base: str) -> None:
        self.base = base

    def call(self, method: str, path: str, token: str | None = None, body: Any = None,
             headers: dict[str, str] | None = None, raw: bytes | None = None) -> Reply:
        data = raw if raw is not None else (json.dumps(body).encode()
                                            if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("X-Jetwake-Token", token)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return Reply(r.status, r.read(), r.headers)
        except urllib.error.HTTPError as e:
            return Reply(e.code, e.read(), e.headers)

    def get(self, path: str, **kw: Any) -> Reply:
        return self.call("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Reply:
        return self.call("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> Reply:
        return self.call("DELETE", path, **kw)


class DashboardMember:
    """A ``jetwake member start --metrics-port M --token T`` process; its log in a file."""

    def __init__(self, tmp: Path, *extra: str, token: str = TOKEN) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.token = token
        self.log_path = tmp / f"member-{self.port}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jetwake.engine.server.cli", "member", "start",
             "--port", str(self.port), "--metrics-port", str(self.metrics_port),
             "--token", token, "--cooperative-threads", "1", "--local-parallelism", "1",
             *extra], stdout=self._log, stderr=subprocess.STDOUT)
        self.http = Http(f"http://127.0.0.1:{self.metrics_port}")

        def started() -> bool:
            assert self.proc.poll() is None, f"the member exited:\n{self.log}"
            try:
                Client(self.address, token=token).close()
                return self.http.get("/health").status == 200
            except Exception:  # noqa: BLE001 - not listening yet
                return False
        wait_until(started, timeout=30, interval=0.05,
                   what=lambda: f"the member to start:\n{self.log}")

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def cli(self, *args: str, timeout: float = 60.0,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JETWAKE_")}
        env.update(JETWAKE_ADDRESS=self.address, JETWAKE_TOKEN=self.token)
        return subprocess.run([sys.executable, "-m", "jetwake.engine.server.cli", *args],
                              capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=cwd)

    def submit_stream(self, tmp: Path, name: str) -> dict:
        """Submits the windowed stream as job ``name`` (at-least-once, snapshots every 500
        ms) and returns its info."""
        path = tmp / "stream_job.py"
        path.write_text(STREAM_JOB_PY)
        r = self.cli("submit", str(path), "--name", name, "--guarantee", "at_least_once",
                     "--snapshot-interval", "500", "--json")
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
        return json.loads(r.stdout)

    def status(self, job: str) -> str:
        r = self.cli("status", job, "--json")
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
        return json.loads(r.stdout)["status"]

    def stop(self) -> None:
        stop_gracefully(self.proc)
        self._log.close()
