"""A job that cannot start: the waiting command and the Python client report the member's real
reason (a missing Kafka topic, a broker that does not answer) as soon as the member knows it,
whatever their request timeout, and a terminal shows a progress line meanwhile. Real member
processes and a real Kafka broker (``KAFKA_BOOTSTRAP_SERVERS``)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from jetwake import Client, Member, Pipeline, Sinks, Sources
from jetwake.connectors.kafka.properties import SINK_OPTIONS, SOURCE_OPTIONS
from jetwake.engine.server.cli import build_parser
from jetwake.engine.server.client import RemoteError
from jetwake.engine.server.member_service import MemberService
from support.cli_member import TOKEN, MemberProc, cli, free_port
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

# the connector's start-up timeout in these jobs: the member knows the real cause after it
START_UP_MS = 3000

KAFKA_JOB_PY = '''
from jetwake import Pipeline, Sinks, Sources

def pipeline(args):
    servers, topic, startup_ms = args
    p = Pipeline()
    p.read_from(Sources.kafka(topic, {"bootstrap.servers": servers,
                                      "jetwake.startup.timeout.ms": int(startup_ms)})) \\
     .write_to(Sinks.logger())
    return p
'''


@pytest.fixture
def kafka_job_py(tmp_path) -> Path:
    path = tmp_path / "kafka_job.py"
    path.write_text(KAFKA_JOB_PY)
    return path


@pytest.fixture
def member(tmp_path):
    m = MemberProc(tmp_path, None)
    try:
        yield m
    finally:
        m.kill()


def missing_topic() -> str:
    return f"jetwake-missing-{uuid.uuid4().hex[:10]}"


def job_statuses(address: str) -> dict[str, dict]:
    r = cli("list-jobs", "--all", "--json", address=address)
    assert r.returncode == 0, r.stderr
    return {j["name"]: j for j in json.loads(r.stdout)}


def run_on_a_terminal(*args: str, timeout: float = 60.0) -> tuple[int, str, str]:
    """Runs ``jetwake ARGS`` with stderr on a pseudo-terminal (as in an interactive shell);
    returns (exit code, stdout, everything written to the terminal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JETWAKE_")}
    env["JETWAKE_TOKEN"] = TOKEN
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "jetwake.engine.server.cli", *args],
                            stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            env=env)
    os.close(slave)
    terminal = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 4096)
                except OSError:  # the command exited and closed the terminal
                    break
                if not data:
                    break
                terminal += data
            elif proc.poll() is not None:
                break
        code = proc.wait(max(1.0, deadline - time.monotonic()))
        return code, proc.stdout.read().decode(), terminal.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


