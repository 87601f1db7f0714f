"""job.state(stage) of a streaming job started from a Spark backfill's hand-off: before the job
takes a snapshot of its own, a snapshot read is the state the backfill wrote (running sums, a
tumbling window still open), decoded with the processors' own codecs; live reads then see the
job carry on from it."""

from __future__ import annotations

import pytest

from jetwake import JobConfig, Member

from support.spark_fixtures import spark_runner  # noqa: F401
from support.spark_handoff import BASE, KEYS, WINDOW, pipeline, produce
from support.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.kafka]


def test_the_state_a_backfill_hands_off_reads_as_the_jobs_state(spark_runner, kafka_bootstrap,
                                                                 kafka_topic):
    n, cut = 2_000, 1_000  # record i: key k{i % 50}, value i, time BASE + i, partition i % 2
    topic = kafka_topic(partitions=2)
    produce(kafka_bootstrap, topic, n)
    with Member() as m:
        spark_runner.run(pipeline(kafka_bootstrap, topic),
                         until={topic: {0: cut // 2, 1: cut // 2}},
                         export_snapshot="handed-off", member=m)
        job = m.new_job(pipeline(kafka_bootstrap, topic), JobConfig(
            initial_snapshot_name="handed-off", processing_guarantee="exactly_once",
            snapshot_interval_ms=3_600_000))
        handed = job.state("sums")
        assert dict(handed.items()) == {f"k{k}": sum(range(k, cut, KEYS)) for k in range(KEYS)}
        # the first 1,000 records are all in the window [BASE, BASE + 1000), still open
        assert job.state("windows").get("k3") == {(BASE, BASE + WINDOW): cut // KEYS}
        live = job.state("sums", consistency="latest")
        want = {f"k{k}": sum(range(k, n, KEYS)) for k in range(KEYS)}
        wait_until(lambda: dict(live.items()) == want, timeout=60,
                   what="the job's live sums over every record")
        assert live.count() == KEYS
        job.cancel()
