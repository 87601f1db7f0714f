"""map_using_service and map_using_service_async in the Spark backfill: the same output as an
embedded member for the same input and the same real HTTP service (results with their event
times, which a window after the stage reads; failed calls routed to errors_to; the grouped
form), and the calls counted in the run's metrics."""

from __future__ import annotations

import pytest

from jetwake import AggregateOperations as ops, ServiceFactory, Sinks, Sources, WindowDefinition
from support.http_service import HttpService, aiohttp_factory, fetch
from support.spark_fixtures import (  # noqa: F401 - spark_runner is a fixture
    canonical, run_on_member, run_on_spark, spark_runner,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_service_stages_on_spark_match_the_member(spark_runner):
    with HttpService(latency_ms=2, fail={13, 77}) as svc:
        url = svc.url

        async def call(session, x):
            return await fetch(session, url, x)

        def build(p):
            s = p.read_from(Sources.items(list(range(150)))).with_timestamps(lambda x: x * 10, 0)
            r = s.map_using_service_async(aiohttp_factory(), call, max_concurrent=8,
                                          errors_to=Sinks.list("errors"))
            r.write_to(Sinks.list("results"))
            (r.window(WindowDefinition.tumbling(200)).aggregate(ops.summing(lambda y: y))
              .write_to(Sinks.list("windows")))
            (s.group_by(lambda x: x % 3)
              .map_using_service(ServiceFactory(dict), lambda svc_, x: (x % 3, x))
              .write_to(Sinks.list("grouped")))

        names = ["results", "errors", "windows", "grouped"]
        on_member = run_on_member(build, names)
        on_spark, result = run_on_spark(spark_runner, build, names)
    for name in names:
        assert canonical(on_spark[name]) == canonical(on_member[name]), name
    assert sorted(on_spark["results"]) == [x * 10 for x in range(150) if x not in (13, 77)]
    assert sorted(r["item"] for r in on_spark["errors"]) == [13, 77]
    # the grouped form sees each key's items in order on Spark too
    for k in range(3):
        assert [x for key, x in on_spark["grouped"] if key == k] == list(range(k, 150, 3))
    assert (result.counters["calls"], result.counters["call_failures"]) == (300, 2)
