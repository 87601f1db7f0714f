"""The dashboard's JSON API (docs/dashboard.md) on a real member serving clients: what it
shows of the cluster, the jobs and one job (DAG, per-vertex rates, queue fill, watermark lag,
late events, dead letters, Kafka lag per partition, snapshot history, error, config), the
exported snapshots, and who may act: the actions run with the member's token and are refused
with 403, changing nothing, without it; reading needs it too with ``ui_auth="required"``."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time

import pytest

from jetwake import (
    AggregateOperations, JobConfig, JobStatus, Member, Pipeline, Processor,
    ProcessorMetaSupplier, RestartableError, Sink, Sinks, TestSources, WindowDefinition,
)
from jetwake.engine.jobs import snapshot_driver
from jetwake.engine.jobs.snapshot_history import SNAPSHOT_HISTORY, SnapshotHistory
from jetwake.engine.server.dashboard import routes
from jetwake.engine.server.metrics import MetricsServer
from support.dashboard import TOKEN, DashboardMember, Http, free_port
from support.waiting import stays_true, wait_until


def late_every_tenth(timestamp: int, sequence: int) -> tuple[int, int]:
    return (timestamp - 5000 if sequence % 10 == 0 else timestamp, sequence)


def windowed_stream(rate: float = 200, sink: Sink | None = None) -> Pipeline:
    """200 items a second, one in ten 5 s late, counted per key in half-second windows."""
    p = Pipeline()
    (p.read_from(TestSources.item_stream(rate, late_every_tenth))
      .with_timestamps(lambda e: e[0], 100)
      .map(lambda e: (e[1] % 4, e))
      .window(WindowDefinition.tumbling(500))
      .aggregate(AggregateOperations.counting())
      .write_to(sink or Sinks.list("counts")))
    return p


class SlowSink(Processor):
    """Takes one item every 20 ms: the queue into it fills up."""

    def is_cooperative(self) -> bool:
        return False

    def process(self, ordinal, inbox) -> None:
        if inbox.poll() is not None:
            time.sleep(0.02)


class HoldsSnapshots(Processor):
    """A sink that does not save its state while ``hold`` is set: phase 1 cannot complete."""

    hold = False

    def process(self, ordinal, inbox) -> None:
        inbox.clear()

    def save_to_snapshot(self) -> bool:
        return not HoldsSnapshots.hold


def explode(x: int) -> int:
    if x == 3:
        raise ValueError(f"item {x} is bad")
    return x


@pytest.fixture
def member(tmp_path):
    m = Member(str(tmp_path / "data"), port=0, token=TOKEN, cooperative_threads=1,
               local_parallelism=1)
    try:
        yield m
    finally:
        m.shutdown(graceful=False)


def _serve(member, **kw) -> tuple[MetricsServer, Http]:
    ms = MetricsServer(member, "127.0.0.1", 0, **kw).start()
    return ms, Http(f"http://127.0.0.1:{ms.address[1]}")


@pytest.fixture
def http(member):
    ms, http = _serve(member)
    try:
        yield http
    finally:
        ms.stop()


def _stream_job(member, name: str = "windows", **config):
    cfg = {"processing_guarantee": "at_least_once", "snapshot_interval_ms": 300, **config}
    return member.new_job(windowed_stream(), JobConfig(name=name, **cfg))


def _vertex(detail: dict, name: str) -> dict:
    return next(v for v in detail["dag"]["vertices"] if v["name"] == name)


# --- reading ---------------------------------------------------------------------------------


def test_the_jobs_list_shows_each_job_with_status_guarantee_rates_and_snapshot_age(member,
                                                                                 http):
    job = _stream_job(member)

    def listed():
        jobs = http.get("/api/jobs").json
        return jobs if jobs and jobs[0]["in_per_s"] > 0 and len(jobs[0]["history"]) >= 2 \
            and jobs[0]["last_snapshot_age_s"] is not None else None
    [j] = wait_until(listed, what="the job with rates and a snapshot", timeout=20, interval=0.2)
    assert (j["id"], j["name"], j["status"], j["guarantee"], j["light"]) == \
        (job.id, "windows", "RUNNING", "at_least_once", False)
    assert j["submitted"] and j["submission_time"] > 0
    # the source emits 200 items a second; the sink takes a few window results a second
    assert 50 < j["in_per_s"] < 400 and 0 < j["out_per_s"] < j["in_per_s"]
    assert all(len(p) == 3 for p in j["history"]) and j["last_snapshot_age_s"] < 10


def test_a_job_shows_its_dag_with_parallelism_edge_kinds_and_its_config(member, http):
    job = _stream_job(member, local_parallelism=2)
    detail = http.get(f"/api/jobs/{job.id}").json
    dag = member.find_coordinator(job.id).dag
    assert [v["name"] for v in detail["dag"]["vertices"]] == \
        [v.name for v in dag.topological_order()]
    lp = {v["name"]: v["local_parallelism"] for v in detail["dag"]["vertices"]}
    assert lp["item-stream"] == 1  # the source asks for one processor
    assert lp["window-aggregate-accumulate"] == 2  # the job's default
    # on one member, each vertex runs as many processors as its local parallelism
    detail = wait_until(lambda: (lambda d: d if all(
        v["processors"] == v["local_parallelism"] for v in d["dag"]["vertices"]) else None)(
            http.get(f"/api/jobs/{job.id}").json),
                        what="every processor running", timeout=10, interval=0.1)
    kinds = {(e["from"], e["to"]): (e["routing"], e["distributed"])
             for e in detail["dag"]["edges"]}
    assert kinds == {(e.source.name, e.destination.name): (e.routing.value, e.is_distributed)
                     for e in dag.edges}
    assert kinds[("window-aggregate-accumulate", "window-aggregate")][0] == "all_to_one"
    assert detail["config"]["processing_guarantee"] == "at_least_once"
    assert detail["config"]["snapshot_interval_ms"] == 300
    assert detail["config"]["local_parallelism"] == 2
    assert detail["error"] is None and detail["status"] == "RUNNING"


def test_each_vertex_shows_its_rates_watermark_lag_and_late_events(member, http):
    job = _stream_job(member)

    def read():
        d = http.get(f"/api/jobs/{job.id}").json
        acc = _vertex(d, "window-aggregate-accumulate")
        return d if acc["late_events"] > 0 and acc["in_per_s"] > 0 \
            and acc["watermark_lag_ms"] is not None else None
    detail = wait_until(read, what="late events, rates and a watermark", timeout=20, interval=0.2)
    source, acc = _vertex(detail, "item-stream"), _vertex(detail, "window-aggregate-accumulate")
    assert 50 < source["out_per_s"] < 400 and source["items_out"] > 0
    assert acc["items_in"] > 0 and acc["processors"] == 1
    # one item in ten is 5 s late: dropped by the window, counted as late
    assert acc["late_events"] >= acc["items_in"] // 10 - 5
    # the watermark trails the newest event by the allowed lag plus the window's step
    assert 0 <= acc["watermark_lag_ms"] < 5000
    assert acc["watermark"] <= time.time() * 1000
    assert detail["throughput"]["in_per_s"] > 0 and detail["throughput"]["history"]
    assert detail["kafka_lag"] == []  # no Kafka source here


def test_a_vertex_that_cannot_keep_up_shows_a_full_queue(member, http):
    job = member.new_job(_slow_pipeline(), JobConfig(name="slow"))
    detail = wait_until(
        lambda: (lambda d: d if _vertex(d, "slow-sink")["queue_fill"] > 0.5 else None)(
            http.get(f"/api/jobs/{job.id}").json),
                        what="the slow sink's queue to fill", timeout=20, interval=0.2)
    assert _vertex(detail, "item-stream")["queue_fill"] == 0.0  # a source has no queue
    assert _vertex(detail, "slow-sink")["queue_fill"] <= 1.0


def _slow_pipeline() -> Pipeline:
    p = Pipeline()
    p.read_from(TestSources.item_stream(1000)).write_to(
        Sink("slow-sink", ProcessorMetaSupplier.of(SlowSink, 1)))
    return p


def test_the_snapshot_history_has_each_snapshot_with_its_phase_size_and_failure(
        member, http, monkeypatch):
    monkeypatch.setattr(snapshot_driver, "PHASE_TIMEOUT_S", 0.5)
    HoldsSnapshots.hold = False
    p = Pipeline()
    p.read_from(TestSources.item_stream(100)).write_to(
        Sink("holds", ProcessorMetaSupplier.of(HoldsSnapshots, 1)))
    job = member.new_job(p, JobConfig(name="held", processing_guarantee="at_least_once",
                                      snapshot_interval_ms=3_600_000))
    coordinator = member.find_coordinator(job.id)
    wait_until(lambda: job.status == JobStatus.RUNNING, what="the job to run")
    good = coordinator.take_snapshot()
    HoldsSnapshots.hold = True
    try:
        with pytest.raises(RestartableError, match="did not complete phase 1"):
            coordinator.take_snapshot()
    finally:
        HoldsSnapshots.hold = False
    history = http.get(f"/api/jobs/{job.id}").json["snapshots"]
    failed, ok = history[0], history[1]  # newest first
    assert ok["id"] == good.snapshot_id and ok["outcome"] == "committed"
    assert ok["phase"] == "done" and ok["failure"] is None
    assert ok["size_bytes"] == good.size_bytes > 0 and ok["entries"] == good.entry_count
    assert ok["duration_ms"] == pytest.approx(good.duration_ms)
    assert failed["id"] == good.snapshot_id + 1 and failed["outcome"] == "failed"
    assert failed["phase"] == "started"  # the id was taken, phase 1 never completed
    assert "RestartableError" in failed["failure"] and "phase 1" in failed["failure"]
    assert failed["size_bytes"] is None and failed["duration_ms"] >= 500


def test_the_snapshot_history_keeps_the_newest_attempts_only():
    history = SnapshotHistory()
    for i in range(SNAPSHOT_HISTORY + 5):
        with history.attempt(terminal=False) as a:
            a.reached("started", id=i)
            a.reached("committed", size_bytes=10, entries=1, duration_ms=1.0)
            a.reached("done")
    entries = history.entries()
    assert len(entries) == SNAPSHOT_HISTORY
    assert [e["id"] for e in entries] == list(range(5, SNAPSHOT_HISTORY + 5))
    assert {e["outcome"] for e in entries} == {"committed"}


def test_a_failed_job_shows_its_error_with_the_traceback(member, http):
    p = Pipeline()
    p.read_from(TestSources.items(list(range(10)))).map(explode).write_to(Sinks.list("out"))
    job = member.new_job(p, JobConfig(name="explodes"))
    wait_until(lambda: job.status == JobStatus.FAILED, what="the job to fail")
    detail = http.get(f"/api/jobs/{job.id}").json
    assert detail["status"] == "FAILED"
    error = detail["error"]
    assert "item 3 is bad" in error["message"]
    assert "Traceback" in error["traceback"] and "in explode" in error["traceback"]
    assert "item 3 is bad" in detail["failure"]


def test_the_cluster_of_one_member_shows_it_with_its_memory_and_cpu(member, http):
    _stream_job(member)
    info = wait_until(lambda: (lambda c: c if c["members"][0]["cpu_percent"] is not None
                               else None)(http.get("/api/cluster").json),
                      what="a CPU reading", timeout=10, interval=0.2)
    assert info["quorum"] == 1 and info["state"] == "ACTIVE" and len(info["members"]) == 1
    [m] = info["members"]
    assert m["coordinator"] is True and m["address"] == member.address
    assert m["rss_bytes"] > 10 * 2**20 and m["cpu_percent"] >= 0 and m["jobs"] == 1


# --- snapshots and actions ---------------------------------------------------------------------


def test_exported_snapshots_are_listed_and_deleted_with_the_token(member, http):
    job = _stream_job(member)
    wait_until(lambda: job.status == JobStatus.RUNNING, what="the job to run")
    r = http.post(f"/api/jobs/{job.id}/export-snapshot", token=TOKEN, body={"name": "keep-1"})
    assert r.status == 200, r.text
    assert r.json["name"] == "keep-1" and r.json["size_bytes"] > 0
    [snap] = http.get("/api/snapshots").json
    assert (snap["name"], snap["job_name"]) == ("keep-1", "windows")
    assert snap["size_bytes"] > 0 and snap["created"] <= time.time()

    for token in (None, "wrong"):
        r = http.delete("/api/snapshots/keep-1", token=token)
        assert r.status == 403 and "refused" in r.json["message"]
    assert [s.name for s in member.snapshots()] == ["keep-1"]  # still there

    r = http.delete("/api/snapshots/keep-1", token=TOKEN)
    assert r.status == 200 and r.json == {"deleted": "keep-1"}
    assert member.snapshots() == [] and http.get("/api/snapshots").json == []
    r = http.delete("/api/snapshots/keep-1", token=TOKEN)
    assert r.status == 404 and "keep-1" in r.json["message"]


def test_the_actions_with_the_token_suspend_resume_restart_and_cancel_the_job(member, http):
    job = _stream_job(member)
    wait_until(lambda: job.status == JobStatus.RUNNING, what="the job to run")
    url = f"/api/jobs/{job.id}"
    assert http.post(url + "/suspend", token=TOKEN).status == 200
    wait_until(lambda: job.status == JobStatus.SUSPENDED, what="SUSPENDED")
    assert http.get(url).json["status"] == "SUSPENDED"
    r = http.post(url + "/suspend", token=TOKEN)  # the state refuses it: 409 with why
    assert r.status == 409 and "SUSPENDED" in r.json["message"]
    assert http.post(url + "/resume", token=TOKEN).status == 200
    wait_until(lambda: job.status == JobStatus.RUNNING, what="RUNNING again")
    restarts = member.find_coordinator(job.id).restart_count
    # the other spellings of an action: /actions/ACTION, and the action in the body
    assert http.post(url + "/actions/restart", token=TOKEN).status == 200
    wait_until(lambda: member.find_coordinator(job.id).restart_count == restarts + 1,
               what="a restart")
    wait_until(lambda: job.status == JobStatus.RUNNING, what="RUNNING after the restart")
    r = http.post(url, headers={"Authorization": f"Bearer {TOKEN}"}, body={"action": "cancel"})
    assert r.status == 200, r.text
    wait_until(lambda: job.status == JobStatus.FAILED, what="cancelled")


@pytest.mark.parametrize("token", [None, "wrong-token"], ids=["missing", "wrong"])
@pytest.mark.parametrize("action", ["suspend", "restart", "cancel", "export-snapshot"])
def test_an_action_without_the_right_token_is_refused_and_changes_nothing(member, http,
                                                                          action, token):
    job = _stream_job(member)
    wait_until(lambda: job.status == JobStatus.RUNNING, what="the job to run")
    coordinator = member.find_coordinator(job.id)
    restarts = coordinator.restart_count
    r = http.post(f"/api/jobs/{job.id}/{action}", token=token, body={"name": "not-taken"})
    assert r.status == 403
    assert r.headers["Content-Type"] == "application/json"
    assert "refused" in r.json["message"] and r.json["error"] == r.json["message"]
    # nothing happened, then or later
    stays_true(lambda: job.status == JobStatus.RUNNING and coordinator.restart_count == restarts
               and member.snapshots() == [], seconds=1.0,
               what="the job running, neither restarted nor snapshotted")


def test_an_action_from_another_site_is_refused_even_with_the_token(member, http):
    job = _stream_job(member)
    wait_until(lambda: job.status == JobStatus.RUNNING, what="the job to run")
    r = http.post(f"/api/jobs/{job.id}/suspend", token=TOKEN,
                  headers={"Origin": "http://elsewhere.example"})
    assert r.status == 403 and "another site" in r.json["message"]
    assert job.status == JobStatus.RUNNING


def test_every_action_is_logged_with_the_client_address(member, http, caplog):
    caplog.set_level(logging.INFO, logger="jetwake.dashboard")
    job = _stream_job(member)
    wait_until(lambda: job.status == JobStatus.RUNNING, what="the job to run")
    http.post(f"/api/jobs/{job.id}/restart", token="wrong")
    http.post(f"/api/jobs/{job.id}/restart", token=TOKEN)
    lines = [r.getMessage() for r in caplog.records if r.name == "jetwake.dashboard"]
    assert any(re.search(rf"restart of job '{job.id}' refused for 127\.0\.0\.1:\d+: wrong "
                         "token", ln) for ln in lines), lines
    assert any(re.search(rf"restart of job '{job.id}' requested by 127\.0\.0\.1:\d+", ln)
               for ln in lines), lines


def test_no_call_can_submit_a_job(member, http):
    job = _stream_job(member)
    for method, path in [("POST", "/api/jobs"), ("POST", "/api/submit"),
                         ("POST", f"/api/jobs/{job.id}/submit"), ("POST", "/api/jobs/new"),
                         ("POST", f"/api/jobs/{job.id}/start"), ("POST", "/"),
                         ("POST", f"/jobs/{job.id}")]:
        r = http.call(method, path, token=TOKEN, body={"pipeline": "x", "name": "injected"})
        assert r.status in (404, 405), (method, path, r.status)
    assert [c.name for c in member.coordinators()] == ["windows"]


# --- bad input ---------------------------------------------------------------------------------


def test_an_unknown_job_is_a_404_page_and_a_404_json_error(member, http):
    r = http.get("/api/jobs/no-such-job")
    assert r.status == 404 and r.headers["Content-Type"] == "application/json"
    assert "no-such-job" in r.json["message"] and r.json["type"] == "JobNotFoundError"
    r = http.get("/jobs/no-such-job")
    assert r.status == 404 and r.headers["Content-Type"].startswith("text/html")
    assert "No such job" in r.text and "no-such-job" in r.text
    r = http.post("/api/jobs/no-such-job/suspend", token=TOKEN)
    assert r.status == 404 and "no-such-job" in r.json["message"]


def test_api_errors_are_json_with_a_message(member, http):
    job = _stream_job(member)
    cases = [
        (http.get("/api/nothing-here"), 404),
        (http.post(f"/api/jobs/{job.id}/export-snapshot", token=TOKEN, body={}), 400),
        (http.post(f"/api/jobs/{job.id}/export-snapshot", token=TOKEN,
                   body={"name": "../etc"}), 400),
        (http.post(f"/api/jobs/{job.id}/export-snapshot", token=TOKEN, raw=b"{not json"), 400),
        (http.post(f"/api/jobs/{job.id}/explode", token=TOKEN), 404),
        (http.call("PUT", f"/api/jobs/{job.id}", token=TOKEN), 405),
    ]
    for reply, status in cases:
        assert reply.status == status, reply.text
        doc = reply.json
        assert doc["status"] == status and doc["message"] and doc["error"] == doc["message"]
    assert member.snapshots() == []


# --- ui_auth="required" ------------------------------------------------------------------------


def test_with_ui_auth_required_reading_needs_the_token_too(member):
    job = _stream_job(member)
    ms, http = _serve(member, ui_auth="required")
    try:
        for path in ("/api/jobs", f"/api/jobs/{job.id}", "/api/cluster", "/api/snapshots"):
            assert http.get(path).status == 403, path
            assert http.get(path, token="wrong").status == 403, path
            assert http.get(path, token=TOKEN).status == 200, path
        cookie = {"Cookie": f"{routes.TOKEN_COOKIE}={TOKEN}"}
        assert http.get("/api/jobs", headers=cookie).json[0]["name"] == "windows"
        # a page without the token is the form that asks for it, with no data of the member
        page = http.get(f"/jobs/{job.id}")
        assert page.status == 403 and "windows" not in page.text and job.id not in page.text
        assert http.get(f"/jobs/{job.id}", headers=cookie).status == 200
        assert http.get("/", headers={"Cookie": f"{routes.TOKEN_COOKIE}=wrong"}).status == 403
        # what the form itself needs, and Prometheus, stay open
        assert http.get("/static/app.js").status == 200
        assert http.get("/api/session").json["readable"] is False
        assert http.get("/metrics").status == 200 and http.get("/health").status == 200
        # an action still needs the header: the cookie is sent by the browser on its own
        r = http.post(f"/api/jobs/{job.id}/suspend", headers=cookie)
        assert r.status == 403 and job.status == JobStatus.RUNNING
    finally:
        ms.stop()


def test_ui_auth_required_without_a_token_or_a_service_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs the member's token"):
        routes.Dashboard(None, None, None, "required")
    with pytest.raises(ValueError, match="ui_auth must be one of open, required"):
        routes.Dashboard(None, None, "t", "closed")
    with Member() as embedded:  # serves no clients: nothing to answer through
        with pytest.raises(ValueError, match="a member that serves clients"):
            MetricsServer(embedded, "127.0.0.1", 0, ui_auth="required")


# --- the assets ----------------------------------------------------------------------------


def test_every_asset_comes_from_the_member_and_nothing_from_the_internet(member, http):
    page = http.get("/")
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert refs and all(ref.startswith("/") for ref in refs), refs
    for ref in refs:
        r = http.get(ref)
        assert r.status == 200, ref
        # the only absolute address in them is SVG's namespace name, which is never fetched
        assert set(re.findall(r"https?://[^\s\"'`)]+", r.text)) <= \
            {"http://www.w3.org/2000/svg"}, ref
    assert http.get("/static/app.js").headers["Content-Type"].startswith("text/javascript")
    assert http.get("/static/../metrics.py").status == 404
    assert http.get("/static/nope.js").status == 404


def test_without_a_member_service_the_metrics_port_serves_metrics_at_the_root():
    with Member() as embedded:
        ms = MetricsServer(embedded, "127.0.0.1", 0).start()
        try:
            http = Http(f"http://127.0.0.1:{ms.address[1]}")
            assert "jetwake_jobs" in http.get("/").text
            assert http.post("/api/jobs/x/suspend", token="t").status == 405
        finally:
            ms.stop()


# --- jetwake member start ----------------------------------------------------------------------


@pytest.mark.integration
def test_member_start_serves_the_dashboard_and_requires_the_token_when_asked(tmp_path):
    member = DashboardMember(tmp_path, "--ui-auth", "required")
    try:
        job = member.submit_stream(tmp_path, "windows")
        http = member.http
        assert http.get("/").status == 403
        assert http.get("/", headers={"Cookie": f"jetwake_token={TOKEN}"}).status == 200
        assert http.get("/api/jobs").status == 403
        [j] = http.get("/api/jobs", token=TOKEN).json
        assert j["id"] == job["id"] and j["name"] == "windows"
        assert "jetwake_vertex_items_out_total" in http.get("/metrics").text
        assert http.post(f"/api/jobs/{job['id']}/suspend", token=TOKEN).status == 200
        wait_until(lambda: member.status("windows") == "SUSPENDED",
                   what="SUSPENDED", timeout=30, interval=0.2)
        assert re.search(r"dashboard: suspend of job '\S+' requested by 127\.0\.0\.1:\d+",
                         member.log)
        assert "dashboard on http://127.0.0.1:" in member.log
    finally:
        member.stop()


@pytest.mark.parametrize("args, needs", [
    (["--ui-auth", "required", "--metrics-port", "0"], "--token"),
    (["--ui-auth", "required", "--token", "t"], "--metrics-port"),
])
def test_member_start_refuses_ui_auth_required_without_what_it_needs(args, needs):
    r = subprocess.run([sys.executable, "-m", "jetwake.engine.server.cli", "member", "start",
                        "--port", str(free_port()), *args], capture_output=True, text=True,
                       timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and needs in r.stderr, r.stderr


# --- Kafka and the cluster -----------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.kafka
def test_a_kafka_source_shows_its_lag_per_partition_and_its_dead_letters(
        member, http, kafka_bootstrap, kafka_topic):
    from confluent_kafka import Producer
    from jetwake import Sources
    topic, dlq = kafka_topic(partitions=2), kafka_topic()
    props = {"bootstrap.servers": kafka_bootstrap}
    producer = Producer(props)
    for i in range(400):
        producer.produce(topic, value=b"{bad" if i % 50 == 7 else json.dumps(i).encode(),
                         partition=i % 2)
    producer.flush()
    p = Pipeline()
    (p.read_from(Sources.kafka(topic, props, value_deserializer="json",
                               on_error="dead_letter", dead_letter_topic=dlq))
      .write_to(Sink("slow-sink", ProcessorMetaSupplier.of(SlowSink, 1))))
    job = member.new_job(p, JobConfig(name="from-kafka"))

    def read():
        d = http.get(f"/api/jobs/{job.id}").json
        # a partition's position is known once its consumer has fetched from it
        return d if len(d["kafka_lag"]) == 2 and all(
            x["end"] == 200 and x["position"] is not None for x in d["kafka_lag"]) else None
    detail = wait_until(read, what="the lag of both partitions", timeout=60, interval=0.2)
    lags = {x["partition"]: x for x in detail["kafka_lag"]}
    assert set(lags) == {0, 1} and {x["topic"] for x in lags.values()} == {topic}
    for x in lags.values():
        assert x["vertex"] == detail["dag"]["vertices"][0]["name"]
        assert x["lag"] == x["end"] - x["position"] and x["lag"] >= 0
    # once every record is read the lag is 0, and the 8 that could not be read are counted
    source = detail["dag"]["vertices"][0]["name"]

    def drained():
        d = http.get(f"/api/jobs/{job.id}").json
        return d if _vertex(d, source)["dead_letters"] == 8 and all(
            x["lag"] == 0 and x["position"] == 200 for x in d["kafka_lag"]) else None
    wait_until(drained, what="every record read, 8 dead letters", timeout=60, interval=0.2)


@pytest.mark.integration
@pytest.mark.kafka
def test_every_member_of_a_cluster_shows_the_same_jobs_with_counts_from_all_members(
        tmp_path, kafka_bootstrap):
    from support.cluster_processes import ClusterProcesses
    cluster = ClusterProcesses(tmp_path, kafka_bootstrap, token=TOKEN)
    ports = [free_port(), free_port()]
    try:
        members = [cluster.start_member("--metrics-port", str(p)) for p in ports]
        wait_until(lambda: all(m.ready() for m in members), what="both members serving", timeout=60)
        wait_until(lambda: len(cluster.cluster(members[0])["members"]) == 2,
                   what="a cluster of two", timeout=60, interval=0.2)
        path = tmp_path / "stream_job.py"
        from support.dashboard import STREAM_JOB_PY
        path.write_text(STREAM_JOB_PY)
        job = cluster.cli_json(members[0], "submit", str(path), "--name", "windows",
                               "--guarantee", "at_least_once", "--snapshot-interval", "1000")
        dashboards = [Http(f"http://127.0.0.1:{p}") for p in ports]

        def both_running():
            lists = [d.get("/api/jobs").json for d in dashboards]
            return lists if all(len(x) == 1 and x[0]["status"] == "RUNNING"
                                for x in lists) else None
        lists = wait_until(both_running,
                           what="the job RUNNING on both dashboards", timeout=60, interval=0.2)
        assert lists[0][0]["id"] == lists[1][0]["id"] == job["id"]
        for d in dashboards:
            detail = wait_until(lambda: (lambda x: x if _vertex(
                x, "window-aggregate-accumulate")["processors"] == 2 else None)(
                    d.get(f"/api/jobs/{job['id']}").json),
                                what="both members' shares", timeout=30, interval=0.2)
            assert detail["id"] == job["id"]
            info = d.get("/api/cluster").json
            assert len(info["members"]) == 2
            assert all(m["rss_bytes"] and m["rss_bytes"] > 0 for m in info["members"])
        # an action through either member reaches the job
        assert dashboards[1].post(f"/api/jobs/{job['id']}/suspend", token=TOKEN).status == 200
        wait_until(lambda: all(d.get("/api/jobs").json[0]["status"] == "SUSPENDED"
                               for d in dashboards),
                   what="SUSPENDED on both", timeout=60, interval=0.2)
    finally:
        cluster.stop_all()
