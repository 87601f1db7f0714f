"""One data directory, one member: a second member on it fails at once and says who holds it
and what to do; the lock goes with its holder, also when the holder is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from jetwake import Member
from jetwake.engine.core.errors import DataDirectoryLockedError
from support.waiting import wait_until

MEMBER_PROCESS = os.path.join(os.path.dirname(__file__), "support", "member_process.py")

# opens a member on argv[1]; exit 3 and the message when the directory is taken
SECOND_MEMBER = """
import sys
from jetwake import Member
from jetwake.engine.core.errors import DataDirectoryLockedError
try:
    m = Member(sys.argv[1])
except DataDirectoryLockedError as e:
    print(e)
    sys.exit(3)
print("started", len(m.jobs()))
m.shutdown()
"""


def second_member(data_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SECOND_MEMBER, data_dir], capture_output=True,
                          text=True, timeout=60)


def lock_holder(data_dir: str) -> dict | None:
    try:
        with open(os.path.join(data_dir, "member.lock")) as f:
            return json.loads(f.read() or "null")
    except (OSError, ValueError):
        return None


def test_a_second_member_in_the_same_process_fails_naming_the_holder_and_the_fix(tmp_path):
    with Member(tmp_path) as first:
        first.get_map("m").put("a", 1)
        with pytest.raises(DataDirectoryLockedError) as err:
            Member(tmp_path)
    message = str(err.value)
    assert str(tmp_path) in message
    assert f"pid {os.getpid()}" in message and socket.gethostname() in message
    assert "started" in message
    assert "shutdown()" in message, "the message says how to fix it"


def test_the_lock_is_released_at_shutdown(tmp_path):
    with Member(tmp_path) as m:
        m.get_map("m").put("a", 1)
    with Member(tmp_path) as m:
        assert m.get_map("m").get("a") == 1


def test_a_member_that_fails_to_start_releases_the_lock(tmp_path):
    with Member(tmp_path):
        pass
    damaged = tmp_path / "jobs" / "0000-0000-0000-0001"
    damaged.mkdir(parents=True)
    (damaged / "RECORD").write_text("{not json")
    with pytest.raises(Exception, match="is damaged"):
        Member(tmp_path)
    (damaged / "RECORD").unlink()
    with Member(tmp_path) as m:  # not locked by the member that failed to start
        assert m.jobs() == []


@pytest.mark.integration
def test_a_member_in_another_process_fails_while_this_one_holds_the_directory(tmp_path):
    with Member(tmp_path):
        result = second_member(str(tmp_path))
        assert result.returncode == 3, result.stdout + result.stderr
        assert f"pid {os.getpid()}" in result.stdout
        assert "stop that member first" in result.stdout
    result = second_member(str(tmp_path))
    assert result.returncode == 0 and "started" in result.stdout, result.stdout + result.stderr


@pytest.mark.integration
@pytest.mark.faults
def test_a_sigkilled_member_leaves_no_stale_lock(tmp_path):
    data_dir = str(tmp_path / "member")
    proc = subprocess.Popen([sys.executable, MEMBER_PROCESS, data_dir, "200", "exactly_once"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        holder = wait_until(lambda: (lock_holder(data_dir) or {}).get("pid") == proc.pid
                            and lock_holder(data_dir), what="the member process to lock")
        assert holder["host"] == socket.gethostname()
        with pytest.raises(DataDirectoryLockedError, match=f"pid {proc.pid} "):
            Member(data_dir)
        result = second_member(data_dir)
        assert result.returncode == 3 and f"pid {proc.pid} " in result.stdout
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert lock_holder(data_dir)["pid"] == proc.pid, "the file stays; only the lock is gone"
    with Member(data_dir) as m:  # the OS released the killed process's lock
        assert lock_holder(data_dir)["pid"] == os.getpid()
        assert m.get_job("sums") is not None
    result = second_member(data_dir)
    assert result.returncode == 0, result.stdout + result.stderr
