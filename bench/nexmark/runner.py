"""Runs NEXMark queries as jetwake jobs through Kafka, checks their outputs and measures them.

One *throughput run* (:func:`run_query`): a fresh output topic; the query as a job reading
the pre-filled input topics from the start (``NexmarkInputs(pipeline, kafka=...)``) and
writing its output stage with ``Sinks.kafka(..., value_serializer="json")``; the output
read back (read_committed) until the reference's count of records arrived (or, for a query
whose output is not exact, until it stops growing), then checked with ``check_output``; the
job cancelled. Events/s = the input events the query reads / the time from the first
record the sources read (their ``records_in`` metric, polled) to the later of the sources
having read every input event and the last output record's Kafka timestamp (for a query
checked otherwise, q12's processing-time windows, to the end of the input). CPU = the
member processes' CPU time over that interval (from /proc), the broker's apart.

One *latency run* (:func:`run_latency`): fresh input topics written at a fixed rate by
``RateWriter`` while the job runs; each output record's latency = its Kafka timestamp (and,
apart, the moment the read_committed reader saw it) - the production time of the newest
input it depends on, found as the first input event due at or after the newest event time
the record carries (a bid's ``date_time`` for pass-through; a window's end for windowed
results, whose closing input is the first one due at or after that end); a record without
an event time (q2's ``{auction, price}``) is matched to the newest input event holding its
values.

Members: ``Target`` is either an in-process :class:`jetwake.Member` (tests) or a
:class:`bench.cluster_members.BenchCluster` of member processes (the benchmark).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jetwake import JobConfig, Pipeline, Sinks

from bench.bench_cluster import process_cpu
from bench.nexmark.kafka_input import KafkaInput, RateWriter
from bench.nexmark.queries import NexmarkInputs, Query, check_output

GUARANTEES = ("exactly_once", "at_least_once")
SNAPSHOT_INTERVAL_MS = 1000
EXTRA_WAIT_S = 1.0  # reading on after the expected count arrived


def cpu_of(pids: Sequence[int]) -> float:
    return sum(c for c in (process_cpu(p) for p in pids) if c is not None)


class Target:
    """Where the jobs run: ``members`` member processes, or one in-process member."""

    def __init__(self, bootstrap: str, members: int, in_process: bool = False) -> None:
        self.bootstrap, self.members, self.in_process = bootstrap, members, in_process
        self._member: Any = None
        self._cluster: Any = None
        self._client: Any = None
        self._dir: str | None = None

    def __enter__(self) -> "Target":
        if self.in_process:
            if self.members != 1:
                raise ValueError("Target: an in-process member is one member")
            from jetwake import Member
            self._dir = tempfile.mkdtemp(prefix="nexmark-member-")
            self._member = Member(self._dir, cooperative_threads=1, local_parallelism=1)
        else:
            from bench.bench_cluster import MEMBER_ARGS
            from bench.cluster_members import BenchCluster
            self._cluster = BenchCluster(self.bootstrap, self.members, MEMBER_ARGS)
            self._cluster.__enter__()
            self._client = self._cluster.client()  # one connection for every job's calls
        return self

    def __exit__(self, *exc: object) -> None:
        if self._member is not None:
            self._member.shutdown()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        if self._client is not None:
            self._client.close()
        if self._cluster is not None:
            self._cluster.__exit__(*exc)

    def pids(self) -> list[int]:
        return [os.getpid()] if self.in_process else self._cluster.pids()

    def new_job(self, pipeline: Pipeline, config: JobConfig) -> Any:
        if self._member is not None:
            return self._member.new_job(pipeline, config)
        return self._client.new_job(pipeline, config)


def job_config(q: Query, guarantee: str) -> JobConfig:
    """Exactly-once: 1 s snapshots, RocksDB state; at-least-once: the same without
    transactions (snapshots still every second, the sink flushed at each)."""
    if guarantee not in GUARANTEES:
        raise ValueError(f"guarantee must be one of {GUARANTEES}, got {guarantee!r}")
    return JobConfig(name=f"nexmark-{q.name}-{uuid.uuid4().hex[:6]}",
                     processing_guarantee=guarantee, snapshot_interval_ms=SNAPSHOT_INTERVAL_MS,
                     state_backend="rocksdb")


def pipeline_for(q: Query, bootstrap: str, prefix: str, out_topic: str,
                 allowed_lag_ms: int = 1000) -> Pipeline:
    p = Pipeline()
    inputs = NexmarkInputs(p, kafka={"bootstrap.servers": bootstrap}, topic_prefix=prefix,
                           allowed_lag_ms=allowed_lag_ms)
    q.build(inputs).write_to(Sinks.kafka(out_topic, {"bootstrap.servers": bootstrap},
                                         value_serializer="json"))
    return p


def new_output_topic(bootstrap: str, q: Query, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"nexmark-out-{q.name}-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions, 1, config={"retention.ms": "-1"})]
                        )[name].result(60)
    deadline = time.monotonic() + 60
    while True:
        md = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if md is not None and md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()):
            return name
        if time.monotonic() > deadline:
            raise TimeoutError(f"output topic {name} not ready in 60 s")
        time.sleep(0.1)


class OutputReader:
    """A read_committed consumer of a query's output topic, from its beginning."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                           "enable.auto.commit": False, "isolation.level": "read_committed"})
        self.c.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
        self.values: list[Any] = []
        self.kafka_ms: list[int] = []   # each record's Kafka timestamp
        self.seen_ms: list[int] = []    # when this reader received it

    def read(self, wait: float = 0.05) -> int:
        got = 0
        for m in self.c.consume(5000, wait):
            if m.error() is not None:
                continue
            now = int(time.time() * 1000)
            self.values.append(json.loads(m.value()))
            self.kafka_ms.append(m.timestamp()[1])
            self.seen_ms.append(now)
            got += 1
        return got

    def close(self) -> None:
        self.c.close()


