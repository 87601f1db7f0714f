"""NEXMark under a member's loss: q5 (hot items: a sliding window over every bid) and q8 (new
users: a window join of persons and auctions) run exactly-once on two member processes
reading Kafka; one member (the coordinator, or the other) is SIGKILLed mid-input, after a
snapshot, and the rest of the input comes after. What a read_committed consumer of each output topic sees equals the query's
reference over every event: nothing lost, nothing twice."""

from __future__ import annotations

import time

import pytest

from jetwake import JobConfig
from bench.nexmark.generator import GeneratorConfig, generate
from bench.nexmark.kafka_input import (
    END_MARKER_DELAY_MS, TOPICS, create_topics, encode, end_marker, key_of, producer,
)
from bench.nexmark.queries import check_output, query
from bench.nexmark.runner import OutputReader, new_output_topic, pipeline_for
from support.cluster_processes import ClusterProcesses
from support.waiting import wait_until

PARTITIONS = 2
LAG_MS = 300
# 24 s of event time at 500 events/s: a dozen q5 windows and three of q8's, with disorder
EVENTS = list(generate(GeneratorConfig(12_000, rate=500, out_of_order_ms=LAG_MS, seed=11)))
BEFORE_KILL = 7_000  # events written before the kill, the rest after it


def write(bootstrap: str, prefix: str, events: list, end: bool = False) -> None:
    """Writes ``events`` into the three topics; ``end``: then one end marker per partition,
    past every window."""
    p = producer(bootstrap)
    for kind, event in events:
        p.produce(prefix + TOPICS[kind], encode(event), key_of(kind, event))
    if end:
        marker = encode(end_marker(max(e["date_time"] for _, e in EVENTS)
                                   + END_MARKER_DELAY_MS))
        for kind in TOPICS:
            for part in range(PARTITIONS):
                p.produce(prefix + TOPICS[kind], marker, b"end", partition=part)
    assert p.flush(60) == 0, "input records not delivered"


def records_in(job) -> int:
    return int(sum(m.get("records_in", 0) for m in job.metrics().values()))


@pytest.mark.integration
@pytest.mark.parametrize("victim", ["coordinator", "other member"])
def test_q5_and_q8_stay_exact_when_a_member_is_killed_mid_input(kafka_bootstrap, tmp_path,
                                                                 victim):
    prefix = f"fault-{time.monotonic_ns()}-"
    create_topics(kafka_bootstrap, prefix, PARTITIONS)
    cluster = ClusterProcesses(tmp_path, kafka_bootstrap)
    try:
        members = cluster.start(2)
        queries = [query("q5"), query("q8")]
        outs = {q.name: new_output_topic(kafka_bootstrap, q, PARTITIONS) for q in queries}
        coordinator = wait_until(cluster.coordinator, what="a coordinator")
        survivor = next(m for m in members if m is not coordinator) \
            if victim == "coordinator" else coordinator
        with survivor.client() as client:
            jobs = {q.name: client.new_job(
                pipeline_for(q, kafka_bootstrap, prefix, outs[q.name], allowed_lag_ms=LAG_MS),
                JobConfig(name=f"nexmark-{q.name}", processing_guarantee="exactly_once",
                          snapshot_interval_ms=300, state_backend="rocksdb"))
                for q in queries}
            first = EVENTS[:BEFORE_KILL]
            write(kafka_bootstrap, prefix, first)
            for q in queries:
                want = sum(k in q.reads for k, _ in first)
                job = jobs[q.name]
                wait_until(lambda: records_in(job) >= want, timeout=60,
                           what=f"{q.name} reading the first {want} events")
                taken = job.refresh().get("snapshot_count") or 0
                wait_until(lambda: (job.refresh().get("snapshot_count") or 0) > taken, timeout=60,
                           what=f"a snapshot of {q.name} after the first events")
            killed = next(m for m in members if m is not survivor)
            killed.kill()
            assert killed.proc.returncode == -9, "the member was not killed by SIGKILL"
            write(kafka_bootstrap, prefix, EVENTS[BEFORE_KILL:], end=True)
            for q in queries:
                wait_until(lambda: (jobs[q.name].refresh().get("restart_count") or 0) >= 1,
                           timeout=60, what=f"{q.name} restarted after the member's loss")
            for q in queries:
                want = sum(q.reference(EVENTS).values())
                reader = OutputReader(kafka_bootstrap, outs[q.name], PARTITIONS)
                try:
                    wait_until(lambda: reader.read() >= 0 and len(reader.values) >= want,
                               timeout=120, what=f"{q.name}'s {want} outputs")
                    grace = time.monotonic() + 1.0  # reading on: a duplicate would come now
                    while time.monotonic() < grace:
                        reader.read()
                    problems = check_output(q, EVENTS, reader.values)
                finally:
                    reader.close()
                assert not problems, "\n".join(problems)
                assert want > 3, f"{q.name}: too few outputs to prove anything"
    finally:
        cluster.stop_all()
