"""Recovery one job at a time: a job that cannot start (its service is away) is retried with
back-off and shows why, a permanent cause fails only that job, and neither keeps the member
from resuming the others. The same holds for restarts while the member runs.

The "service" is a real TCP listener on loopback that the source connects to in ``init()``:
while it is down the connection is refused (a restartable cause); when it closes the
connection of a running job the source raises RestartableError, as a Kafka source does when
its broker goes away.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from jetwake import (
    BroadcastKey, JobCancelledError, JobConfig, JobStatus, Member, Pipeline, Processor,
    ProcessorMetaSupplier, RestartableError, Sinks, Source,
)
from jetwake.engine.core.errors import (
    FallbackRefusedError, JobStateError, SnapshotError, SnapshotWriteError, is_restartable_cause,
)
from support.snapshot_fixtures import running_sum_pipeline
from support.waiting import stays_true, wait_until


class Service:
    """A TCP service on a fixed loopback port that can go away and come back."""

    def __init__(self) -> None:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.accepted = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def up(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(16)
        sock.settimeout(0.05)
        self._listener = sock
        self._acceptor = threading.Thread(target=self._accept, args=(sock,), daemon=True)
        self._acceptor.start()

    def _accept(self, sock: socket.socket) -> None:
        while self._listener is sock:
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self._conns.append(conn)

    def down(self) -> None:
        sock, self._listener = self._listener, None
        if sock is not None:
            self._acceptor.join()  # not closed under an accept() in progress
            sock.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()


class RemoteSource(Processor):
    """Connects to the service in init() and counts what it reads; a closed connection is a
    RestartableError. Saves how much it read."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.received = 0
        self.sock: socket.socket | None = None

    def is_cooperative(self) -> bool:
        return False

    def init(self, context) -> None:
        super().init(context)
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        self.sock.settimeout(0.02)

    def complete(self) -> bool:
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return False
        except OSError as e:
            raise RestartableError(f"the connection to port {self.port} broke: {e}") from e
        if not data:
            raise RestartableError(f"the service on port {self.port} closed the connection")
        self.received += len(data)
        return False

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(BroadcastKey("received"), self.received)

    def restore_from_snapshot(self, inbox) -> None:
        for _, value in inbox.drain():
            self.received = value

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


