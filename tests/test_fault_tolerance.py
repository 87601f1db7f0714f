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

from support.restores import restored_snapshots, wait_for_a_new_snapshot
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
            # a random moment after the job has a snapshot: a kill before the first one would
            # leave nothing to restore
            wait_for_a_new_snapshot(data_dir)
            time.sleep(rnd.uniform(0.0, 1.0))  # the moment of the kill, not a wait
        finally:
            kill(proc)
    # each restart but the first restored the job from a snapshot of the run before it
    assert len(restored_snapshots(data_dir)) >= 3, restored_snapshots(data_dir)
    assert_exact(final_result(data_dir))
    assert len(restored_snapshots(data_dir)) >= 4, restored_snapshots(data_dir)


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
    # the crash point is past the first snapshot: the restarted job went on from a snapshot
    assert restored_snapshots(data_dir), "the restarted job was not restored from a snapshot"


def test_job_resumes_by_itself_when_the_member_restarts(tmp_path):
    data_dir = str(tmp_path / "member")
    proc = start(data_dir)
    try:
        wait_for_a_new_snapshot(data_dir)
    finally:
        kill(proc)
    result = final_result(data_dir)  # the check run submits nothing: the job record resumes
    assert_exact(result)
    assert restored_snapshots(data_dir), "the resumed job was not restored from its snapshot"


def execution_dirs(data_dir: str) -> set[str]:
    """The RocksDB working state directories of executions (state/<job id>/<execution>)."""
    return set(glob.glob(os.path.join(data_dir, "state", "*", "*")))


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
    assert restored_snapshots(data_dir), "the job was not restored from a snapshot"
    assert execution_dirs(data_dir) == set(), "a clean shutdown leaves no working state"
