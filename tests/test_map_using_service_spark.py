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


def _handoff_pipeline(bootstrap: str, topic: str, url: str):
    from jetwake import Pipeline

    async def call(session, kv):
        return kv[0], await fetch(session, url, kv[1])
    p = Pipeline()
    results = (p.read_from(Sources.kafka(topic, {"bootstrap.servers": bootstrap},
                                         key_deserializer="str", value_deserializer="json"))
               .map_using_service_async(aiohttp_factory(), call, max_concurrent=32))
    results.write_to(Sinks.list("results"))
    (results.group_by(lambda kv: kv[0]).rolling_aggregate(ops.counting()).set_name("counts")
      .write_to(Sinks.list("counts")))
    return p


@pytest.mark.kafka
def test_a_backfill_with_a_service_stage_hands_off_to_a_streaming_job(
        spark_runner, kafka_bootstrap, kafka_topic):
    from jetwake import JobConfig, Member
    from support.spark_handoff import KEYS, produce
    from support.waiting import wait_until

    n, cut = 2000, 1200
    topic = kafka_topic(partitions=2)
    produce(kafka_bootstrap, topic, n)
    with HttpService(latency_ms=1) as svc, Member() as m:
        spark_runner.run(_handoff_pipeline(kafka_bootstrap, topic, svc.url),
                         until={topic: {0: cut // 2, 1: cut // 2}},
                         export_snapshot="services-backfilled", member=m)
        assert len(m.get_list("results")) == cut
        job = m.new_job(_handoff_pipeline(kafka_bootstrap, topic, svc.url),
                        JobConfig(initial_snapshot_name="services-backfilled"))
        wait_until(lambda: len(m.get_list("counts")) >= n, timeout=60,
                   what="the streaming job to read the rest")
        job.cancel()
        results = list(m.get_list("results"))
        counts = list(m.get_list("counts"))
    # every record called once for its result (none missing, none twice) ...
    assert sorted(results, key=lambda kv: kv[1]) == [(f"k{i % KEYS}", i * 10) for i in range(n)]
    # ... and the state after the service stage went on from the backfill's
    assert sorted(counts) == sorted((f"k{k}", c) for k in range(KEYS)
                                    for c in range(1, n // KEYS + 1))
