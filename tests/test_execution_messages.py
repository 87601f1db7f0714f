"""What the coordinator of a job and the members running it say to each other: each operation
is a typed message with a version; a message that does not match the receiver's definition
fails loudly; a member judges its own errors, so a cause is worth a retry or not by one
verdict on every path; and each member weighs a fallback past a damaged snapshot at the same
point, after its processors are initialized and before any state is restored into them."""

from __future__ import annotations

import dataclasses
import os

import cloudpickle
import pytest
from confluent_kafka import KafkaError, KafkaException

from jetwake import FallbackRefusedError, JobConfig, JobStatus, Member, Pipeline, Sinks
from jetwake.engine.jobs.job_coordinator import start_failure
from jetwake.engine.jobs.distributed_execution import MemberExecutionError
from jetwake.engine.jobs.execution_participant import ExecutionParticipant
from jetwake.engine.cluster.peer_network import PeerCallError
from jetwake.engine.core.errors import RestartableError, is_restartable_cause
from jetwake.engine.core.serialization import dumps, loads
from jetwake.engine.jobs import member_share
from jetwake.engine.jobs.execution_messages import (
    REQUESTS, CancelExecution, CompletePhase1, CompletePhase2, ExecutionEnded,
    ExecutionMetrics, ForgetJob, InitExecution, Initialized, MemberCounts, MessageFormatError,
    Phase1Result, Phase2Result, StartExecution, StartSnapshot, decode, decode_request,
)
from support.snapshot_fixtures import counting_source
from test_cluster_peer_network import pair  # noqa: F401 - two members' networks, a fixture

KEY = "job-1.m-a.1.1"

