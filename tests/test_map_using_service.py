"""map_using_service and map_using_service_async against a real HTTP service started by the
test (tests/support/http_service.py), on one member: results, order, concurrency, retries,
failures, timeouts, the service's life, the grouped form, bad input, and the snapshot barrier
and watermarks with calls in flight (processor level)."""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest
import tenacity

from jetwake import (
    JobConfig, Member, Pipeline, PipelineError, ServiceError, ServiceFactory, Sinks, Sources,
    TestSources, Watermark,
)
from jetwake.engine.core.processor import Inbox, Outbox, ProcessorContext
from jetwake.engine.execution.execution_metrics import latency_percentile
from jetwake.engine.processors.map_using_service import MapUsingServiceAsyncProcessor
from support.http_service import HttpService, aiohttp_factory, fetch
from support.snapshot_fixtures import CountingSink
from support.waiting import wait_until


@pytest.fixture(scope="module")
def member():
    m = Member(local_parallelism=2)
    yield m
    m.shutdown()


def run(member: Member, p: Pipeline):
    job = member.new_job(p)
    job.join(60)
    return job


def call_service(url: str):
    async def call(session, x):
        return await fetch(session, url, x)
    return call


def test_async_results_are_in_input_order(member):
    # later items answer sooner: only the stage's ordering puts them back in order
    slow = {x: (20 - x % 20) * 2 for x in range(200)}
    with HttpService(latency_ms=1, slow=slow) as svc:
        p = Pipeline()
        (p.read_from(Sources.items(range(200)))
          .map_using_service_async(aiohttp_factory(), call_service(svc.url), max_concurrent=16)
          .set_local_parallelism(1)
          .write_to(Sinks.list("ordered")))
        run(member, p)
    assert list(member.get_list("ordered")) == [x * 10 for x in range(200)]


def test_unordered_results_are_complete(member):
    slow = {x: (20 - x % 20) * 2 for x in range(200)}
    with HttpService(latency_ms=1, slow=slow) as svc:
        p = Pipeline()
        (p.read_from(Sources.items(range(200)))
          .map_using_service_async(aiohttp_factory(), call_service(svc.url), max_concurrent=16,
                                   preserve_order=False)
          .set_local_parallelism(1)
          .write_to(Sinks.list("unordered")))
        run(member, p)
    out = list(member.get_list("unordered"))
    assert sorted(out) == [x * 10 for x in range(200)]
    assert out != sorted(out)  # completion order, which the latencies scramble


def test_calls_in_flight_reach_max_concurrent(member):
    # calls long enough for the server to see every call of a wave at once, even on a busy
    # machine
    with HttpService(latency_ms=100) as svc:
        p = Pipeline()
        (p.read_from(Sources.items(range(144)))
          .map_using_service_async(aiohttp_factory(), call_service(svc.url), max_concurrent=24)
          .set_local_parallelism(1)
          .write_to(Sinks.list("concurrent")))
        job = run(member, p)
    assert svc.max_in_flight == 24
    m = job.metrics()["map-using-service"]
    assert m["calls"] == 144 and m["calls_in_flight"] == 0
    # the latency histogram's percentiles: no call is faster than the service's 100 ms
    assert 100 <= m["call_latency_p50_ms"] <= m["call_latency_p95_ms"] \
        <= m["call_latency_p99_ms"]


def test_retries_until_a_call_succeeds(member):
    with HttpService(fail_first=2) as svc:
        p = Pipeline()
        (p.read_from(Sources.items(range(40)))
          .map_using_service_async(
              aiohttp_factory(), call_service(svc.url),
              retry=tenacity.AsyncRetrying(stop=tenacity.stop_after_attempt(3),
                                           wait=tenacity.wait_fixed(0.01)))
          .write_to(Sinks.list("retried")))
        job = run(member, p)
    assert sorted(member.get_list("retried")) == [x * 10 for x in range(40)]
    assert svc.requests == 120
    m = job.metrics()["map-using-service"]
    assert (m["calls"], m["call_retries"], m["call_failures"]) == (40, 80, 0)