def _records_in(job: Any) -> float:
    try:
        return sum(m.get("records_in", 0) for m in job.metrics().values())
    except Exception:  # noqa: BLE001 - the job is still starting
        return 0.0


def _snapshot_bytes(rec: Any) -> int:
    return sum(int(f[2]) for per in (rec.files or {}).values() for f in per.values()
               if len(f) > 2)


@dataclass
class QueryRun:
    """One query run's figures (rates in input events/s of the kinds the query reads)."""

    query: str
    members: int
    guarantee: str
    events: int = 0
    outputs: int = 0
    events_per_s: float | None = None
    cpu_s: float | None = None
    broker_cpu_s: float | None = None
    seconds: float | None = None
    startup_s: float | None = None
    snapshot_ms: list[float] = field(default_factory=list)
    snapshot_bytes: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def per_core(self) -> float | None:
        if not self.events_per_s or not self.cpu_s or not self.seconds:
            return None
        return self.events / self.cpu_s

    @property
    def ok(self) -> bool:
        return self.events_per_s is not None and not self.problems


def run_query(q: Query, inp: KafkaInput, target: Target, guarantee: str,
              timeout: float = 300.0, broker_pid: int | None = None) -> QueryRun:
    """One throughput run of ``q`` over the pre-filled ``inp`` (see the module's doc)."""
    run = QueryRun(q.name, target.members, guarantee, events=inp.reads(q.reads))
    bootstrap = inp.bootstrap
    out = new_output_topic(bootstrap, q, inp.partitions)
    reader = OutputReader(bootstrap, out, inp.partitions)
    want = sum(q.reference(inp.events).values()) if q.exact else None
    pids = target.pids()
    job = None
    try:
        t_submit = time.time()
        job = target.new_job(pipeline_for(q, bootstrap, inp.prefix, out), job_config(q, guarantee))
        deadline = time.monotonic() + timeout
        t_first = None
        while t_first is None:
            if _records_in(job) > 0:
                t_first = time.time()
                cpu_first = cpu_of(pids)
                bcpu_first = process_cpu(broker_pid) if broker_pid else None
            elif time.monotonic() > deadline:
                run.note = f"no record read in {timeout:.0f} s; job {job.status}: {job.failure}"
                return run
            else:
                time.sleep(0.005)
        run.startup_s = t_first - t_submit
        t_sources_done = None
        cpu_done: float | None = None
        bcpu_done: float | None = None
        last_growth = time.monotonic()
        snaps: dict[int, Any] = {}
        # each poll is a call the member answers (its CPU counts): the sources' progress
        # every 0.1 s, the last snapshot (one a second) every 0.5 s
        next_poll = next_snapshot = next_check = 0.0
        while True:
            if reader.read():
                last_growth = time.monotonic()
            now = time.monotonic()
            if now >= next_poll and t_sources_done is None:
                next_poll = now + 0.1
                if _records_in(job) >= inp.records(q.reads):
                    t_sources_done = time.time()
                    cpu_sources = cpu_of(pids)
                    bcpu_sources = process_cpu(broker_pid) if broker_pid else None
            if now >= next_snapshot:
                next_snapshot = now + 0.5
                rec = job.last_snapshot
                if rec is not None:
                    snaps[rec.snapshot_id] = rec
            if want is not None and len(reader.values) >= want and t_sources_done is not None:
                # the count is there: the members' CPU now (what follows is idle time, not
                # work for these events), then a moment more for records beyond it
                # (duplicates, wrong ones), which the check then reports
                cpu_done = cpu_of(pids)
                bcpu_done = process_cpu(broker_pid) if broker_pid else None
                grace = time.monotonic() + EXTRA_WAIT_S
                while time.monotonic() < grace:
                    reader.read()
                break
            if t_sources_done is not None and want is None and now >= next_check:
                # a query checked otherwise (processing-time windows): until its check passes
                next_check = now + 1.0
                if not check_output(q, inp.events, reader.values):
                    break
                if now - last_growth > 30.0:
                    break
            if want is not None and t_sources_done is not None and now - last_growth > 15.0:
                break  # nothing more is coming: the check reports what is missing
            if now > deadline:
                run.note = (f"not complete after {timeout:.0f} s ({len(reader.values):,} "
                            f"outputs); job {job.status}: {job.failure or ''}")
                break
        if t_sources_done is None:
            run.problems.append(f"{q.name}: the sources did not read all "
                                f"{inp.reads(q.reads):,} input events")
            return run
        t_last_out = max(reader.kafka_ms) / 1000 if reader.kafka_ms else t_sources_done
        # processing-time windows (q12) close on the clock, not on the input: up to the end
        # of the input for them
        if q.exact and t_last_out > t_sources_done:
            t_end = t_last_out
            if cpu_done is not None:  # read when the last expected output arrived
                cpu_end, bcpu_end = cpu_done, bcpu_done
            else:  # read now: the best bound while output may still be written
                cpu_end = cpu_of(pids)
                bcpu_end = process_cpu(broker_pid) if broker_pid else None
        else:
            t_end, cpu_end, bcpu_end = t_sources_done, cpu_sources, bcpu_sources
        run.seconds = t_end - t_first
        run.events_per_s = run.events / run.seconds
        run.cpu_s = cpu_end - cpu_first
        if broker_pid and bcpu_end is not None and bcpu_first is not None:
            run.broker_cpu_s = bcpu_end - bcpu_first
        run.outputs = len(reader.values)
        rec = job.last_snapshot
        if rec is not None:
            snaps[rec.snapshot_id] = rec
        run.snapshot_ms = [float(r.duration_ms) for r in snaps.values()]
        run.snapshot_bytes = [_snapshot_bytes(r) for r in snaps.values()]
        run.problems = check_output(q, inp.events, reader.values)
        return run
    finally:
        if job is not None:
            try:
                job.cancel()
            except Exception:  # noqa: BLE001 - already ended
                pass
        reader.close()


