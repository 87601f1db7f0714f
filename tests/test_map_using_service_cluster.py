"""map_using_service_async after group_by on a cluster of two real member processes: every
result once, each key's calls in order and one at a time across the cluster, both members
calling the service, and the job's metrics summed over the members with percentiles derived
from the summed latency histogram."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from support.cluster_processes import ClusterProcesses
from support.http_service import HttpService
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _job_file(tmp: Path, url: str, out_dir: Path) -> Path:
    path = tmp / "service_job.py"
    path.write_text(textwrap.dedent(f"""
        import os
        import aiohttp
        from jetwake import Pipeline, ServiceFactory, Sinks, Sources

        async def make():
            return aiohttp.ClientSession(headers={{"X-Caller": str(os.getpid())}})

        async def call(session, x):
            params = {{"x": str(x), "key": f"k{{x % 11}}"}}
            async with session.get({url!r}, params=params) as r:
                return x, int(await r.text())

        pipeline = Pipeline()
        (pipeline.read_from(Sources.items(range(400)))
            .group_by(lambda x: x % 11)
            .map_using_service_async(ServiceFactory(make, lambda s: s.close(), "member"), call,
                                     max_concurrent=8)
            .write_to(Sinks.files({str(out_dir)!r})))
    """))
    return path


def test_grouped_async_calls_on_two_members(tmp_path: Path, kafka_bootstrap: str) -> None:
    cluster = ClusterProcesses(tmp_path, kafka_bootstrap)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    try:
        with HttpService(latency_ms=3) as svc:
            cluster.start(2)
            job = cluster.cli_json(cluster.members[0], "submit",
                                   str(_job_file(tmp_path, svc.url, out_dir)), "--name", "svc")
            wait_until(lambda: cluster.status(cluster.members[1], job["id"])
                       ["status"] == "COMPLETED", what="the job to complete", timeout=60,
                       interval=0.2)
            with cluster.members[1].client() as c:
                metrics = c.job(job["id"]).metrics()
    finally:
        cluster.stop_all()
    results = [ast.literal_eval(line) for f in out_dir.iterdir()
               for line in f.read_text().splitlines()]
    assert sorted(results) == [(x, x * 10) for x in range(400)]
    # each member's source processor reads a half of the items; a key's items from each keep
    # their order through the partitioned edge and the key's one-call-at-a-time rule
    for k in range(11):
        calls = svc.by_key[f"k{k}"]
        assert sorted(calls) == list(range(k, 400, 11))
        assert [x for x in calls if x < 200] == list(range(k, 200, 11))
        assert [x for x in calls if x >= 200] == [x for x in range(k, 400, 11) if x >= 200]
    assert svc.key_overlaps == 0
    assert len(svc.callers) == 2  # each member called the service for its keys
    m = metrics["map-using-service"]
    assert m["calls"] == 400 and m["call_failures"] == 0
    assert 3 <= m["call_latency_p50_ms"] <= m["call_latency_p99_ms"]
