"""The member service and the network client, in one process: authentication before anything
is read, the wire protocol's limits, the client's job and data API, errors re-raised under
their own class, and the metrics and health endpoint."""

from __future__ import annotations

import json
import os
import pickle
import socket
import struct
import time
import urllib.error
import urllib.request

import msgpack
import pytest

from jetwake import (
    AuthenticationError, BroadcastKey, Client, JobCancelledError, JobConfig, JobNotFoundError,
    JobStateError, JobStatus, Member, MemberUnreachableError, Pipeline, Processor,
    ProcessorMetaSupplier, Sinks, SnapshotNotFoundError, Source, Sources,
)
from jetwake.engine.server.metrics import MetricsServer
from jetwake.engine.net.framing import read_frame, write_frame
from jetwake.engine.server.member_service import MemberService
from support.waiting import stays_true, wait_until

TOKEN = "s3cret-token"


class SlowCounter(Processor):
    """An unbounded source: (n, n) pairs, a few per call, position saved in snapshots."""

    def __init__(self) -> None:
        self.n = 0
        self.next_at = 0.0

    def complete(self) -> bool:
        now = time.monotonic()
        if now < self.next_at or not self.outbox.has_room():
            return False
        self.next_at = now + 0.01
        self.outbox.offer_chunk(-1, [(self.n + i, self.n + i) for i in range(5)])
        self.n += 5
        self.context.metrics["kafka_consumer_lag"] = 7
        self.context.metrics["late_events"] = 3
        return False

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(BroadcastKey("pos"), self.n)

    def restore_from_snapshot(self, inbox) -> None:
        for _, n in inbox.drain():
            self.n = n


def stream_pipeline(sink: str = "seen") -> Pipeline:
    p = Pipeline()
    (p.read_from(Source("counter", ProcessorMetaSupplier.of(SlowCounter, 1), is_stream=True))
      .write_to(Sinks.map(sink)))
    return p


@pytest.fixture
def service(tmp_path):
    member = Member(str(tmp_path / "data"))
    svc = MemberService(member, "127.0.0.1", 0, token=TOKEN).start()
    try:
        yield svc
    finally:
        svc.stop()
        member.shutdown(graceful=False)


@pytest.fixture
def client(service):
    with Client(service.address_text, token=TOKEN) as c:
        yield c


# --- authentication and the protocol -------------------------------------------------------


def test_wrong_and_missing_token_are_refused(service):
    with pytest.raises(AuthenticationError, match="wrong token"):
        Client(service.address_text, token="nope")
    with pytest.raises(AuthenticationError, match="requires a token"):
        Client(service.address_text)
    with Client(service.address_text, token=TOKEN) as c:
        assert c.ping()["token_required"] is True


def test_member_without_token_accepts_any_client(tmp_path):
    member = Member()
    svc = MemberService(member, "127.0.0.1", 0).start()
    try:
        with Client(svc.address_text, token="whatever") as c:
            assert c.jobs() == []
    finally:
        svc.stop()
        member.shutdown()


class _Trap:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _raw_connect(service) -> socket.socket:
    s = socket.create_connection(service.address, 5)
    s.settimeout(5)
    return s


def test_nothing_is_unpickled_before_authentication(service, tmp_path):
    trap = str(tmp_path / "unpickled")
    payload = pickle.dumps(_Trap(trap))
    # a pickle as the first frame: not a hello, the connection is closed
    with _raw_connect(service) as s:
        write_frame(s, payload)
        assert s.recv(10) == b""
    # a wrong token, then a submit carrying the pickle: never read
    with _raw_connect(service) as s:
        write_frame(s, msgpack.packb({"op": "hello", "token": "wrong"}))
        reply = msgpack.unpackb(read_frame(s))
        assert reply["ok"] is False and reply["error"][0] == "AuthenticationError"
        try:
            write_frame(s, msgpack.packb({"op": "submit", "args": {"pipeline": payload,
                                                                   "config": {}}}))
            assert read_frame(s) is None
        except OSError:
            pass  # closed by the member
    stays_true(lambda: not os.path.exists(trap), seconds=0.2, what="the refused pickle never loaded")


