"""End to end: real member processes on free loopback ports, driven through the ``jetwake``
command line as a user would (submit, list, suspend, resume, restart, snapshots, cancel,
SIGTERM and restart with the job resuming), and every error case of the CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from jetwake.engine.server.cli import build_parser, main
from support.cli_member import MemberProc, cli, free_port, ok
from support.waiting import stays_true, wait_until

# a FILE.py with a custom unbounded source (its class travels to the member by value)
COUNTER_PY = '''
"""Sequence numbers, a few every 10 ms, into a map; the position is saved in snapshots."""
import time
from jetwake import BroadcastKey, Pipeline, Processor, ProcessorMetaSupplier, Sinks, Source

SAVE_DELAY = float(__import__("os").environ.get("COUNTER_SAVE_DELAY", "0"))


class Counter(Processor):
    def __init__(self):
        self.n = 0
        self.next_at = 0.0
        self.save_started = None

    def complete(self):
        now = time.monotonic()
        if now < self.next_at or not self.outbox.has_room():
            return False
        self.next_at = now + 0.01
        self.outbox.offer_chunk(-1, [(self.n + i, self.n + i) for i in range(5)])
        self.n += 5
        return False

    def save_to_snapshot(self):
        if self.save_started is None:
            self.save_started = time.monotonic()
        if time.monotonic() - self.save_started < self.delay:
            return False  # a slow snapshot (the second-signal test)
        self.save_started = None
        return self.outbox.offer_to_snapshot(BroadcastKey("pos"), self.n)

    def restore_from_snapshot(self, inbox):
        for _, n in inbox.drain():
            self.n = n


def pipeline(args):
    sink = args[0] if args else "seen"
    delay = float(args[1]) if len(args) > 1 else 0.0

    def make():
        c = Counter()
        c.delay = delay
        return c

    p = Pipeline()
    p.read_from(Source("counter", ProcessorMetaSupplier.of(make, 1), is_stream=True)) \\
     .write_to(Sinks.map(sink))
    return p
'''

COMMANDS = ["member", "submit", "list-jobs", "status", "suspend", "resume", "restart", "cancel",
            "save-snapshot", "list-snapshots", "delete-snapshot", "cluster"]


# --- help (in process) -----------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], *[[c] for c in COMMANDS], ["member", "start"],
                                     ["snapshot"], ["snapshot", "inspect"]])
def test_help_on_every_command_has_an_example(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([*command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out and "jetwake" in out


def test_every_command_is_in_the_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(COMMANDS) <= set(sub.choices)


@pytest.fixture
def counter_py(tmp_path) -> Path:
    path = tmp_path / "counter.py"
    path.write_text(COUNTER_PY)
    return path


# --- the job lifecycle -----------------------------------------------------------------------


@pytest.mark.integration
def test_job_lifecycle_through_the_cli(tmp_path, counter_py):
    member = MemberProc(tmp_path, tmp_path / "data", metrics=True)
    try:
        a = member.address
        out = ok(cli("submit", str(counter_py), "--name", "counter", "--guarantee",
                     "exactly_once", "--snapshot-interval", "200", "--", "seen", address=a))
        assert "counter" in out and "RUNNING" in out

        out = ok(cli("list-jobs", address=a))
        header, row = out.splitlines()[:2]
        assert header.split() == ["ID", "NAME", "STATUS", "SUBMITTED"]
        job_id = row.split()[0]
        assert row.split()[1:3] == ["counter", "RUNNING"]
        jobs = json.loads(ok(cli("list-jobs", "--json", address=a)))
        assert [(j["id"], j["name"], j["status"]) for j in jobs] == [
            (job_id, "counter", "RUNNING")]

        wait_until(lambda: json.loads(ok(cli("status", "counter", "--json", address=a)))
                   ["last_snapshot"] is not None, what="a snapshot")
        doc = json.loads(ok(cli("status", job_id, "--json", address=a)))
        assert doc["id"] == job_id and doc["name"] == "counter" and doc["status"] == "RUNNING"
        assert doc["processing_guarantee"] == "exactly_once"
        assert "Last snapshot" in ok(cli("status", "counter", address=a))

        assert "SUSPENDED" in ok(cli("suspend", "counter", address=a))
        assert json.loads(ok(cli("status", "counter", "--json", address=a)))["status"] == \
            "SUSPENDED"
        r = cli("suspend", "counter", address=a)
        assert r.returncode == 1 and "SUSPENDED" in r.stderr and r.stderr.count("\n") == 1
        assert "RUNNING" in ok(cli("resume", job_id, address=a))
        assert "suspend requested" in ok(cli("suspend", "counter", "--no-wait", address=a))
        wait_until(lambda: json.loads(ok(cli("status", "counter", "--json", address=a)))
                   ["status"] == "SUSPENDED", what="the suspension")
        ok(cli("resume", "counter", "--no-wait", address=a))
        wait_until(lambda: json.loads(ok(cli("status", "counter", "--json", address=a)))
                   ["status"] == "RUNNING", what="the resumption")
        assert "restarted: RUNNING" in ok(cli("restart", "counter", address=a))

        out = ok(cli("save-snapshot", "counter", "snap1", address=a))
        assert "snap1" in out
        snaps = json.loads(ok(cli("list-snapshots", "--json", address=a)))
        assert [(s["name"], s["job_id"]) for s in snaps] == [("snap1", job_id)]
        assert "snap1" in ok(cli("list-snapshots", address=a))

        # a second job starts from the exported snapshot
        ok(cli("submit", str(counter_py), "--name", "second", "--guarantee", "at_least_once",
               "--from-snapshot", "snap1", "--", "seen2", address=a))
        with member.client() as c:
            seen2 = c.get_map("seen2")
            wait_until(lambda: len(seen2) > 0, what="the second job's items")
            assert min(seen2.keys()) > 0
        ok(cli("save-snapshot", "second", "snap2", "--cancel", address=a))
        ok(cli("delete-snapshot", "snap1", address=a))
        snaps = json.loads(ok(cli("list-snapshots", "--json", address=a)))
        assert [s["name"] for s in snaps] == ["snap2"]

        assert "FAILED" in ok(cli("cancel", "counter", address=a))
        assert "No active jobs" in ok(cli("list-jobs", address=a))
        all_jobs = json.loads(ok(cli("list-jobs", "--all", "--json", address=a)))
        assert {j["name"]: j["status"] for j in all_jobs} == {"counter": "FAILED",
                                                                "second": "FAILED"}
        cluster = json.loads(ok(cli("cluster", "--json", address=a)))
        assert cluster["members"][0]["address"] == a and cluster["version"]
        assert a in ok(cli("cluster", address=a))

        # exactly-once through suspend/resume/restart: every sequence number once, no gap
        with member.client() as c:
            keys = sorted(c.get_map("seen").keys())
        assert keys == list(range(len(keys))) and len(keys) > 10

        base = f"http://127.0.0.1:{member.metrics_port}"
        assert urllib.request.urlopen(base + "/health", timeout=5).status == 200
        metrics = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert 'jetwake_snapshot_size_bytes{job="counter"' in metrics

        assert member.stop() == 0
        log = member.log
        for line in ("submitted", "snapshot 0 taken in", "suspended", "restarting",
                     "snapshot exported as 'snap1'", "cancelled", "restored from snapshot"):
            assert line in log, line
        # every file was written whole: no temporary file of an atomic write is left
        assert sorted((tmp_path / "data").rglob("*.tmp")) == []
    finally:
        member.kill()


@pytest.mark.integration
def test_sigterm_suspends_and_the_next_start_resumes(tmp_path, counter_py):
    data = tmp_path / "data"
    member = MemberProc(tmp_path, data)
    try:
        ok(cli("submit", str(counter_py), "--name", "durable", "--guarantee", "exactly_once",
               "--snapshot-interval", "5000", address=member.address))
        with member.client() as c:
            wait_until(lambda: len(c.get_map("seen")) >= 20, what="items")
        assert member.stop(signal.SIGTERM) == 0
        log = member.log
        assert "suspended" in log and "member stopped" in log
    finally:
        member.kill()

    member = MemberProc(tmp_path, data)
    try:
        assert "was RUNNING when the member stopped: resuming it" in member.log
        jobs = json.loads(ok(cli("list-jobs", "--json", address=member.address)))
        assert [(j["name"], j["status"]) for j in jobs] == [("durable", "RUNNING")]
        with member.client() as c:
            seen = c.get_map("seen")
            n = len(seen)
            wait_until(lambda: len(seen) > n + 10, what="the resumed job's items")
            keys = sorted(seen.keys())
        assert keys == list(range(len(keys)))  # nothing lost, nothing twice
        assert member.stop(signal.SIGINT) == 0
    finally:
        member.kill()


@pytest.mark.integration
def test_a_second_signal_forces_the_exit(tmp_path, counter_py):
    member = MemberProc(tmp_path, tmp_path / "data")
    try:
        # the job's terminal snapshot takes 60 s: the graceful shutdown hangs in it
        ok(cli("submit", str(counter_py), "--name", "slow", "--guarantee", "exactly_once",
               "--snapshot-interval", "600000", "--", "seen", "60", address=member.address))
        member.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "shutting down gracefully" in member.log, what="the first signal")
        stays_true(lambda: member.proc.poll() is None, seconds=0.3,
                   what="the member running after the first signal")
        t0 = time.monotonic()
        member.proc.send_signal(signal.SIGTERM)
        assert member.proc.wait(10) != 0
        assert time.monotonic() - t0 < 5
        assert "exiting now" in member.log
    finally:
        member.kill()


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.integration
def test_error_cases(tmp_path, counter_py):
    member = MemberProc(tmp_path, None)
    a = member.address
    try:
        def err(r, code: int = 1) -> str:
            assert r.returncode == code, f"exit {r.returncode}: {r.stdout} {r.stderr}"
            assert r.stderr.strip().splitlines()[-1].startswith("jetwake: error: ")
            return r.stderr

        # a second member on the same port: one clear line, exit code 1
        r = subprocess.run([sys.executable, "-m", "jetwake.engine.server.cli", "member", "start",
                            "--port", str(member.port)], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{member.port}" in r.stderr
        # member not reachable: the address tried is in the message
        dead = f"127.0.0.1:{free_port()}"
        assert dead in err(cli("list-jobs", address=dead), 3)
        assert dead in err(cli("--address", dead, "cluster"), 3)
        # wrong or missing token
        assert "wrong token" in err(cli("list-jobs", address=a, token="bad"), 4)
        assert "requires a token" in err(cli("list-jobs", address=a, token=None), 4)
        assert "wrong token" in err(cli("--token", "bad", "list-jobs", "--address", a,
                                        token=None), 4)
        # unknown job or snapshot
        for cmd in (["status", "nope"], ["suspend", "nope"], ["resume", "nope"],
                    ["restart", "nope"], ["cancel", "nope"],
                    ["save-snapshot", "nope", "s"]):
            assert "no job with name or id 'nope'" in err(cli(*cmd, address=a))
        assert "no exported snapshot named 'nope'" in err(cli("delete-snapshot", "nope",
                                                              address=a))
        # FILE.py problems
        assert "no such file" in err(cli("submit", str(tmp_path / "missing.py"), address=a))
        nop = tmp_path / "nop.py"
        nop.write_text("x = 1\n")
        assert "does not define `pipeline`" in err(cli("submit", str(nop), address=a))
        bad = tmp_path / "bad.py"
        bad.write_text(textwrap.dedent("""\
            from jetwake import Pipeline

            def helper():
                raise RuntimeError("broken on purpose")

            pipeline = helper()
            """))
        e = err(cli("submit", str(bad), address=a))
        assert "Traceback" in e and 'bad.py", line 4, in helper' in e
        assert "RuntimeError" in e and "broken on purpose" in e
        bad2 = tmp_path / "bad2.py"
        bad2.write_text("def pipeline(args):\n    return int(args[0])\n")
        e = err(cli("submit", str(bad2), "--", "x", address=a))
        assert "ValueError" in e and "Traceback" in e
        # bad arguments, and a snapshot that does not exist
        r = cli("submit", str(counter_py), "--guarantee", "twice", address=a)
        assert r.returncode == 2 and "invalid choice: 'twice'" in r.stderr
        assert "no exported snapshot named 'ghost'" in err(cli(
            "submit", str(counter_py), "--from-snapshot", "ghost", address=a))
        # a guarantee-less job cannot export a snapshot; a running job cannot be resumed
        ok(cli("submit", str(counter_py), "--name", "plain", address=a))
        assert "takes no snapshots" in err(cli("save-snapshot", "plain", "s", address=a))
        assert "not SUSPENDED" in err(cli("resume", "plain", address=a))
        assert "FAILED" in ok(cli("cancel", "plain", address=a))
        assert "already FAILED" in err(cli("cancel", "plain", address=a))
    finally:
        member.kill()