# --- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize("cause", ["missing topic", "broker down"])
def test_submit_reports_why_the_job_did_not_start_as_soon_as_the_member_knows(
        member, kafka_job_py, kafka_bootstrap, cause):
    topic = missing_topic()
    servers = kafka_bootstrap if cause == "missing topic" else f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    r = cli("submit", str(kafka_job_py), "--name", "reader", "--", servers, topic,
            str(START_UP_MS), address=member.address)
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, (r.stdout, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("jetwake: error: job 'reader' (") and "failed to start" in last
    assert "KafkaSourceError" in last
    if cause == "missing topic":
        assert f"topic(s) ['{topic}'] do not exist" in last
    else:
        assert f"brokers at {servers} did not answer" in last
    assert "no answer from the member" not in r.stderr
    assert elapsed < START_UP_MS / 1000 + 10, f"took {elapsed:.1f} s"
    job = job_statuses(member.address)["reader"]
    assert job["status"] == "FAILED" and "KafkaSourceError" in job["failure"]


def test_a_submit_that_outlasts_its_timeout_says_the_job_is_still_starting(
        member, kafka_job_py, kafka_bootstrap):
    topic = missing_topic()
    t0 = time.monotonic()
    r = cli("submit", str(kafka_job_py), "--name", "slow-start", "--timeout", "1", "--",
            kafka_bootstrap, topic, "5000", address=member.address)
    assert time.monotonic() - t0 < 10
    assert r.returncode == 1, (r.stdout, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert "timed out after 1 s waiting for job 'slow-start'" in last
    assert "still STARTING" in last and "`jetwake status slow-start`" in last
    assert "no answer from the member" not in r.stderr
    # the member carries on and records the real cause, where the message said to look
    wait_until(lambda: job_statuses(member.address)["slow-start"]["status"] == "FAILED",
               timeout=30, interval=0.2, what="the job's start to end in FAILED")
    out = cli("status", "slow-start", address=member.address).stdout
    assert f"topic(s) ['{topic}'] do not exist" in out


def test_submit_shows_a_progress_line_on_a_terminal_while_the_job_starts(
        member, kafka_job_py, kafka_bootstrap):
    topic = missing_topic()
    code, out, terminal = run_on_a_terminal(
        "--address", member.address, "submit", str(kafka_job_py), "--name", "watched", "--",
        kafka_bootstrap, topic, str(START_UP_MS))
    assert code == 1 and out == ""
    assert "\rStarting job 'watched' (job is STARTING)... " in terminal
    # the line is erased before the result, which names the cause
    progress, _, result = terminal.rpartition("\r\x1b[K")
    assert progress and result.startswith("jetwake: error: job 'watched'")
    assert f"topic(s) ['{topic}'] do not exist" in result


def test_submit_waits_longer_than_the_kafka_start_up_timeout_by_default():
    # equal timeouts made the command give up just before the member knew why
    args = build_parser().parse_args(["submit", "job.py"])
    kafka_start_up_s = max(SOURCE_OPTIONS["jetwake.startup.timeout.ms"],
                           SINK_OPTIONS["jetwake.startup.timeout.ms"]) / 1000
    assert args.timeout >= kafka_start_up_s + 30


# --- the Python client -----------------------------------------------------------------------


def test_the_client_raises_the_start_failure_even_past_its_request_timeout(kafka_bootstrap):
    topic = missing_topic()
    p = Pipeline()
    p.read_from(Sources.kafka(topic, {"bootstrap.servers": kafka_bootstrap,
                                      "jetwake.startup.timeout.ms": START_UP_MS})) \
     .write_to(Sinks.logger())
    member = Member()
    service = MemberService(member, "127.0.0.1", 0).start()
    try:
        with Client(service.address_text, request_timeout=1.0) as client:
            t0 = time.monotonic()
            with pytest.raises(RemoteError) as e:
                client.new_job(p)
            assert START_UP_MS / 1000 <= time.monotonic() - t0 < START_UP_MS / 1000 + 10
            assert e.value.remote_type == "KafkaSourceError"
            assert f"topic(s) ['{topic}'] do not exist" in str(e.value)
            [job] = client.jobs()
            assert job.status.value == "FAILED" and topic in job.failure
    finally:
        service.stop()
        member.shutdown(graceful=False)


def test_submit_job_returns_while_the_member_starts_the_job(kafka_bootstrap):
    topic = missing_topic()
    p = Pipeline()
    p.read_from(Sources.kafka(topic, {"bootstrap.servers": kafka_bootstrap,
                                      "jetwake.startup.timeout.ms": START_UP_MS})) \
     .write_to(Sinks.logger())
    member = Member()
    service = MemberService(member, "127.0.0.1", 0).start()
    try:
        with Client(service.address_text) as client:
            t0 = time.monotonic()
            job = client.submit_job(p)
            assert time.monotonic() - t0 < START_UP_MS / 1000
            assert job.status.value in ("NOT_RUNNING", "STARTING")
            seen: list[str] = []
            info = job.wait_started(30, lambda i, elapsed: seen.append(i["status"]))
            assert "STARTING" in seen
            assert info["start"]["done"] and info["start"]["error"][0] == "KafkaSourceError"
            assert info["status"] == "FAILED" and topic in info["failure"]
    finally:
        service.stop()
        member.shutdown(graceful=False)

