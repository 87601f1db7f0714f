"""The coordinator's side of a distributed execution never waits for a member whose share has
ended: a member that went silent must not hold a snapshot (and the job's snapshot lock) for
its calls' full timeouts once the execution went on without it.

The calls to members are plain functions here: what is specified is how the coordinator waits
for their answers, not the network."""

from __future__ import annotations

import threading
import time

from jetwake.engine.jobs.distributed_execution import (
    DistributedExecution, DistributedSnapshot, MemberExecutionError,
)
from jetwake.engine.jobs.execution_messages import (
    CompletePhase1, CompletePhase2, ExecutionMessage, Phase1Result, Phase2Result, StartSnapshot,
)

_KEY = "job.m-a.1.1"


class _Members:
    """Answers calls at once, except those to a member named silent, which block until the
    test releases them (a member cut off from the coordinator)."""

    def __init__(self, silent: set[str], answer_when_released: bool = False) -> None:
        self.silent = silent
        self.answer_when_released = answer_when_released
        self.release = threading.Event()
        self.calls: list[tuple[str, str]] = []

    def call(self, member: str, message: ExecutionMessage, timeout: float):
        self.calls.append((member, message.OP))
        if member in self.silent:
            if self.release.wait(timeout) and self.answer_when_released:
                return Phase2Result(done=True)
            raise TimeoutError(f"member {member} did not answer {message.OP}")
        if isinstance(message, CompletePhase1):
            return Phase1Result(ok=False, why="the execution was stopped")
        if isinstance(message, CompletePhase2):
            return Phase2Result(done=True)
        return None  # an operation without a reply


def _execution(members: _Members, names: list[str]) -> DistributedExecution:
    return DistributedExecution("sums", _KEY, names, members.call,
                                on_end=lambda ex: None, local_tasklets=lambda: [],
                                local="coordinator")


def test_a_call_to_a_member_whose_share_ended_is_not_waited_for() -> None:
    members = _Members(silent={"m-c"})
    execution = _execution(members, ["m-a", "m-b", "m-c"])
    threading.Timer(0.2, execution.member_left, args=("m-c",)).start()
    began = time.monotonic()
    results = execution.all_members(CompletePhase2(exec_key=_KEY, snapshot_id=3, success=True,
                                                   timeout=60.0), 60.0)
    took = time.monotonic() - began
    members.release.set()
    assert results["m-a"] == Phase2Result(done=True) == results["m-b"]
    assert isinstance(results["m-c"], MemberExecutionError)
    assert "ended before it answered exec.phase2" in str(results["m-c"])
    assert took < 10, f"waited {took:.1f} s for a member that had left"


def test_a_snapshot_gives_up_on_every_member_once_the_execution_is_stopped() -> None:
    members = _Members(silent={"m-b", "m-c"})
    execution = _execution(members, ["m-a", "m-b", "m-c"])
    threading.Timer(0.2, execution.cancel).start()
    began = time.monotonic()
    results = execution.all_members(CompletePhase1(exec_key=_KEY, snapshot_id=3, timeout=60.0),
                                    60.0, while_running=True)
    took = time.monotonic() - began
    members.release.set()
    assert isinstance(results["m-b"], MemberExecutionError)
    assert "was stopped before member m-b answered" in str(results["m-b"])
    assert took < 10, f"waited {took:.1f} s after the execution was stopped"


def test_phase_two_of_a_committed_snapshot_waits_for_members_still_running_it() -> None:
    """A cancel alone does not cut phase 2 short: a member that still runs its share commits
    its part; only a member whose share ended is given up on."""
    members = _Members(silent={"m-b"}, answer_when_released=True)
    execution = _execution(members, ["m-a", "m-b"])
    snapshot = DistributedSnapshot(execution)
    execution.cancel()
    snapshot.start_phase2(7, True)
    threading.Timer(0.3, members.release.set).start()
    assert snapshot.wait_phase2(7, 30.0, lambda: False) is True


def test_an_answer_that_never_comes_times_out_naming_the_member_and_the_call() -> None:
    members = _Members(silent={"m-b"})
    execution = _execution(members, ["m-a", "m-b"])
    request = StartSnapshot(exec_key=_KEY, snapshot_id=3, terminal=False)
    futures = {m: execution.call(m, request, 5.0) for m in execution.members}
    results = execution.gather(futures, 0.3, "exec.snapshot")
    members.release.set()
    assert results["m-a"] is None
    assert isinstance(results["m-b"], TimeoutError)
    assert "member m-b did not answer exec.snapshot within 0.3 s" in str(results["m-b"])
