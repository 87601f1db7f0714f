"""Prometheus metrics of a member, and the HTTP endpoint that serves them with ``/health``.

The collector reads the member's jobs at scrape time (nothing is counted twice and nothing is
kept for jobs that are gone):

=====================================  ======  ===========================================
``jetwake_jobs``                       gauge   jobs per status
``jetwake_job_status``                 gauge   1 for the job's current status (state set)
``jetwake_job_restarts_total``         counter restarts of the job's execution
``jetwake_vertex_items_in_total``      counter items a vertex received (this member)
``jetwake_vertex_items_out_total``     counter items a vertex emitted
``jetwake_vertex_queue_fill_ratio``    gauge   fullest inbound queue of the vertex (0..1)
``jetwake_vertex_watermark_lag_ms``    gauge   wall clock minus the vertex's input watermark
``jetwake_vertex_late_events_total``   counter events dropped as late (windows, stateful)
``jetwake_vertex_<counter>_total``     counter any other counter a processor keeps in
                                               ``context.metrics`` (``bad_timestamps``...)
``jetwake_vertex_kafka_consumer_lag``  gauge   records behind the log end, Kafka sources
                                               (read from the source's consumer, or a
                                               ``kafka_consumer_lag`` value it reports)
``jetwake_vertex_<name>_lag``          gauge   other processor values ending in ``lag``
``jetwake_vertex_<name>_in_flight``    gauge   processor values that are a current size,
``jetwake_vertex_<name>_entries``              not a count: ending in ``_in_flight``
``jetwake_vertex_<name>_bytes``                (``calls_in_flight``), ``_entries`` (a table's
                                               or a join state's size) or ``_bytes``
``jetwake_vertex_call_latency_ms``     histog. latency of a service stage's calls
                                               (``map_using_service``), ``le`` buckets in ms;
                                               ``calls``, ``call_retries``, ``call_failures``
                                               are ``jetwake_vertex_<counter>_total``
``jetwake_stage_items_in_total``       counter items a stateless stage fused into a vertex
                                               took (this member)
``jetwake_stage_items_out_total``      counter items it gave to the next stage
``jetwake_snapshot_duration_ms``       gauge   the job's last snapshot: duration
``jetwake_snapshot_size_bytes``        gauge   ... its size
``jetwake_snapshot_entries``           gauge   ... its entry count
``jetwake_snapshot_id``                gauge   ... its id
``jetwake_snapshots_total``            counter snapshots taken by this member for the job
``jetwake_snapshot_failures_total``    counter snapshots that could not be written (a full
                                               disk): rolled back, the job runs on
=====================================  ======  ===========================================

Labels: ``job`` (name) and ``job_id``; vertex metrics add ``vertex``; stage metrics add
``stage``, ``kind`` (map, filter, flat_map) and the ``vertex`` the stage is fused into. A stage
with a vertex of its own is measured by the vertex metrics (the vertex bears its name).
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Callable, Iterator, cast

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from jetwake.engine.execution.execution_metrics import (
    LATENCY_BUCKET_PREFIX, LATENCY_SUM, latency_buckets,
)
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.server.dashboard.routes import Dashboard
from jetwake.engine.server.listen_socket import serve_on

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.server.member import Member

__all__ = ["JetwakeCollector", "MetricsServer", "vertex_gauges", "kafka_consumer_lag"]

log = logging.getLogger("jetwake.metrics")

_NO_WATERMARK = -(2**63)
_NAME_OK = re.compile(r"[^a-zA-Z0-9_]")


def _metric_name(key: str) -> str:
    name = _NAME_OK.sub("_", key).strip("_").lower()
    return name or "unnamed"


def vertex_gauges(coordinator) -> dict[str, dict[str, float]]:
    """Queue fill ratio and watermark lag per vertex of a job's current execution."""
    out: dict[str, dict[str, float]] = {}
    now_ms = time.time() * 1000
    for t in coordinator.running_tasklets():
        g = out.setdefault(t.context.vertex_name, {})
        g["queue_fill_ratio"] = max(g.get("queue_fill_ratio", 0.0), t.input_queue_fill())
        if "kafka_consumer_lag" not in t.context.metrics:
            klag = kafka_consumer_lag(t.processor)
            if klag is not None:
                g["kafka_consumer_lag"] = g.get("kafka_consumer_lag", 0) + klag
        wm = t.coalescer.last_emitted
        if isinstance(wm, int) and wm > _NO_WATERMARK and wm > 0:
            lag = max(0.0, now_ms - wm)
            g["watermark_lag_ms"] = max(g.get("watermark_lag_ms", 0.0), lag)
    return out