@dataclass
class LatencyRun:
    query: str
    rate: int
    guarantee: str = "exactly_once"
    outputs: int = 0
    kafka_ms: list[float] = field(default_factory=list)     # by the output's Kafka timestamp
    visible_ms: list[float] = field(default_factory=list)   # when the reader saw it
    behind_ms: int = 0
    note: str = ""

    def percentiles(self, which: str = "kafka") -> tuple[float, float, float] | None:
        xs = sorted(self.kafka_ms if which == "kafka" else self.visible_ms)
        if len(xs) < 2:
            return None
        q = statistics.quantiles(xs, n=100, method="inclusive")
        return q[49], q[94], q[98]


def newest_event_time(record: Any, low_ms: int, high_ms: int) -> int | None:
    """The newest epoch-ms value in ``record`` between ``low_ms`` and ``high_ms`` (a bid's
    ``date_time``, a window's end): the event time of the newest input it depends on."""
    values = record.values() if isinstance(record, dict) else (
        record if isinstance(record, (list, tuple)) else [])
    best = None
    for v in values:
        if isinstance(v, (dict, list, tuple)):
            v = newest_event_time(v, low_ms, high_ms)
        if isinstance(v, int) and not isinstance(v, bool) and low_ms <= v <= high_ms:
            best = v if best is None else max(best, v)
    return best