def test_oversized_or_garbage_hello_closes_the_connection(service):
    with _raw_connect(service) as s:
        s.sendall(struct.pack(">I", 1 << 30))  # claims 1 GiB before authenticating
        assert s.recv(10) == b""
    with _raw_connect(service) as s:
        write_frame(s, b"\xc1garbage")
        assert s.recv(10) == b""
    with _raw_connect(service) as s:  # extension types are refused in the hello
        write_frame(s, msgpack.packb({"op": "hello", "token": msgpack.ExtType(1, b"x")}))
        assert s.recv(10) == b""


def test_unreachable_member_names_the_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MemberUnreachableError, match=f"127.0.0.1:{port}"):
        Client(f"127.0.0.1:{port}")


# --- jobs ----------------------------------------------------------------------------------


def test_job_api_through_the_client(client):
    job = client.new_job(stream_pipeline(), JobConfig(
        name="counter", processing_guarantee="exactly_once", snapshot_interval_ms=100))
    assert job.name == "counter" and job.status == JobStatus.RUNNING
    assert job.config.processing_guarantee == "exactly_once"
    assert client.job("counter").id == job.id == client.job(job.id).id
    assert client.get_job("nope") is None
    with pytest.raises(JobNotFoundError, match="nope"):
        client.job("nope")
    wait_until(lambda: job.last_snapshot is not None, what="a snapshot")
    seen = client.get_map("seen")
    wait_until(lambda: len(seen) >= 10, what="items")
    m = job.metrics()
    assert m["counter"]["items_out"] >= 10 and m["map-sink-seen"]["items_in"] >= 10

    job.suspend()
    assert job.status == JobStatus.SUSPENDED
    with pytest.raises(JobStateError, match="SUSPENDED"):
        job.suspend()
    rec = job.export_snapshot("snap-a")
    assert rec.name == "snap-a" and [s.name for s in client.snapshots()] == ["snap-a"]
    job.resume()
    assert job.status == JobStatus.RUNNING
    before = len(seen)
    job.restart()
    wait_until(lambda: job.status == JobStatus.RUNNING and len(seen) > before + 10,
               what="the restarted job to make progress")
    keys = sorted(seen.keys())
    assert keys == list(range(len(keys)))  # exactly-once through suspend and restart

    # a second job from the exported snapshot, into another map
    job2 = client.new_job(stream_pipeline("seen2"), JobConfig(
        name="from-snap", processing_guarantee="exactly_once",
        initial_snapshot_name="snap-a"))
    seen2 = client.get_map("seen2")
    wait_until(lambda: len(seen2) > 0, what="the second job's items")
    assert min(seen2.keys()) > 0  # it started where snap-a's source position was
    job2.cancel_and_export_snapshot("snap-b")
    assert job2.status == JobStatus.FAILED
    with pytest.raises(JobCancelledError):
        job2.join(5)
    client.delete_snapshot("snap-a")
    with pytest.raises(SnapshotNotFoundError, match="snap-a"):
        client.delete_snapshot("snap-a")
    assert [s.name for s in client.snapshots()] == ["snap-b"]

    job.cancel()
    with pytest.raises(JobCancelledError, match="cancelled"):
        job.join(10)
    assert [j.name for j in client.jobs()] == ["counter", "from-snap"]