def test_retry_as_tenacity_keyword_arguments(member):
    with HttpService(fail_first=1) as svc:
        p = Pipeline()
        (p.read_from(Sources.items(range(10)))
          .map_using_service_async(aiohttp_factory(), call_service(svc.url),
                                   retry={"stop": tenacity.stop_after_attempt(2)})
          .write_to(Sinks.list("retried-kw")))
        run(member, p)
    assert sorted(member.get_list("retried-kw")) == [x * 10 for x in range(10)]


def test_calls_that_still_fail_go_to_errors_to(member):
    with HttpService(fail={3, 17}) as svc:
        p = Pipeline()
        (p.read_from(Sources.items(range(20)))
          .map_using_service_async(aiohttp_factory(), call_service(svc.url),
                                   retry={"stop": tenacity.stop_after_attempt(2)},
                                   errors_to=Sinks.list("call-errors"))
          .write_to(Sinks.list("partly")))
        job = run(member, p)
    assert sorted(member.get_list("partly")) == [x * 10 for x in range(20) if x not in (3, 17)]
    errors = sorted(member.get_list("call-errors"), key=lambda r: r["item"])
    assert [r["item"] for r in errors] == [3, 17]
    assert all(r["attempts"] == 2 and "HTTP 500" in r["error"] for r in errors)
    assert errors[0]["stage"] == "map-using-service"
    assert job.metrics()["map-using-service"]["call_failures"] == 2


def test_a_failing_call_without_errors_to_fails_the_job_naming_the_item(member):
    with HttpService(fail={7}) as svc:
        p = Pipeline()
        (p.read_from(Sources.items(range(10)))
          .map_using_service_async(aiohttp_factory(), call_service(svc.url))
          .write_to(Sinks.noop()))
        job = member.new_job(p)
        with pytest.raises(Exception) as err:
            job.join(60)
    text = str(err.value)
    assert "map-using-service" in text and "item 7" in text and "HTTP 500" in text


def test_a_call_longer_than_timeout_ms_fails(member):
    with HttpService(slow={5: 3000}) as svc:
        p = Pipeline()
        (p.read_from(Sources.items(range(10)))
          .map_using_service_async(aiohttp_factory(), call_service(svc.url), timeout_ms=200,
                                   errors_to=Sinks.list("timeouts"))
          .write_to(Sinks.list("in-time")))
        run(member, p)
    assert sorted(member.get_list("in-time")) == [x * 10 for x in range(10) if x != 5]
    [record] = list(member.get_list("timeouts"))
    assert record["item"] == 5 and record["error_type"] == "CallTimeout"


def blocking_call(url: str, x: int) -> int:
    from urllib.request import urlopen
    with urlopen(f"{url}?x={x}", timeout=10) as reply:
        return int(reply.read())


def test_blocking_calls_that_fail_go_to_errors_to_or_fail_the_job(member):
    with HttpService(fail={4}) as svc:
        p = Pipeline()
        (p.read_from(Sources.items(range(8)))
          .map_using_service(ServiceFactory(lambda: svc.url), blocking_call,
                             errors_to=Sinks.list("blocking-errors"))
          .write_to(Sinks.list("blocking")))
        job = run(member, p)
        assert sorted(member.get_list("blocking")) == [x * 10 for x in range(8) if x != 4]
        [record] = list(member.get_list("blocking-errors"))
        assert record["item"] == 4 and "HTTP Error 500" in record["error"]
        assert job.metrics()["map-using-service"]["call_failures"] == 1

        p = Pipeline()
        (p.read_from(Sources.items(range(8)))
          .map_using_service(ServiceFactory(lambda: svc.url), blocking_call)
          .write_to(Sinks.noop()))
        with pytest.raises(Exception) as err:
            run(member, p)
    assert "map-using-service" in str(err.value) and "item 4" in str(err.value)


