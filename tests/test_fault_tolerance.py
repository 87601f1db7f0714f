"""Exactly-once through real process crashes: a member process is SIGKILLed at varied points
and restarted on its data directory; the keyed state must count every event exactly once."""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]

SCRIPT = os.path.join(os.path.dirname(__file__), "support", "member_process.py")
EVENTS = 6000


def start(data_dir: str, *, crash_at: str | None = None, check: bool = False,
          guarantee: str = "exactly_once", rocksdb: bool = False) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("JETWAKE_CRASH_AT", None)
    if crash_at:
        env["JETWAKE_CRASH_AT"] = crash_at
    args = [sys.executable, SCRIPT, data_dir, str(EVENTS), guarantee]
    if check:
        args.append("check")
    if rocksdb:
        args.append("rocksdb")
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def final_result(data_dir: str, rocksdb: bool = False) -> dict:
    proc = start(data_dir, check=True, rocksdb=rocksdb)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        kill(proc)
    assert proc.returncode == 0, err.decode()[-3000:]
    with open(os.path.join(data_dir, "result.json")) as f:
        return json.load(f)


def assert_exact(result: dict) -> None:
    got, want = result["got"], result["want"]
    assert sum(c for _, c in got.values()) == EVENTS, "events lost or counted twice"
    assert got == want


def test_sigkill_at_random_moments_keeps_state_exact(tmp_path):
    rnd = random.Random(20261121)
    data_dir = str(tmp_path / "member")
    for _ in range(4):
        proc = start(data_dir)
        try:
            time.sleep(rnd.uniform(0.8, 2.0))
        finally:
            kill(proc)
    assert_exact(final_result(data_dir))


@pytest.mark.parametrize("crash_at", ["snapshot-phase1:3", "after-commit-record:2",
                                      "after-phase2:4"])
def test_crash_at_a_point_of_the_snapshot_protocol_keeps_state_exact(tmp_path, crash_at):
    data_dir = str(tmp_path / "member")
    proc = start(data_dir, crash_at=crash_at)
    try:
        proc.wait(30)  # the crash point kills it
    finally:
        kill(proc)
    assert proc.returncode == -signal.SIGKILL, "the process did not reach the crash point"
    assert_exact(final_result(data_dir))


def test_job_resumes_by_itself_when_the_member_restarts(tmp_path):
    data_dir = str(tmp_path / "member")
    proc = start(data_dir)
    try:
        time.sleep(1.5)
    finally:
        kill(proc)
    result = final_result(data_dir)  # the check run submits nothing: the job record resumes
    assert_exact(result)


def execution_dirs(data_dir: str) -> set[str]:
    """The RocksDB working state directories of executions (state/<job id>/execution-*)."""
    return set(glob.glob(os.path.join(data_dir, "state", "*", "execution-*")))


def test_rocksdb_state_left_by_a_killed_member_is_removed_at_the_next_start(tmp_path):
    data_dir = str(tmp_path / "member")
    committed = os.path.join(data_dir, "jobs", "*", "snapshots", "*", "COMMIT")
    proc = start(data_dir, rocksdb=True)
    try:
        wait_until(lambda: glob.glob(committed) and execution_dirs(data_dir),
                   what="a snapshot and the job's RocksDB state", timeout=60)
    finally:
        kill(proc)
    leftovers = execution_dirs(data_dir)
    assert leftovers, "SIGKILL left the execution's state behind"

    proc = start(data_dir, rocksdb=True)
    try:
        wait_until(lambda: execution_dirs(data_dir) - leftovers,
                   what="the resumed execution's state", timeout=60)
        assert not execution_dirs(data_dir) & leftovers, "the crashed execution's state is gone"
    finally:
        kill(proc)

    assert_exact(final_result(data_dir, rocksdb=True))  # restored from snapshots, not leftovers
    assert execution_dirs(data_dir) == set(), "a clean shutdown leaves no working state"