def kafka_consumer_lag(processor: Any) -> int | None:
    """Records behind the end of the log, summed over the partitions a Kafka source processor
    reads (Processor.partition_lag). None for other processors, or before the first fetch."""
    lags = [p["lag"] for p in processor.partition_lag() or () if p["lag"] is not None]
    return sum(lags) if lags else None


class JetwakeCollector:
    """A prometheus-client collector over the jobs of one member."""

    def __init__(self, member: "Member") -> None:
        self.member = member

    def describe(self) -> list:
        return []  # dynamic: no checks at registration time

    def collect(self) -> Iterator[Metric]:
        member = self.member
        coords = member.coordinators()
        jobs_by_status = GaugeMetricFamily("jetwake_jobs", "Jobs on this member per status",
                                           labels=["status"])
        counts = {s.value: 0 for s in JobStatus}
        for c in coords:
            counts[c.status.value] += 1
        for s, n in counts.items():
            jobs_by_status.add_metric([s], n)
        yield jobs_by_status

        status = GaugeMetricFamily("jetwake_job_status", "1 for the job's current status",
                                   labels=["job", "job_id", "status"])
        restarts = CounterMetricFamily("jetwake_job_restarts", "Restarts of the job",
                                       labels=["job", "job_id"])
        items_in = CounterMetricFamily("jetwake_vertex_items_in",
                                       "Items received by the vertex's processors on this member",
                                       labels=["job", "job_id", "vertex"])
        items_out = CounterMetricFamily("jetwake_vertex_items_out",
                                        "Items emitted by the vertex's processors on this member",
                                        labels=["job", "job_id", "vertex"])
        fill = GaugeMetricFamily("jetwake_vertex_queue_fill_ratio",
                                 "Fill of the vertex's fullest inbound queue (0..1)",
                                 labels=["job", "job_id", "vertex"])
        wm_lag = GaugeMetricFamily("jetwake_vertex_watermark_lag_ms",
                                   "Wall clock minus the vertex's input watermark, ms",
                                   labels=["job", "job_id", "vertex"])
        kafka_lag = GaugeMetricFamily("jetwake_vertex_kafka_consumer_lag",
                                      "Kafka records behind the end of the partitions the "
                                      "vertex reads", labels=["job", "job_id", "vertex"])
        late = CounterMetricFamily("jetwake_vertex_late_events",
                                   "Events dropped because they were late",
                                   labels=["job", "job_id", "vertex"])
        snap_ms = GaugeMetricFamily("jetwake_snapshot_duration_ms",
                                    "Duration of the job's last snapshot, ms",
                                    labels=["job", "job_id"])
        snap_bytes = GaugeMetricFamily("jetwake_snapshot_size_bytes",
                                       "Size of the job's last snapshot, bytes",
                                       labels=["job", "job_id"])
        snap_entries = GaugeMetricFamily("jetwake_snapshot_entries",
                                         "Entries in the job's last snapshot",
                                         labels=["job", "job_id"])
        snap_id = GaugeMetricFamily("jetwake_snapshot_id", "Id of the job's last snapshot",
                                    labels=["job", "job_id"])
        snap_count = CounterMetricFamily("jetwake_snapshots",
                                         "Snapshots taken of the job by this member",
                                         labels=["job", "job_id"])
        snap_failures = CounterMetricFamily(
            "jetwake_snapshot_failures",
            "Snapshots of the job that could not be written (a full disk, say); each was "
            "rolled back and the job ran on", labels=["job", "job_id"])
        stage_labels = ["job", "job_id", "stage", "kind", "vertex"]
        stage_in = CounterMetricFamily("jetwake_stage_items_in",
                                       "Items a stateless stage fused into a vertex took, on "
                                       "this member", labels=stage_labels)
        stage_out = CounterMetricFamily("jetwake_stage_items_out",
                                        "Items a stateless stage fused into a vertex gave to "
                                        "the next stage, on this member", labels=stage_labels)
        custom: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        latency = HistogramMetricFamily("jetwake_vertex_call_latency_ms",
                                        "Latency of a service stage's calls (ms), retries "
                                        "included", labels=["job", "job_id", "vertex"])

        for c in coords:
            jl = [c.name, c.job_id]
            for s in JobStatus:
                status.add_metric(jl + [s.value], 1 if c.status == s else 0)
            restarts.add_metric(jl, c.restart_count)
            rec = c.last_snapshot
            if rec is not None:
                snap_ms.add_metric(jl, rec.duration_ms)
                snap_bytes.add_metric(jl, rec.size_bytes)
                snap_entries.add_metric(jl, rec.entry_count)
                snap_id.add_metric(jl, rec.snapshot_id)
            snap_count.add_metric(jl, c.snapshot_count)
            snap_failures.add_metric(jl, c.snapshot_failures)
            if c.status.is_terminal:
                continue
            try:
                per_vertex = c.vertex_metrics()
                per_stage = c.stage_metrics()
                gauges = vertex_gauges(c)
            except Exception:  # noqa: BLE001 - an execution may end while it is read
                log.debug("reading metrics of job %s", c.name, exc_info=True)
                continue
            for vertex, m in per_vertex.items():
                vl = jl + [vertex]
                items_in.add_metric(vl, m.get("items_in", 0))
                items_out.add_metric(vl, m.get("items_out", 0))
                for key, value in m.items():
                    if key in ("items_in", "items_out"):
                        continue
                    if key == "late_events":
                        late.add_metric(vl, value)
                        continue
                    if key == "kafka_consumer_lag":
                        kafka_lag.add_metric(vl, value)
                        continue
                    if key.startswith(LATENCY_BUCKET_PREFIX) or key == LATENCY_SUM:
                        continue  # exported as the histogram below
                    name = _metric_name(key)
                    fam = custom.get(name)
                    if fam is None:
                        if name.endswith(("lag", "_in_flight", "_entries", "_bytes")):
                            fam = GaugeMetricFamily(f"jetwake_vertex_{name}",
                                                    f"Processor value '{key}'",
                                                    labels=["job", "job_id", "vertex"])
                        else:
                            fam = CounterMetricFamily(f"jetwake_vertex_{name}",
                                                      f"Processor counter '{key}'",
                                                      labels=["job", "job_id", "vertex"])
                        custom[name] = fam
                    fam.add_metric(vl, value)
                buckets = latency_buckets(m)
                if buckets:
                    cumulative: list[tuple[str, float]] = []
                    total = 0.0
                    for upper, calls in buckets:
                        total += calls
                        cumulative.append(("+Inf" if upper == float("inf") else f"{upper:g}",
                                           total))
                    latency.add_metric(vl, cumulative, m.get(LATENCY_SUM, 0.0))
            for stage, sm in per_stage.items():
                sl = jl + [stage, sm.kind, sm.vertex]
                stage_in.add_metric(sl, sm.items_in)
                stage_out.add_metric(sl, sm.items_out)
            for vertex, g in gauges.items():
                vl = jl + [vertex]
                fill.add_metric(vl, g.get("queue_fill_ratio", 0.0))
                if "watermark_lag_ms" in g:
                    wm_lag.add_metric(vl, g["watermark_lag_ms"])
                if "kafka_consumer_lag" in g:
                    kafka_lag.add_metric(vl, g["kafka_consumer_lag"])
        yield from (status, restarts, items_in, items_out, fill, wm_lag, kafka_lag, late,
                    snap_ms, snap_bytes, snap_entries, snap_id, snap_count, snap_failures,
                    stage_in, stage_out, latency)
        yield from custom.values()