def test_user_error_comes_back_under_its_own_class(client):
    p = Pipeline()
    p.read_from(Sources.items([1, 0])).map(lambda x: 1 // x).write_to(Sinks.list("out"))
    job = client.new_job(p)
    with pytest.raises(ZeroDivisionError):
        job.join(10)
    assert job.status == JobStatus.FAILED and "ZeroDivisionError" in job.failure


def test_submission_errors_come_back_under_their_own_class(client):
    with pytest.raises(TypeError, match="Pipeline"):
        client.new_job("not a pipeline")
    client.new_job(stream_pipeline(), JobConfig(name="dup"))
    with pytest.raises(ValueError, match="already exists"):
        client.new_job(stream_pipeline(), JobConfig(name="dup"))
    with pytest.raises(SnapshotNotFoundError, match="missing"):
        client.new_job(stream_pipeline(), JobConfig(name="x", initial_snapshot_name="missing"))


def test_a_job_keeps_running_after_its_client_disconnects(service):
    with Client(service.address_text, token=TOKEN) as c1:
        c1.new_job(stream_pipeline(), JobConfig(name="detached"))
    with Client(service.address_text, token=TOKEN) as c2:
        job = c2.job("detached")
        # a while after the client left: the member has seen it go
        stays_true(lambda: job.status == JobStatus.RUNNING, seconds=0.3,
                   what="the job running after its client left")
        n = len(c2.get_map("seen"))
        wait_until(lambda: len(c2.get_map("seen")) > n, what="more items")


def test_maps_and_lists(client):
    m = client.get_map("m")
    m.put("a", 1)
    m.put_all({"b": (2, 3), "c": [4]})
    assert m["a"] == 1 and m["b"] == (2, 3) and m.get("zz", 9) == 9 and "c" in m
    assert dict(m.items()) == {"a": 1, "b": (2, 3), "c": [4]} and len(m) == 3
    with pytest.raises(KeyError):
        m["zz"]
    assert m.remove("a") == 1 and sorted(m) == ["b", "c"]
    p = Pipeline()
    p.read_from(Sources.items(range(5))).write_to(Sinks.list("l"))
    client.new_job(p).join(10)
    lst = client.get_list("l")
    assert len(lst) == 5 and sorted(lst) == [0, 1, 2, 3, 4] and lst[-1] in range(5)
    assert len(lst[1:3]) == 2
    with pytest.raises(IndexError):
        lst[10]
    with pytest.raises(ValueError):
        client.get_map("")


# --- metrics -------------------------------------------------------------------------------


def test_metrics_and_health(service, client):
    client.new_job(stream_pipeline(), JobConfig(name="metered",
                                                processing_guarantee="at_least_once",
                                                snapshot_interval_ms=100))
    wait_until(lambda: client.job("metered").last_snapshot is not None, what="a snapshot")
    up = {"v": True}
    ms = MetricsServer(service.member, "127.0.0.1", 0, healthy=lambda: up["v"]).start()
    try:
        base = f"http://127.0.0.1:{ms.address[1]}"
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        for needle in ('jetwake_vertex_items_out_total{job="metered"',
                       'jetwake_vertex_items_in_total{job="metered"',
                       'jetwake_vertex_queue_fill_ratio{job="metered"',
                       'jetwake_vertex_late_events_total{job="metered"',
                       'jetwake_vertex_kafka_consumer_lag{job="metered"',
                       'jetwake_snapshot_duration_ms{job="metered"',
                       'jetwake_snapshot_size_bytes{job="metered"',
                       'jetwake_job_status{job="metered"'):
            assert needle in text, needle
        r = urllib.request.urlopen(base + "/health", timeout=5)
        assert r.status == 200 and json.loads(r.read())["status"] == "UP"
        up["v"] = False
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/health", timeout=5)
        assert e.value.code == 503
    finally:
        ms.stop()


@pytest.mark.integration
@pytest.mark.kafka
def test_kafka_consumer_lag_metric(kafka_bootstrap, kafka_topic):
    """A slow job over a backlog: the source is held back by backpressure, so Kafka still
    holds records it has not fetched, and the collector reports them."""
    from confluent_kafka import Producer
    from prometheus_client import CollectorRegistry

    from jetwake.engine.server.metrics import JetwakeCollector

    total = 150_000
    topic = kafka_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    for i in range(total):
        while True:
            try:
                producer.produce(topic, value=b"x")
                break
            except BufferError:  # the local queue is full while the broker catches up
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(30)

    def slow(item):
        time.sleep(0.001)
        return item

    p = Pipeline()
    (p.read_from(Sources.kafka(topic, {"bootstrap.servers": kafka_bootstrap}))
      .map(slow).write_to(Sinks.list("out")))
    registry = CollectorRegistry(auto_describe=False)
    with Member() as member:
        registry.register(JetwakeCollector(member))
        job = member.new_job(p, JobConfig(name="kafka-lag"))
        vertex = next(v for v in job.metrics() if v.startswith("kafka-source"))

        def lag() -> float:
            return registry.get_sample_value(
                "jetwake_vertex_kafka_consumer_lag",
                {"job": "kafka-lag", "job_id": job.id, "vertex": vertex}) or 0

        wait_until(lambda: lag() > 0, timeout=30, what="a positive consumer lag")
        assert lag() <= total
        job.cancel()