class Lifecycle:
    """Counts the services created and destroyed (in this process: the member is here)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created = 0
        self.destroyed = 0

    def create(self):
        with self.lock:
            self.created += 1
            return {"id": self.created}

    def destroy(self, service) -> None:
        with self.lock:
            self.destroyed += 1


@pytest.mark.parametrize("shared_per, services", [("processor", 4), ("member", 1)])
def test_services_are_created_per_processor_or_per_member_and_destroyed_at_job_end(
        member, shared_per, services):
    life = Lifecycle()
    p = Pipeline()
    (p.read_from(Sources.items(range(400)))
      .rebalance()
      .map_using_service(ServiceFactory(life.create, life.destroy, shared_per=shared_per),
                         lambda service, x: x)
      .set_local_parallelism(4)
      .write_to(Sinks.list(f"life-{shared_per}")))
    run(member, p)
    assert len(member.get_list(f"life-{shared_per}")) == 400
    assert (life.created, life.destroyed) == (services, services)


def test_the_service_is_destroyed_when_the_job_is_cancelled(member):
    life = Lifecycle()

    async def ident(service, x):
        return x
    p = Pipeline()
    (p.read_from(TestSources.item_stream(200, lambda ts, seq: seq))
      .map_using_service_async(ServiceFactory(life.create, life.destroy, "member"), ident)
      .write_to(Sinks.list("cancelled")))
    job = member.new_job(p)
    wait_until(lambda: len(member.get_list("cancelled")) > 5, timeout=30)
    assert (life.created, life.destroyed) == (1, 0)
    job.cancel()
    wait_until(lambda: job.status.is_terminal, timeout=30)
    wait_until(lambda: life.destroyed == 1, timeout=10, what="the service destroyed")


def test_a_factory_that_raises_fails_the_job_naming_the_stage_and_cause(member):
    def broken():
        raise ConnectionRefusedError("no model server on port 9")
    p = Pipeline()
    (p.read_from(Sources.items(range(3)))
      .map_using_service(ServiceFactory(broken), lambda s, x: x).set_name("enrich")
      .write_to(Sinks.noop()))
    with pytest.raises(ServiceError) as err:  # processors start in init: the start fails
        member.new_job(p).join(30)
    assert "stage 'enrich'" in str(err.value)
    assert "ConnectionRefusedError: no model server on port 9" in str(err.value)
    assert isinstance(err.value.__cause__, ConnectionRefusedError)


def test_grouped_calls_see_each_keys_items_in_order_one_at_a_time(member):
    async def call(session, x):
        return await fetch(session, svc.url, x, key=f"k{x % 5}")
    with HttpService(latency_ms=2, slow={x: 10 for x in range(0, 150, 7)}) as svc:
        p = Pipeline()
        (p.read_from(Sources.items(range(150)))
          .group_by(lambda x: x % 5)
          .map_using_service_async(aiohttp_factory(), call, max_concurrent=8,
                                   preserve_order=False)
          .write_to(Sinks.list("grouped")))
        run(member, p)
    assert sorted(member.get_list("grouped")) == [x * 10 for x in range(150)]
    for k in range(5):
        assert svc.by_key[f"k{k}"] == list(range(k, 150, 5))
    assert svc.key_overlaps == 0
    assert svc.max_in_flight > 1  # different keys did proceed together


def test_grouped_sync_calls_see_each_keys_items_in_order(member):
    seen: dict[int, list[int]] = {}
    lock = threading.Lock()

    def record(service, x):
        with lock:
            seen.setdefault(x % 3, []).append(x)
        return x
    p = Pipeline()
    (p.read_from(Sources.items(range(90)))
      .group_by(lambda x: x % 3)
      .map_using_service(ServiceFactory(dict), record)
      .write_to(Sinks.noop()))
    run(member, p)
    assert seen == {k: list(range(k, 90, 3)) for k in range(3)}


# --- bad input, refused when the pipeline is built ----------------------------------------------

async def _async_fn(service, item):
    return item


def _sync_fn(service, item):
    return item


class _AsyncCallable:
    async def __call__(self, service, item):
        return item


@pytest.mark.parametrize("build, message", [
    (lambda s: s.map_using_service_async(ServiceFactory(dict), _sync_fn),
     "plain function, but map_using_service_async calls an async one"),
    (lambda s: s.map_using_service(ServiceFactory(dict), _async_fn),
     "is an async function, which map_using_service would never await"),
    (lambda s: s.map_using_service(ServiceFactory(dict), functools.partial(_async_fn)),
     "is an async function"),
    (lambda s: s.map_using_service(ServiceFactory(dict), _AsyncCallable()),
     "is an async function"),
    (lambda s: s.map_using_service_async(ServiceFactory(dict), _async_fn, max_concurrent=0),
     "max_concurrent must be at least 1"),
    (lambda s: s.map_using_service_async(ServiceFactory(dict), _async_fn, max_concurrent=2.5),
     "max_concurrent must be an int"),
    (lambda s: s.map_using_service_async(ServiceFactory(dict), _async_fn, timeout_ms=0),
     "timeout_ms must be positive"),
    (lambda s: s.map_using_service_async(dict, _async_fn),
     "service_factory expects a jetwake.ServiceFactory"),
    (lambda s: s.map_using_service_async(ServiceFactory(dict), _async_fn, retry=3),
     "retry expects a tenacity policy"),
    (lambda s: s.group_by(len).map_using_service_async(ServiceFactory(dict), _sync_fn),
     "group_by().map_using_service_async() after stage 'items'"),
])
def test_bad_service_stages_are_refused_naming_the_stage_and_the_fix(build, message):
    stage = Pipeline().read_from(Sources.items([1]))
    with pytest.raises((TypeError, PipelineError)) as err:
        build(stage)
    assert message in str(err.value)
    assert "'items'" in str(err.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(create_fn=None), "create_fn must be a callable"),
    (dict(create_fn=dict, destroy_fn="close"), "destroy_fn must be a callable"),
    (dict(create_fn=dict, shared_per="job"), "shared_per must be 'processor'"),
])
def test_bad_service_factories_are_refused_at_construction(kwargs, message):
    with pytest.raises((TypeError, ValueError)) as err:
        ServiceFactory(**kwargs)
    assert message in str(err.value)


# --- the snapshot barrier and watermarks with calls in flight (processor level) ---------------

class Gate:
    """A service whose calls wait until the test opens the gate."""

    def __init__(self) -> None:
        self.opened: asyncio.Event | None = None
        self.started = 0

    async def call(self, service, x):
        if self.opened is None:
            self.opened = asyncio.Event()
        self.started += 1
        await self.opened.wait()
        return x * 10


def gated_processor(gate: Gate, timestamped: bool) -> MapUsingServiceAsyncProcessor:
    proc = MapUsingServiceAsyncProcessor("svc", ServiceFactory(dict), gate.call, None,
                                         timestamped, False, 8, True, None, None)
    proc.outbox = Outbox(1)
    proc.init(ProcessorContext(job_id="j", job_name="j", vertex_name="svc",
                               global_processor_index=0, local_processor_index=0,
                               local_parallelism=1, total_parallelism=1, member_index=0,
                               member_count=1, processing_guarantee="exactly_once"))
    return proc


def open_gate(proc, gate: Gate) -> None:
    loop = proc._lease.loop.loop
    loop.call_soon_threadsafe(gate.opened.set)


def test_a_snapshot_waits_for_the_calls_in_flight_and_follows_their_results():
    gate = Gate()
    proc = gated_processor(gate, timestamped=False)
    try:
        proc.process(0, Inbox([1, 2, 3]))
        wait_until(lambda: gate.started == 3, timeout=10)
        # the barrier must wait: three calls are in flight
        assert not proc.save_to_snapshot()
        assert not proc.save_to_snapshot()
        assert proc.outbox.drain() == []
        assert proc.context.metrics["calls_in_flight"] == 3
        open_gate(proc, gate)
        wait_until(proc.save_to_snapshot, timeout=10, what="save_to_snapshot() to be done")
        # every result is in the outbox now, ahead of the barrier the tasklet adds next
        assert proc.outbox.drain() == [10, 20, 30]
        assert proc.outbox.drain_snapshot() == []  # no call state is saved
    finally:
        proc.close()


def test_a_watermark_waits_for_the_calls_started_before_it():
    gate = Gate()
    proc = gated_processor(gate, timestamped=True)
    try:
        proc.process(0, Inbox([(100, 1), (105, 2)]))
        wait_until(lambda: gate.started == 2, timeout=10)
        assert proc.try_process_watermark(Watermark(105))
        assert proc.outbox.drain() == []  # held: it must not overtake the items
        proc.process(0, Inbox([(110, 3)]))
        open_gate(proc, gate)
        wait_until(lambda: proc.complete(), timeout=10)
        assert proc.outbox.drain() == [(100, 10), (105, 20), Watermark(105), (110, 30)]
    finally:
        proc.close()


def test_latency_percentiles_come_from_summed_buckets():
    counters = {"call_latency_ms_bucket_10": 50, "call_latency_ms_bucket_20": 40,
                "call_latency_ms_bucket_50": 10}
    assert latency_percentile(counters, 50) == 10.0
    assert latency_percentile(counters, 90) == 20.0
    assert latency_percentile(counters, 95) == 45.0  # halfway through the (40, 50] bucket
    assert latency_percentile({}, 50) is None


def test_prometheus_and_the_dashboard_show_the_service_calls(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from jetwake.engine.server.metrics import MetricsServer
    from support.dashboard import TOKEN, Http

    async def slow(service, x):
        await asyncio.sleep(0.02)
        return x
    m = Member(str(tmp_path / "data"), port=0, token=TOKEN, cooperative_threads=1,
               local_parallelism=1)
    ms = None
    try:
        p = Pipeline()
        (p.read_from(TestSources.item_stream(300, lambda ts, seq: seq))
          .map_using_service_async(ServiceFactory(dict), slow).set_name("enrich")
          .write_to(Sinks.noop()))
        job = m.new_job(p)
        wait_until(lambda: job.metrics().get("enrich", {}).get("calls", 0) > 50, timeout=30)
        reg = CollectorRegistry()
        from jetwake.engine.server.metrics import JetwakeCollector
        reg.register(JetwakeCollector(m))
        families = {f.name: f for f in
                    text_string_to_metric_families(generate_latest(reg).decode())}
        hist = families["jetwake_vertex_call_latency_ms"]
        assert hist.type == "histogram"
        buckets = {s.labels["le"]: s.value for s in hist.samples
                   if s.name.endswith("_bucket") and s.labels["vertex"] == "enrich"}
        assert buckets["15"] == 0 and buckets["+Inf"] > 50  # every call took 20 ms or more
        assert families["jetwake_vertex_calls_in_flight"].type == "gauge"
        assert families["jetwake_vertex_calls"].type == "counter"
        ms = MetricsServer(m, "127.0.0.1", 0).start()
        http = Http(f"http://127.0.0.1:{ms.address[1]}")
        detail = http.get(f"/api/jobs/{job.id}", token=TOKEN).json
        [v] = [v for v in detail["dag"]["vertices"] if v["name"] == "enrich"]
        assert v["counters"]["calls"] > 50
        assert 20 <= v["counters"]["call_latency_p50_ms"] <= 100
        assert not any(k.startswith("call_latency_ms_bucket") for k in v["counters"])
        job.cancel()
    finally:
        if ms is not None:
            ms.stop()
        m.shutdown(graceful=False)


def test_a_snapshot_taken_with_calls_in_flight_holds_every_result_before_its_barrier():
    async def slow(service, x):
        await asyncio.sleep(0.05)
        return x
    # 200 items a second into calls of 50 ms, 16 at a time: calls are always in flight
    p = Pipeline()
    (p.read_from(TestSources.item_stream(200, lambda ts, seq: seq)).set_local_parallelism(1)
      .map_using_service_async(ServiceFactory(dict), slow, max_concurrent=16)
      .set_local_parallelism(1)
      .custom_transform("counter", CountingSink).set_local_parallelism(1)
      .write_to(Sinks.noop()))
    with Member() as m:
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                     snapshot_interval_ms=3_600_000))
        wait_until(lambda: job.metrics().get("counter", {}).get("items_in", 0) > 50,
                   timeout=30)
        # the premise: calls are in flight when the snapshot starts
        assert job.metrics()["map-using-service"]["calls_in_flight"] > 0
        saved = m.snapshot_store.read(job.take_snapshot())
        job.cancel()
    [source] = [v for name, v in saved.items() if name not in ("counter",
                                                               "map-using-service")]
    [(_, read)] = source  # the source's position: the items before its barrier
    [(_, counted)] = saved["counter"]
    # the barrier reached the sink after the result of every item read before it
    assert read > 50 and counted == read