EXAMPLES = [
    InitExecution(exec_key=KEY, job_id="job-1", job_name="sums", definition=b"\x80\x05.",
                  config={"name": "sums"}, default_parallelism=2,
                  members=[["m-a", "127.0.0.1:5701"], ["m-b", "127.0.0.1:5702"]],
                  member_index=1, coordinator="m-a", restore=None, restore_desc="",
                  execution_count=3, skipped_damaged=["snapshot 4 (bad crc)"],
                  accept_fallback=True),
    Initialized(processors=7),
    StartExecution(exec_key=KEY),
    StartSnapshot(exec_key=KEY, snapshot_id=5, terminal=True),
    CompletePhase1(exec_key=KEY, snapshot_id=5, timeout=120.0),
    Phase1Result(ok=True, part='{"snapshot_id": 5}', refs={"a/0.bin": ["t", 0, 1, 2, 3]}),
    Phase1Result(ok=False, why="phase 1 did not complete on m-b"),
    CompletePhase2(exec_key=KEY, snapshot_id=5, success=False, timeout=120.0),
    Phase2Result(done=True),
    CancelExecution(exec_key=KEY),
    ExecutionMetrics(exec_key=KEY),
    MemberCounts(counts={"map": {"items_in": 3, "items_out": 3}}),
    ForgetJob(job_id="job-1"),
    ExecutionEnded(exec_key=KEY, member="m-b", cancelled=False, error="ValueError: bad",
                   error_type="ValueError", restartable=False, error_tasklet="map#1",
                   metrics={"map": {"items_in": 1, "items_out": 0}}),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_crosses_the_wire_unchanged(message):
    wire = loads(dumps(message.to_wire()))
    assert wire["v"] == type(message).VERSION
    assert decode(type(message), wire) == message


def test_a_field_added_on_one_side_fails_loudly_on_the_other():
    wire = StartSnapshot(exec_key=KEY, snapshot_id=5, terminal=False).to_wire()
    with pytest.raises(MessageFormatError, match=r"unknown \['priority'\]"):
        decode(StartSnapshot, {**wire, "priority": 1})
    del wire["terminal"]
    with pytest.raises(MessageFormatError, match=r"missing \['terminal'\]"):
        decode(StartSnapshot, wire)


def test_a_message_of_another_version_is_refused_naming_both():
    wire = {**CancelExecution(exec_key=KEY).to_wire(), "v": 2}
    with pytest.raises(MessageFormatError, match="version 2 received.*speaks version 1"):
        decode(CancelExecution, wire)


def test_a_mismatched_message_is_never_worth_a_retry():
    with pytest.raises(MessageFormatError) as info:
        decode(Phase2Result, {"done": True})
    assert not is_restartable_cause(info.value)


def test_a_call_names_its_operation_and_carries_exactly_one_message():
    assert set(REQUESTS) == {"exec.init", "exec.start", "exec.snapshot", "exec.phase1",
                             "exec.phase2", "exec.cancel", "exec.metrics", "exec.forget_job",
                             "exec.read_state"}
    request = StartExecution(exec_key=KEY)
    assert decode_request("exec.start", [request.to_wire()]) == request
    with pytest.raises(MessageFormatError, match="unknown execution operation 'exec.pause'"):
        decode_request("exec.pause", [request.to_wire()])
    with pytest.raises(MessageFormatError, match="expected one encoded message"):
        decode_request("exec.start", [KEY, 5])
    with pytest.raises(MessageFormatError, match=r"StartSnapshot v1: missing \[.snapshot_id., .terminal.\]"):
        decode_request("exec.snapshot", [request.to_wire()])


# --- one verdict on what is worth a retry ------------------------------------------------------

FATAL = KafkaException(KafkaError(KafkaError._FENCED, "producer fenced", fatal=True))
TRANSIENT = KafkaException(KafkaError(KafkaError._TRANSPORT))


def _raise(error: BaseException):
    def handler(peer_id, method, args):
        raise error
    return handler


@pytest.mark.parametrize("error", [FATAL, TRANSIENT, ValueError("user code")],
                         ids=["fatal-kafka", "transient-kafka", "user-code"])
def test_a_member_judges_its_own_error_and_the_network_carries_the_verdict(pair, error):
    a, b = pair
    b.set_call_handler(_raise(error))
    with pytest.raises(PeerCallError) as info:
        a.call("b", b.address, "exec.init", [{}])
    assert info.value.remote_type == type(error).__name__
    assert is_restartable_cause(info.value) == is_restartable_cause(error)


def test_a_fatal_kafka_error_fails_a_cluster_start_as_it_fails_a_single_members(pair):
    """A member whose share could not start because of a fatal Kafka error (another producer
    fenced it for good) fails the job's start on a cluster, as on a single member, instead of
    being retried forever because the error's type is a Kafka one."""
    a, b = pair
    b.set_call_handler(_raise(FATAL))
    with pytest.raises(PeerCallError) as remote:
        a.call("b", b.address, "exec.init", [{}])
    assert not is_restartable_cause(FATAL)  # the single member's verdict
    error = start_failure("sums", {"m-a": FATAL, "m-b": remote.value})
    assert isinstance(error, MemberExecutionError) and not is_restartable_cause(error)
    assert "member m-b" in str(error) and "producer fenced" in str(error)


def test_a_cluster_start_is_retried_when_every_members_cause_may_pass(pair):
    a, b = pair
    b.set_call_handler(_raise(TRANSIENT))
    with pytest.raises(PeerCallError) as remote:
        a.call("b", b.address, "exec.init", [{}])
    error = start_failure("sums", {"m-a": TRANSIENT, "m-b": remote.value,
                                  "m-c": TimeoutError("no answer within 120 s")})
    assert isinstance(error, RestartableError)


# --- one rule for falling back past a damaged snapshot -----------------------------------------


class _NoEdges:
    def release(self, exec_key: str) -> None:
        pass


def _pipeline() -> Pipeline:
    p = Pipeline()
    p.read_from(counting_source(200_000, per_call=20, pause=0.001)).write_to(Sinks.list("out"))
    return p


def test_each_member_refuses_the_fallback_before_restoring_any_state(tmp_path, monkeypatch):
    """Both paths weigh a fallback past a damaged snapshot at the same point: a single
    member's job and a member's share of a cluster's (the participant) are refused after
    their processors are initialized and before any state is restored into them."""
    restored: list[str] = []
    real_restore = member_share.restore_state

    def recording_restore(tasklets, reader, desc, **kw):
        restored.append(desc)
        real_restore(tasklets, reader, desc, **kw)
    monkeypatch.setattr(member_share, "restore_state", recording_restore)
    config = JobConfig(name="to-list", processing_guarantee="exactly_once",
                       snapshot_interval_ms=3_600_000)
    with Member(tmp_path) as m:
        job = m.new_job(_pipeline(), config)
        job.take_snapshot()
        job.take_snapshot()
        job.suspend()
        older, latest = m.snapshot_store.committed(job.id)[1], m.snapshot_store.committed(job.id)[0]
        _damage(m, job.id, latest)

        with pytest.raises(FallbackRefusedError, match=f"snapshot {latest.snapshot_id}"):
            job.resume()
        assert restored == []

        participant = ExecutionParticipant(m, "m-a", _NoEdges(),  # type: ignore[arg-type]
                                           report=lambda coordinator, ended: None)
        init = InitExecution(
            exec_key=KEY, job_id=job.id, job_name="to-list",
            definition=cloudpickle.dumps(_pipeline()), config=dict(vars(config)),
            default_parallelism=2, members=[["m-a", ""]], member_index=0, coordinator="m-a",
            restore=older.to_json(), restore_desc=f"snapshot {older.snapshot_id}",
            execution_count=5, skipped_damaged=[f"snapshot {latest.snapshot_id} (bad crc)"])
        with pytest.raises(FallbackRefusedError, match=f"snapshot {latest.snapshot_id}"):
            participant.handle(init)
        assert restored == [] and participant.running() == []

        accepted = participant.handle(dataclasses.replace(init, accept_fallback=True))
        assert isinstance(accepted, Initialized) and accepted.processors > 0
        assert restored == [f"snapshot {older.snapshot_id}"]
        participant.cancel(KEY)
        job.cancel()


def _damage(m: Member, job_id: str, rec) -> None:
    vertex = next(v for v in rec.files if rec.files[v])
    proc = next(iter(rec.files[vertex]))
    path = os.path.join(m.data_dir, "jobs", job_id, "snapshots", str(rec.snapshot_id), vertex,
                        f"{proc}.bin")
    with open(path, "r+b") as f:
        f.write(b"\xff\xff\xff\xff")


# --- one verdict on an execution's end -------------------------------------------------------


class _FailOnce:
    """A map function that raises ``error`` at its first item 500, then passes items."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.raised: list[int] = []  # the job runs this very object (its copy is only saved)

    def __call__(self, item):
        if item == 500 and not self.raised:
            self.raised.append(item)
            raise self.error
        return item


@pytest.mark.parametrize("error, restarts", [
    (TRANSIENT, True), (ConnectionResetError("peer reset"), True), (FATAL, False),
    (ValueError("user code"), False),
], ids=["transient-kafka", "connection", "fatal-kafka", "user-code"])
def test_a_processor_failing_restarts_the_job_by_the_same_verdict_as_a_cluster_member(
        tmp_path, error, restarts):
    fail_once = _FailOnce(error)
    p = Pipeline()
    p.read_from(counting_source(2000, per_call=100)).map(fail_once).write_to(Sinks.list("out"))
    with Member(tmp_path) as m:
        job = m.new_job(p, JobConfig(name="verdict", processing_guarantee="exactly_once",
                                     snapshot_interval_ms=3_600_000))
        if restarts:
            job.join(60)
            assert sorted(m.get_list("out")) == list(range(2000))
            assert m.find_coordinator(job.id).restart_count == 1
        else:
            with pytest.raises(type(error)):
                job.join(60)
            assert job.status == JobStatus.FAILED
        assert fail_once.raised == [500]
        # the cluster's path: the member's report carries the same verdict
        ended = ExecutionEnded(exec_key=KEY, member="m-b", cancelled=False,
                               error=f"{type(error).__name__}: {error}",
                               error_type=type(error).__name__,
                               restartable=is_restartable_cause(error))
        assert ended.restartable is restarts