class PickySource(Processor):
    """Refuses to start (a permanent, configuration-like error) once ``marker`` exists."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def init(self, context) -> None:
        super().init(context)
        if os.path.exists(self.marker):
            raise ValueError(f"the setting in {self.marker} is not valid")

    def complete(self) -> bool:
        time.sleep(0.001)
        return False


def remote_pipeline(port: int) -> Pipeline:
    p = Pipeline()
    p.read_from(Source("remote", ProcessorMetaSupplier.of(lambda: RemoteSource(port), 1),
                       is_stream=True)).write_to(Sinks.noop())
    return p


def picky_pipeline(marker: str) -> Pipeline:
    p = Pipeline()
    p.read_from(Source("picky", ProcessorMetaSupplier.of(lambda: PickySource(marker), 1),
                       is_stream=True)).write_to(Sinks.noop())
    return p


def eo(name: str) -> JobConfig:
    return JobConfig(name=name, processing_guarantee="exactly_once", snapshot_interval_ms=50)


def events_of(member: Member) -> list[str]:
    seen: list[str] = []
    member.add_listener(lambda _id, name, event: seen.append(f"{name}: {event}"))
    return seen


@pytest.fixture
def service():
    s = Service()
    s.up()
    yield s
    s.down()


def test_a_job_that_cannot_restart_at_member_start_does_not_stop_the_others(tmp_path, service):
    with Member(tmp_path) as m:
        remote = m.new_job(remote_pipeline(service.port), eo("remote"))
        steady = m.new_job(running_sum_pipeline(None), eo("steady"))
        wait_until(lambda: remote.last_snapshot and steady.last_snapshot, what="snapshots")
    service.down()  # the service is away when the member starts again

    with Member(tmp_path) as m:  # does not raise
        events = events_of(m)
        assert m.job("steady").status == JobStatus.RUNNING
        remote = m.job("remote")
        assert remote.status == JobStatus.NOT_RUNNING
        assert "ConnectionRefusedError" in remote.failure
        assert "retrying" in remote.failure
        wait_until(lambda: any("remote: start attempt 2 failed (ConnectionRefusedError" in e
                               for e in events), what="a second attempt")
        assert remote.status == JobStatus.NOT_RUNNING
        assert m.job("steady").status == JobStatus.RUNNING

        service.up()
        wait_until(lambda: remote.status == JobStatus.RUNNING, what="the job to start by itself")
        assert remote.failure is None, "a job that runs again shows no stale failure"
        wait_until(lambda: m.job("remote").last_snapshot, what="a snapshot of the resumed job")


def test_a_permanent_cause_at_member_start_fails_only_that_job(tmp_path):
    marker = str(tmp_path / "bad-setting")
    data_dir = tmp_path / "data"
    with Member(data_dir) as m:
        picky = m.new_job(picky_pipeline(marker), eo("picky"))
        steady = m.new_job(running_sum_pipeline(None), eo("steady"))
        wait_until(lambda: picky.last_snapshot and steady.last_snapshot, what="snapshots")
    open(marker, "w").close()

    with Member(data_dir) as m:
        picky = m.job("picky")
        assert picky.status == JobStatus.FAILED
        assert picky.failure.startswith("ValueError: the setting in")
        with pytest.raises(ValueError):
            picky.join(1)
        assert m.job("steady").status == JobStatus.RUNNING
    with Member(data_dir) as m:  # FAILED is recorded: it is not tried again
        assert m.job("picky").status == JobStatus.FAILED
        assert m.job("steady").status == JobStatus.RUNNING


def test_retries_stop_at_member_shutdown_and_the_job_resumes_on_the_next_start(tmp_path,
                                                                                service):
    with Member(tmp_path) as m:
        job = m.new_job(remote_pipeline(service.port), eo("remote"))
        wait_until(lambda: job.last_snapshot, what="a snapshot")
    service.down()
    m = Member(tmp_path)
    events = events_of(m)
    wait_until(lambda: any("start attempt 2 failed" in e for e in events), what="retries")
    t0 = time.monotonic()
    m.shutdown()
    assert time.monotonic() - t0 < 5, "shutdown does not wait for the back-off"

    accepted = service.accepted
    service.up()
    # the longest back-off so far is 2 s: a retry still alive would connect within that
    stays_true(lambda: service.accepted == accepted, seconds=3,
               what="no retry after the member shut down")
    with Member(tmp_path) as m:  # its record still says it was running
        assert m.job("remote").status == JobStatus.RUNNING
        assert service.accepted == accepted + 1


def test_an_in_run_restart_that_cannot_start_is_retried_until_the_service_returns(service):
    with Member() as m:
        events = events_of(m)
        job = m.new_job(remote_pipeline(service.port), eo("remote"))
        wait_until(lambda: job.last_snapshot, what="a snapshot")
        service.down()  # the running source loses its connection: the job restarts
        wait_until(lambda: any("remote: start attempt 2 failed (ConnectionRefusedError" in e
                               for e in events), what="retried restarts")
        assert job.status == JobStatus.NOT_RUNNING
        assert "ConnectionRefusedError" in job.failure
        service.up()
        wait_until(lambda: job.status == JobStatus.RUNNING, what="the restart to succeed")
        assert job.failure is None
        assert m.find_coordinator("remote").restart_count == 1


def test_cancel_while_a_restart_is_retrying_ends_the_job_and_the_retries(service):
    with Member() as m:
        events = events_of(m)
        job = m.new_job(remote_pipeline(service.port), eo("remote"))
        wait_until(lambda: job.last_snapshot, what="a snapshot")
        service.down()
        wait_until(lambda: any("start attempt 1 failed" in e for e in events), what="a retry")
        job.cancel()
        assert job.status == JobStatus.FAILED
        with pytest.raises(JobCancelledError):
            job.join(1)
        accepted = service.accepted
        service.up()
        stays_true(lambda: service.accepted == accepted and job.status == JobStatus.FAILED,
                   seconds=2, what="no retry after the cancel, the job FAILED")


def test_a_resume_that_cannot_start_for_a_restartable_cause_leaves_the_job_suspended(service):
    with Member() as m:
        job = m.new_job(remote_pipeline(service.port), eo("remote"))
        wait_until(lambda: job.last_snapshot, what="a snapshot")
        job.suspend()
        service.down()
        with pytest.raises(ConnectionRefusedError):
            job.resume()
        assert job.status == JobStatus.SUSPENDED, "the user can resume again"
        assert "ConnectionRefusedError" in job.failure
        service.up()
        job.resume()
        assert job.status == JobStatus.RUNNING


# --- the predicate ------------------------------------------------------------------------------


def raised(error: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        if cause is None:
            raise error
        raise error from cause
    except BaseException as e:  # noqa: BLE001
        return e


@pytest.mark.parametrize("error", [
    RestartableError("fenced"),
    ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
    TimeoutError("timed out"),
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EIO, "Input/output error"),
    SnapshotWriteError("disk full"),  # raised with its OSError as cause: see below
    KafkaException(KafkaError(KafkaError._TRANSPORT)),
    KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN)),
    KafkaException(KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE)),
    KafkaException(KafkaError(KafkaError.UNKNOWN, "x", retriable=True)),
], ids=lambda e: type(e).__name__ + ":" + str(e)[:30])
def test_restartable_causes(error):
    if isinstance(error, SnapshotWriteError):
        error = raised(error, OSError(errno.ENOSPC, "No space left on device"))
    assert is_restartable_cause(error)


@pytest.mark.parametrize("error", [
    ValueError("bad setting"),
    ZeroDivisionError("user code"),
    FileNotFoundError(errno.ENOENT, "no such file"),
    PermissionError(errno.EACCES, "denied"),
    FallbackRefusedError("damaged"),
    JobStateError("wrong state"),
    JobCancelledError("cancelled"),
    SnapshotError("written by another job"),
    KafkaException(KafkaError(KafkaError.INVALID_CONFIG)),
    KafkaException(KafkaError(KafkaError._TRANSPORT, "x", fatal=True)),
], ids=lambda e: type(e).__name__ + ":" + str(e)[:30])
def test_permanent_causes(error):
    assert not is_restartable_cause(error)


def test_a_wrapper_keeps_the_verdict_of_its_explicit_cause_only():
    wrapped = raised(RuntimeError("lookup failed"), KafkaException(KafkaError(
        KafkaError._TIMED_OUT)))
    assert is_restartable_cause(wrapped)
    assert not is_restartable_cause(raised(RuntimeError("bad"), ValueError("x")))
    try:  # raised while handling a connection error, but not because of it
        try:
            raise ConnectionResetError()
        except ConnectionResetError:
            raise ValueError("a bug in the handler")
    except ValueError as e:
        assert not is_restartable_cause(e)