class MetricsServer:
    """Serves ``/metrics`` (Prometheus text format) and ``/health`` over HTTP, and the web
    dashboard (``/``, ``/api/``: :mod:`jetwake.engine.server.dashboard.routes`) of a member
    that serves clients.

    ``/health`` answers 200 ``{"status": "UP", ...}`` while ``healthy()`` is true and 503
    once the member is shutting down. ``service``: the member service whose requests the
    dashboard answers through (default: the member's own, ``member.service``); without one
    ``/`` serves the metrics as ``/metrics`` does. ``ui_auth``: "open" (reading needs no
    token, actions do) or "required" (reading needs it too). ``token``: the one the
    dashboard asks for (default: the service's).
    """

    def __init__(self, member: "Member", host: str, port: int,
                 healthy: Callable[[], bool] = lambda: True,
                 info: Callable[[], dict] = dict, *, service: Any = None,
                 ui_auth: str = "open", token: str | None = None,
                 bound: socket.socket | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(JetwakeCollector(member))
        registry, is_healthy, get_info = self.registry, healthy, info
        service = service if service is not None else member.service
        if service is None and ui_auth != "open":
            raise ValueError("ui_auth='required' needs a member that serves clients: the "
                             "dashboard answers through its service")
        self.dashboard = dashboard = None if service is None else \
            Dashboard(member, service.handlers, token or service.token, ui_auth)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if dashboard is not None and path not in ("/metrics", "/health", "/healthz"):
                    dashboard.handle(self, "GET")
                elif path in ("/metrics", "/"):
                    try:
                        body = generate_latest(registry)
                    except Exception as e:  # noqa: BLE001
                        log.exception("collecting metrics")
                        self._send(500, f"metrics failed: {e}\n".encode(), "text/plain")
                        return
                    self._send(200, body, CONTENT_TYPE_LATEST)
                elif path in ("/health", "/healthz"):
                    up = is_healthy()
                    doc = {"status": "UP" if up else "SHUTTING_DOWN", **get_info()}
                    self._send(200 if up else 503, (json.dumps(doc) + "\n").encode(),
                               "application/json")
                else:
                    self._send(404, b"not found: try /metrics or /health\n", "text/plain")

            def do_POST(self) -> None:  # noqa: N802 - the dashboard's actions
                self._dashboard_only("POST")

            def do_DELETE(self) -> None:  # noqa: N802
                self._dashboard_only("DELETE")

            def do_PUT(self) -> None:  # noqa: N802 - refused as JSON (405) by the dashboard
                self._dashboard_only("PUT")

            def _dashboard_only(self, method: str) -> None:
                if dashboard is None:
                    self._send(405, b"only GET here\n", "text/plain")
                else:
                    dashboard.handle(self, method)

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args) -> None:  # quiet
                log.debug("metrics http: " + fmt, *args)

        self.httpd = ThreadingHTTPServer((host, port), Handler,
                                         bind_and_activate=bound is None)
        if bound is not None:  # a socket bound already (see listen_socket)
            serve_on(self.httpd, bound)
            self.httpd.server_name, self.httpd.server_port = host, bound.getsockname()[1]
        self.httpd.daemon_threads = True
        # (host, port): the hints allow a bytes host, a bound socket has a str one
        self.address = cast(tuple[str, int], self.httpd.server_address[:2])
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                        name="jetwake-metrics")

    def start(self) -> "MetricsServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