class InputMatcher:
    """For an output record without an event time (q2's ``{auction, price}``): the production
    time of the newest input event of the query's kinds whose fields of the record's names
    hold the record's values."""

    def __init__(self, events: Sequence[tuple[str, Any]], sent_ms: Sequence[int],
                 kinds: Sequence[str]) -> None:
        self.events, self.sent_ms, self.kinds = events, sent_ms, kinds
        self._keys: tuple[str, ...] | None = None
        self._index: dict[tuple, int] = {}

    def produced_at(self, record: Any) -> int | None:
        if not isinstance(record, dict):
            return None
        if self._keys is None:
            sample = next((e for k, e in self.events if k in self.kinds), None)
            self._keys = tuple(sorted(k for k in record if sample is not None and k in sample))
            for (kind, e), sent in zip(self.events, self.sent_ms):
                if kind in self.kinds and self._keys:
                    key = tuple(e.get(k) for k in self._keys)
                    self._index[key] = max(sent, self._index.get(key, sent))
        if not self._keys:
            return None
        return self._index.get(tuple(record.get(k) for k in self._keys))


def run_latency(q: Query, target: Target, bootstrap: str, rate: int, seconds: float,
                partitions: int, guarantee: str = "exactly_once", allowed_lag_ms: int = 0,
                max_seconds: float = 40.0, min_samples: int = 20) -> LatencyRun:
    """The latency of ``q``'s outputs with input arriving at ``rate`` events/s (see the
    module's doc). No disorder: each event is written when due. The input runs ``seconds``,
    longer (up to ``max_seconds``) until ``min_samples`` outputs were measured: a 10 s window
    or session gap needs more than 10 s of input before its first result."""
    from bench.nexmark.kafka_input import create_topics

    lat = LatencyRun(q.name, rate, guarantee)
    prefix = f"lat-{q.name}-{uuid.uuid4().hex[:6]}-"
    writer = RateWriter(bootstrap, prefix, rate, max_seconds, partitions=partitions)
    create_topics(bootstrap, prefix, partitions)
    out = new_output_topic(bootstrap, q, partitions)
    reader = OutputReader(bootstrap, out, partitions)
    job = target.new_job(pipeline_for(q, bootstrap, prefix, out, allowed_lag_ms),
                         job_config(q, guarantee))
    try:
        deadline = time.monotonic() + 120
        while job.status.value != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.05)
        writer.start()
        t0 = time.monotonic()
        low = writer.start_ms
        while time.monotonic() - t0 < max_seconds:
            reader.read(0.1)
            if time.monotonic() - t0 >= seconds and len(reader.values) >= min_samples:
                break
        writer.stop()
        writer.join(30)
        end = time.monotonic() + 3.0  # what the last events still bring out
        while time.monotonic() < end:
            reader.read(0.1)
        lat.behind_ms = writer.behind_ms
        high = writer.due_ms[-1] + 60_000 if writer.due_ms else low
        matcher = InputMatcher(writer.events, writer.sent_ms, q.reads)
        for value, kafka_ms, seen_ms in zip(reader.values, reader.kafka_ms, reader.seen_ms):
            t = newest_event_time(value, low, high)
            sent = writer.produced_at(t) if t is not None else matcher.produced_at(value)
            if sent is None:
                continue
            lat.kafka_ms.append(kafka_ms - sent)
            lat.visible_ms.append(seen_ms - sent)
        lat.outputs = len(reader.values)
        if not lat.kafka_ms:
            lat.note = "no output record carries an event time: latency not measured"
        return lat
    finally:
        try:
            job.cancel()
        except Exception:  # noqa: BLE001
            pass
        reader.close()
