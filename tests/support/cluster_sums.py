"""The exactly-once Kafka job of the cluster tests: a rolling sum per key from one topic to
another, submitted as a job file to a member process; its input produced, its output read
(read_committed) and the running sums it must equal."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.chaos.harness import assign_from_start

from support.cluster_processes import ClusterProcesses
from support.ordered_producer import ordered_producer
from support.waiting import wait_until


def new_topic(bootstrap: str, partitions: int = 3) -> str:
    """A new topic of its own name."""
    name = f"t{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def sums_job_file(tmp: Path, bootstrap: str, source: str, sink: str) -> Path:
    """A job file (``jetwake submit FILE``): ``source`` -> rolling sum per key -> ``sink``."""
    return rolling_sums_job(tmp, bootstrap, source, f"Sinks.kafka({sink!r}, props, "
                            "value_serializer='json', key_serializer='str')")


def rolling_sums_job(tmp: Path, bootstrap: str, source: str, sink_expression: str, *,
                     stage: str | None = None, source_stage: str | None = None) -> Path:
    """A job file: the Kafka topic ``source`` (str keys, JSON values) -> a rolling sum per
    key, named ``stage`` when given -> the sink ``sink_expression`` (Python source, e.g.
    ``"Sinks.noop()"``; ``props`` holds the bootstrap servers). ``source_stage`` names the
    source stage."""
    src = tmp / f"sums_{uuid.uuid4().hex[:6]}.py"
    source_name = f".set_name({source_stage!r})" if source_stage else ""
    stage_name = f".set_name({stage!r})" if stage else ""
    src.write_text(textwrap.dedent(f"""
        from jetwake import AggregateOperations, Pipeline, Sinks, Sources
        props = {{"bootstrap.servers": {bootstrap!r}}}
        pipeline = Pipeline()
        (pipeline.read_from(Sources.kafka({source!r}, props, key_deserializer="str",
                                          value_deserializer="json")){source_name}
            .group_by(lambda kv: kv[0])
            .rolling_aggregate(AggregateOperations.summing(lambda kv: kv[1])){stage_name}
            .write_to({sink_expression}))
    """))
    return src


def produce_events(bootstrap: str, topic: str, events: list[tuple[str, int]]) -> None:
    """``(key, value)`` events as records, the value in JSON."""
    p = ordered_producer(bootstrap)
    for k, v in events:
        p.produce(topic, key=k.encode(), value=json.dumps(v).encode())
    assert p.flush(30) == 0, "the input was not all written"


class Output:
    """A read_committed reader of the sink topic, accumulating what it has read."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                                  "auto.offset.reset": "earliest",
                                  "isolation.level": "read_committed"})
        assign_from_start(self.consumer, topic)
        self.records: list[tuple[str, int]] = []

    def has(self, count: int) -> bool:
        for msg in self.consumer.consume(500, 0.2):
            if msg.error() is None:
                self.records.append((msg.key().decode(), json.loads(msg.value())))
        return len(self.records) >= count

    def drain(self) -> None:
        """Reads until one second passes without a record: a duplicate written late (by a
        restarted sink) would land in that second."""
        while True:
            batch = [m for m in self.consumer.consume(500, 1.0) if m.error() is None]
            if not batch:
                return
            self.records.extend((m.key().decode(), json.loads(m.value())) for m in batch)

    def close(self) -> None:
        self.consumer.close()


def running_sums(events: list[tuple[str, int]]) -> dict[str, list[int]]:
    """The sums job's output key by key, in order: what one member computes."""
    out: dict[str, list[int]] = {}
    running: dict[str, int] = {}
    for k, v in events:
        running[k] = running.get(k, 0) + v
        out.setdefault(k, []).append(running[k])
    return out


def by_key(records: list[tuple[str, int]]) -> dict[str, list[int]]:
    """The values of ``(key, value)`` records key by key, in order."""
    out: dict[str, list[int]] = {}
    for k, v in records:
        out.setdefault(k, []).append(v)
    return out


def submit_sums(cluster: ClusterProcesses, member, tmp_path: Path, bootstrap: str,
                 source: str, sink: str, *flags: str) -> dict:
    """Submits the sums job to ``member`` (exactly-once, a snapshot every 200 ms)."""
    return cluster.cli_json(member, "submit",
                            str(sums_job_file(tmp_path, bootstrap, source, sink)),
                            "--name", "sums", "--guarantee", "exactly_once",
                            "--snapshot-interval", "200", *flags)


def job_status(cluster: ClusterProcesses, member, job_id: str) -> dict:
    """What ``jetwake status JOB --json`` on ``member`` shows (ClusterProcesses.status)."""
    return cluster.status(member, job_id)



class SumsRun:
    """The driver of the failover tests: the sums job submitted to ``member`` (exactly-once, a
    snapshot every 200 ms, ``flags`` added), fed ``count`` events over ``keys`` keys, with a
    read_committed reader of what it wrote. Returns once the first sums arrived and the job
    committed ``snapshots`` snapshots (a member killed after them restores from one).

    The test then kills a member (``ClusterMemberProcess.kill``), feeds more events, waits for
    their sums and checks that every sum came once and exact."""

    def __init__(self, cluster: ClusterProcesses, member, tmp_path: Path, bootstrap: str,
                 keys: int = 11, *flags: str, count: int = 1000, snapshots: int = 0) -> None:
        self.cluster, self.bootstrap, self.keys = cluster, bootstrap, keys
        self.source, sink = new_topic(bootstrap), new_topic(bootstrap)
        self.events: list[tuple[str, int]] = []
        self.feed(count)
        self.job = submit_sums(cluster, member, tmp_path, bootstrap, self.source, sink, *flags)
        self.out = Output(bootstrap, sink)
        self.wait_for_all("the first sums", 60)
        if snapshots:
            wait_until(lambda: (self.status(member).get("snapshot_count") or 0) >= snapshots,
                       what=f"{snapshots} snapshots", timeout=30, interval=0.05)

    def feed(self, count: int) -> None:
        """Writes the next ``count`` events to the source topic."""
        start = len(self.events)
        batch = [(f"k{i % self.keys}", i) for i in range(start, start + count)]
        produce_events(self.bootstrap, self.source, batch)
        self.events += batch

    def wait_for_all(self, what: str, timeout: float) -> None:
        """Waits until the sum of every event fed so far has been read."""
        wait_until(lambda: self.out.has(len(self.events)), what=what, timeout=timeout,
                   interval=0)

    def status(self, member) -> dict:
        return job_status(self.cluster, member, self.job["id"])

    def assert_exactly_once(self) -> None:
        """Reads what is still coming, then: every sum once, each key's sums exact."""
        self.out.drain()
        self.out.close()
        assert len(self.out.records) == len(self.events), "a record was written twice"
        assert by_key(self.out.records) == running_sums(self.events)
