"""Real member processes forming a cluster through the test broker, for the cluster tests.

``ClusterProcesses`` starts ``jetwake member start --cluster NAME --kafka ...`` processes on
free loopback ports, each with its own data directory and log file, waits until the cluster
shows them, runs CLI commands against any of them, and kills every process it started at the
end, whatever the test did (a test that checks a graceful stop stops its member itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from jetwake import Client
from jetwake.engine.server.cli.output import job_json
from support.ports import free_port
from support.process_stop import stop_gracefully
from support.waiting import wait_until

TOKEN = "cluster-test-token"


class ClusterMemberProcess:
    """One ``jetwake member start --cluster`` process; its log goes to a file."""

    def __init__(self, root: Path, index: int, cluster: str, bootstrap: str, token: str,
                 extra: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 log_name: str | None = None) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.data_dir = root / f"member-{index}"
        self.log_path = root / (log_name or f"member-{index}.log")
        self.token = token
        cmd = [sys.executable, "-m", "jetwake.engine.server.cli", "member", "start",
               "--cluster", cluster, "--kafka", bootstrap, "--data-dir", str(self.data_dir),
               "--port", str(self.port), "--token", token, "--cooperative-threads", "1",
               "--local-parallelism", "1", "--scale-up-delay", "1000", *extra]
        self._log = open(self.log_path, "w")
        base = {k: v for k, v in os.environ.items() if not k.startswith("JETWAKE_")}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**base, **(env or {})})

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> bool:
        if not self.alive():
            raise AssertionError(f"member exited with {self.proc.returncode}:\n{self.log}")
        try:
            Client(self.address, token=self.token).close()
            return True
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    def client(self) -> Client:
        return Client(self.address, token=self.token)

    def stop(self, timeout: float = 30.0) -> int:
        """A graceful stop (SIGTERM; SIGKILL after ``timeout`` s); returns the exit code."""
        return stop_gracefully(self.proc, timeout)

    def kill(self) -> None:
        """SIGKILL (if it still runs), and waits until the process is gone."""
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


class ClusterProcesses:
    """Member processes of one fresh cluster (see the module doc)."""

    def __init__(self, root: Path, bootstrap: str, token: str = TOKEN) -> None:
        self.root = root
        self.bootstrap = bootstrap
        self.token = token
        self.name = f"c{uuid.uuid4().hex[:10]}"
        self.members: list[ClusterMemberProcess] = []

    def start(self, count: int, *extra: str, timeout: float = 60.0
              ) -> list[ClusterMemberProcess]:
        """Starts ``count`` members (``extra``: more ``member start`` options) and waits
        until the cluster lists all of them."""
        new = [self.start_member(*extra) for _ in range(count)]
        wait_until(lambda: all(m.ready() for m in new), what="every member serving clients",
                   timeout=timeout)
        expected = len([m for m in self.members if m.alive()])
        wait_until(lambda: len(self.cluster(new[0])["members"]) == expected,
                   what=f"the cluster showing {expected} members", timeout=timeout, interval=0.2)
        return new

    def start_member(self, *extra: str, token: str | None = None, cluster: str | None = None,
                     env: dict[str, str] | None = None) -> ClusterMemberProcess:
        m = ClusterMemberProcess(self.root, len(self.members), cluster or self.name,
                                 self.bootstrap, token or self.token, extra, env)
        self.members.append(m)
        return m

    def revive(self, dead: ClusterMemberProcess, *extra: str) -> ClusterMemberProcess:
        """Starts a member again on the data directory of ``dead`` (which has exited)."""
        assert not dead.alive(), "revive() is for a member whose process has ended"
        index = self.members.index(dead)
        m = ClusterMemberProcess(self.root, index, self.name, self.bootstrap, self.token,
                                 extra, log_name=f"member-{index}-again-{len(self.members)}.log")
        self.members.append(m)
        return m

    def cluster(self, member: ClusterMemberProcess) -> dict:
        with member.client() as c:
            return c.cluster()

    def coordinator(self, via: ClusterMemberProcess | None = None
                    ) -> ClusterMemberProcess | None:
        """The coordinator as member ``via`` (default: the first live one) sees it; None
        while there is none, or it does not answer."""
        via = via or next(m for m in self.members if m.alive())
        info = self.cluster(via)
        by_address = {m.address: m for m in self.members}
        found = [i for i in info["members"] if i["coordinator"]]
        if not found or found[0].get("state") != "ACTIVE":
            return None
        return by_address.get(found[0]["address"])

    def status(self, member: ClusterMemberProcess, job: str) -> dict:
        """What ``jetwake status JOB --json`` on ``member`` shows of a job (without its
        metrics), asked through a client in this process: the polls of a test's waits, where
        a CLI process per poll would spend a second of a loaded machine's CPU on imports.
        The CLI's own tests run the command itself."""
        with member.client() as c:
            return job_json(c.job(job).refresh())

    def cli(self, member: ClusterMemberProcess, *args: str, timeout: float = 120.0,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JETWAKE_")}
        env["JETWAKE_ADDRESS"] = member.address
        env["JETWAKE_TOKEN"] = member.token
        return subprocess.run([sys.executable, "-m", "jetwake.engine.server.cli", *args],
                              capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)

    def cli_json(self, member: ClusterMemberProcess, *args: str) -> object:
        r = self.cli(member, *args, "--json")
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        return json.loads(r.stdout)

    def stop_all(self) -> None:
        """Kills every member process (SIGKILL): the test is over, and a graceful stop of
        all members at once made each hand its jobs over to the others, themselves stopping
        (up to seconds per test). The cluster's name, topics and data directories are the
        test's own, so nothing it leaves behind reaches another test."""
        for m in self.members:
            if m.alive():
                m.proc.kill()
        for m in self.members:
            m.kill()


@pytest.fixture(scope="session")
def three(tmp_path_factory, kafka_bootstrap: str):
    """One three-member cluster shared by every test that only submits jobs to it (never
    kills, stops or adds a member), started by the first that asks for it and stopped at the
    end of the session: a start costs about 5 s, an idle member a fraction of a percent of a
    core. Its tests give their jobs, maps and lists names of their own and cancel what they
    leave running. tests/conftest.py loads this module as a plugin, so every module shares
    the one instance (a module that imported the fixture would get a cluster of its own)."""
    c = ClusterProcesses(tmp_path_factory.mktemp("three"), kafka_bootstrap)
    try:
        # the first alone, then the other two: the oldest member coordinates from the start,
        # with no election among members starting at once (that race is the start tests'
        # subject; here a loaded machine once left two members coordinating, and every test
        # of the session's cluster would fail on it)
        c.start(1)
        c.start(2)
        yield c
    finally:
        c.stop_all()
