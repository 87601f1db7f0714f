"""The runtimes of a spec over Kafka: the Spark backfill, a backfill handed over to a streaming
job, and a streaming member; each ``(spec, inputs) -> RunResult`` once bound to a
:class:`KafkaEnv` (:func:`runtimes`).

Each source's partitions are produced, in order, into a fresh topic of as many partitions
(a record ``(ts, key, value, seq)`` as a JSON list, keyed by its key) and read back with
``Sources.kafka(topic, ..., value_deserializer="json", projection=record_of)``, so that the
``with_timestamps`` of :func:`generate.build_pipeline` comes right after the source and runs
in it, per partition (:func:`kafka_pipeline` checks that the DAG has no timestamp vertex).
Every sink is ``Sinks.list`` on one embedded member, under a prefix of its own per run.

Kafka does not end: what these runtimes emit is what the model says of a *streaming* run,
``run_model(spec, inputs, bounded=False)`` (windows and ttl states up to the final watermark,
no end-of-stream flush; see model.py, "Streaming"), for specs drawn with
``scenarios(streaming=True)`` (no batch ``aggregate``).

- :func:`run_on_spark`: ``SparkRunner.run(pipeline, until="latest", member=...)``: the
  backfill emits what a streaming job would have emitted by the end of its input.
- :func:`run_backfill_then_stream`: the backfill reads each partition up to an offset of the
  ``split`` and exports the hand-off snapshot; a streaming job of the same pipeline starts from
  it and reads the rest. What both wrote together must equal the model over every record.
- :func:`run_on_member_kafka`: one streaming member job over the topics.

A streaming job never finishes: :func:`await_stream` waits until every sink holds as many items
as the model says, the late events are counted and the source has read its share of the records
(``records_in``), then watches the sinks and ``records_in`` for a short grace in which nothing
more may arrive. The backfill counts its late events over all stages (``counters
["late_events"]``), so a runtime that involves it reports them under :data:`LATE_TOTAL`, and
:func:`comparable` folds the model's per-stage counts the same way.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from hypothesis import assume, strategies as st

from .generate import build_pipeline, late_label, out_label
from .model import expected_run
from .result import RunResult, multiset
from .runners import Runtime, collect, late_vertices
from .spec import Inputs, Spec, node_ids, source_names

__all__ = ["KafkaEnv", "LATE_TOTAL", "record_of", "kafka_pipeline", "run_on_spark",
           "run_backfill_then_stream", "run_on_member_kafka", "runtimes", "comparable",
           "await_stream", "sink_labels", "splits",
           "late_at_a_ttl_stage", "ttl_evicted_by_another_partition",
           "a_dropped_record_moved_the_watermark", "a_partition_unread_at_the_split", "WAIT",
           "QUIET", "GRACE"]

LATE_TOTAL = "(every stage)"
"""The ``late_counts`` key of a run whose late events are counted over all stages."""

WAIT = 30.0
"""Seconds a streaming job may take to emit what the model says (it takes well under one)."""
QUIET = 1.0
"""Seconds without any change, everything read, after which a streaming job that emitted less
than the model says is taken as done (so that a failing example fails fast)."""
GRACE = 0.3
"""Seconds in which nothing more may arrive once a streaming job emitted what was expected."""


def record_of(r: Any) -> tuple:
    """The Kafka source's projection: the record ``(ts, key, value, seq)`` the model reads."""
    return tuple(r.value)


@dataclass
class KafkaEnv:
    """What the runs share: the broker, one embedded member (its lists receive every sink, its
    snapshots the hand-offs) and, for the backfill, a ``SparkRunner``."""
    bootstrap: str
    member: Any
    spark: Any = None
    log: list = field(default_factory=list, repr=False)
    """(runtime, seconds) of every run, for the timings the suite reports."""
    backfills: list = field(default_factory=list, repr=False)
    """The ``BackfillResult`` of every backfill run, last last."""

    _producer: Any = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"KafkaEnv({self.bootstrap!r}, {len(self.log)} runs)"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis prints a failing case
        p.text(repr(self))

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def producer(self) -> Any:
        """One idempotent producer for every run (it keeps each partition's order; starting
        one costs half a second)."""
        if self._producer is None:
            from support.ordered_producer import ordered_producer
            self._producer = ordered_producer(self.bootstrap, {"linger.ms": 5})
        return self._producer


# --- topics ----------------------------------------------------------------------------------

def _create_topics(env: KafkaEnv, spec: Spec, inputs: Inputs, tag: str) -> dict[str, str]:
    from confluent_kafka.admin import NewTopic
    from support.kafka_broker import wait_for_topic
    names = {s: f"conformance-{tag}-{s}" for s in source_names(spec)}
    admin = env.admin()
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=len(inputs["partitions"][s]), replication_factor=1,
                  config={"retention.ms": "-1"}) for s, t in names.items()],
        operation_timeout=30)
    for f in futures.values():
        f.result(timeout=60)
    for s, t in names.items():
        wait_for_topic(admin, t, len(inputs["partitions"][s]))
    return names


def _produce(env: KafkaEnv, topic: str, partitions: list[list[tuple]]) -> None:
    """Each partition's records, in order (an idempotent producer keeps it)."""
    p = env.producer()
    for i, records in enumerate(partitions):
        for r in records:
            while True:
                try:
                    p.produce(topic, value=json.dumps(list(r)).encode(),
                              key=str(r[1]).encode(), partition=i)
                    break
                except BufferError:
                    p.poll(0.05)
    assert p.flush(60) == 0, f"records for {topic} not delivered"


def _delete_topics(env: KafkaEnv, topics: list[str]) -> None:
    try:
        for f in env.admin().delete_topics(topics, operation_timeout=30).values():
            f.result(timeout=30)
    except Exception:  # noqa: BLE001 - cleanup only
        pass


# --- the pipeline ----------------------------------------------------------------------------

def kafka_pipeline(env: KafkaEnv, spec: Spec, inputs: Inputs, topics: dict[str, str],
                   prefix: str) -> Any:
    """The spec's pipeline over the topics, every sink ``Sinks.list(prefix + label)``; checks
    that ``with_timestamps`` runs inside each Kafka source (no timestamp vertex)."""
    from jetwake import Sinks, Sources
    props = {"bootstrap.servers": env.bootstrap}

    def source_for(name: str, partitions: list) -> Any:
        return Sources.kafka(topics[name], props, value_deserializer="json",
                             projection=record_of)
    p = build_pipeline(spec, inputs, source_for, lambda label: Sinks.list(prefix + label))
    vertices = [v.name for v in p.to_dag().vertices]
    assert not [v for v in vertices if v.startswith("timestamps")], \
        f"with_timestamps does not run in the Kafka source: {vertices}"
    return p


def sink_labels(spec: Spec) -> list[str]:
    """Every sink label of the spec's pipeline."""
    labels = [out_label(n) for n in node_ids(spec)]
    labels += [late_label(s["id"]) for s in spec["stages"]
               if s["kind"] == "window" and s["late_sink"]]
    return labels


class _Run:
    """One run's topics (produced), list prefix and snapshot name; removed afterwards."""

    def __init__(self, env: KafkaEnv, spec: Spec, inputs: Inputs) -> None:
        self.env, self.spec, self.inputs = env, spec, inputs
        self.tag = uuid.uuid4().hex[:10]
        self.prefix = f"{self.tag}-"
        self.snapshot = f"handoff-{self.tag}"
        self.jobs: list = []
        self.topics: dict[str, str] = {}

    def __enter__(self) -> "_Run":
        self.topics = _create_topics(self.env, self.spec, self.inputs, self.tag)
        for s, topic in self.topics.items():
            _produce(self.env, topic, self.inputs["partitions"][s])
        return self

    def pipeline(self) -> Any:
        return kafka_pipeline(self.env, self.spec, self.inputs, self.topics, self.prefix)

    def read(self, label: str) -> list:
        return list(self.env.member.get_list(self.prefix + label))

    def counts(self) -> dict[str, int]:
        return {label: len(self.env.member.get_list(self.prefix + label))
                for label in sink_labels(self.spec)}

    def __exit__(self, *exc: Any) -> None:
        m = self.env.member
        for job in self.jobs:
            try:
                job.cancel()
            except Exception:  # noqa: BLE001 - cleanup only
                pass
        for label in sink_labels(self.spec):
            m.get_list(self.prefix + label).clear()
        try:
            m.delete_snapshot(self.snapshot)
        except Exception:  # noqa: BLE001 - none was written
            pass
        _delete_topics(self.env, list(self.topics.values()))


# --- waiting for a streaming job -------------------------------------------------------------

def _total(metrics: dict, name: str) -> int:
    return sum(int(v.get(name, 0)) for v in metrics.values())


def await_stream(run: _Run, job: Any, want: dict[str, int], records: int, late: int,
                 late_before: int = 0) -> None:
    """Waits until every sink holds at least ``want[label]`` items, ``late`` late events are
    counted (``late_before`` of them elsewhere, by a backfill) and the job's sources have read
    ``records`` records; then, for :data:`GRACE` seconds, that no sink grows and nothing more
    is read. A job that has read everything and stayed unchanged for :data:`QUIET` seconds
    with less than that is taken as done (the comparison then says what is missing)."""
    from support.waiting import poll_until, wait_until
    seen: dict[str, Any] = {"state": None, "since": time.monotonic()}

    def done() -> str | None:
        counts, metrics = run.counts(), job.metrics()
        read = _total(metrics, "records_in")
        counted = late_before + _stream_late(run.spec, metrics)
        assert read <= records, f"the streaming job read {read} records, {records} were left"
        seen["settled"] = (counts, read)
        if read == records and counted >= late and all(
                counts[k] >= n for k, n in want.items()):
            return "complete"
        now = time.monotonic()
        if (counts, read, counted) != seen["state"]:
            seen["state"], seen["since"] = (counts, read, counted), now
        elif read == records and now - seen["since"] >= QUIET:
            return "quiet"  # everything read, and nothing moves: less than expected came out
        return None

    outcome = wait_until(done, what=f"the streaming job to read {records} records and emit "
                         f"{want} with {late} late events", timeout=WAIT, interval=0.02)
    if outcome != "complete":
        return
    # the grace: nothing more may come (any growth shows in the comparison, so the watch ends
    # at the first change)
    poll_until(lambda: (run.counts(), _total(job.metrics(), "records_in")) != seen["settled"],
               timeout=GRACE, interval=0.02)


def _expected_counts(spec: Spec, expected: RunResult) -> dict[str, int]:
    want = {out_label(n): sum(expected.outputs.get(n, {}).values()) for n in node_ids(spec)}
    for s in spec["stages"]:
        if s["kind"] == "window" and s["late_sink"]:
            want[late_label(s["id"])] = sum(expected.late_items.get(s["id"], {}).values())
    return want


def _union(spec: Spec, run: _Run, late_total: int) -> RunResult:
    """What every sink holds (whoever wrote it), late events counted over all stages."""
    result = RunResult(late_counts={LATE_TOTAL: late_total})
    for node in node_ids(spec):
        result.outputs[node] = multiset(run.read(out_label(node)))
    for s in spec["stages"]:
        if s["kind"] == "window" and s["late_sink"]:
            result.late_items[s["id"]] = multiset(run.read(late_label(s["id"])))
    return result


def _stream_late(spec: Spec, metrics: dict) -> int:
    return sum(metrics.get(v, {}).get("late_events", 0) for s in spec["stages"]
               for v in late_vertices(s["id"]))


# --- the runtimes ----------------------------------------------------------------------------

def _model_expectation(spec: Spec, inputs: Inputs) -> RunResult:
    from .model import run_model
    return expected_run(run_model(spec, inputs, bounded=False))


def run_on_spark(spec: Spec, inputs: Inputs, *, env: KafkaEnv) -> RunResult:
    """The Spark backfill of every record (``until="latest"``), sinks into the member."""
    started = time.perf_counter()
    with _Run(env, spec, inputs) as run:
        result = env.spark.run(run.pipeline(), until="latest", member=env.member)
        env.backfills.append(result)
        assert result.offsets == {run.topics[s]: {p: len(records) for p, records in
                                                  enumerate(inputs["partitions"][s])}
                                  for s in source_names(spec)}, result.offsets
        out = _union(spec, run, result.counters["late_events"])
    env.log.append(("spark", time.perf_counter() - started))
    return out


def run_backfill_then_stream(spec: Spec, inputs: Inputs, split: dict[str, list[int]], *,
                             env: KafkaEnv) -> RunResult:
    """The backfill reads partition ``p`` of source ``s`` up to offset ``split[s][p]`` and
    exports the hand-off snapshot; a streaming job of the same pipeline starts from it and
    reads the rest. The union of what both wrote, late events summed."""
    from jetwake import JobConfig
    started = time.perf_counter()
    with _Run(env, spec, inputs) as run:
        until = {run.topics[s]: dict(enumerate(split[s])) for s in source_names(spec)}
        result = env.spark.run(run.pipeline(), until=until, export_snapshot=run.snapshot,
                               member=env.member)
        env.backfills.append(result)
        assert result.offsets == until, (result.offsets, until)
        backfill_late = result.counters["late_events"]
        job = env.member.new_job(run.pipeline(), JobConfig(initial_snapshot_name=run.snapshot))
        run.jobs.append(job)
        expected = _model_expectation(spec, inputs)
        rest = sum(len(records) - split[s][p] for s in source_names(spec)
                   for p, records in enumerate(inputs["partitions"][s]))
        await_stream(run, job, _expected_counts(spec, expected), rest,
                     expected.total_late, backfill_late)
        out = _union(spec, run, backfill_late + _stream_late(spec, job.metrics()))
    env.log.append(("handoff", time.perf_counter() - started))
    return out


def run_on_member_kafka(spec: Spec, inputs: Inputs, *, env: KafkaEnv) -> RunResult:
    """One streaming job on the member over the topics, read from the earliest offsets; late
    events by stage, as the member counts them."""
    started = time.perf_counter()
    with _Run(env, spec, inputs) as run:
        job = env.member.new_job(run.pipeline())
        run.jobs.append(job)
        expected = _model_expectation(spec, inputs)
        records = sum(len(r) for ps in inputs["partitions"].values() for r in ps)
        await_stream(run, job, _expected_counts(spec, expected), records, expected.total_late)
        out = collect(spec, run.read, job.metrics())
    env.log.append(("member-kafka", time.perf_counter() - started))
    return out


def runtimes(env: KafkaEnv) -> dict[str, Runtime]:
    """The Kafka runtimes bound to ``env``, by name (the hand-off takes a split: bind it with
    ``functools.partial``, or use :func:`run_backfill_then_stream`)."""
    out: dict[str, Runtime] = {
        "member-kafka": lambda spec, inputs: run_on_member_kafka(spec, inputs, env=env)}
    if env.spark is not None:
        out["spark"] = lambda spec, inputs: run_on_spark(spec, inputs, env=env)
    return out


def comparable(expected: RunResult, actual: RunResult) -> RunResult:
    """``expected`` with its late events counted over all stages when ``actual`` has them so
    (a run that involves the backfill)."""
    if LATE_TOTAL not in actual.late_counts:
        return expected
    return RunResult(outputs=expected.outputs, late_items=expected.late_items,
                     late_counts={LATE_TOTAL: expected.total_late})


# --- shapes of differences the suite once found in the backfill ----------------------------------------------------------

def ttl_evicted_by_another_partition(spec: Spec, inputs: Inputs) -> bool:
    """A ``map_stateful`` ttl over several Kafka partitions where a key's state could be
    evicted before one of its events by the watermark of *another* partition.

    The backfill's keyed pass (engine/backfill/keyed.py ``map_stateful``) takes the records
    of several Kafka partitions merged by progress (translate.py ``_by_key_sorted``) and
    evicts every key of the task at the watermark the current record carries: its own
    partition's, capped at the hand-off's. So a key of a partition that is behind is evicted
    at a partition ahead's watermark, above the watermark any member could have had when the
    key's next event arrived (at most its own partition's: the model's bound). Before an event
    ``e`` of partition ``P`` the records processed carry at most ``min(cut, P's watermark
    after e)`` (the merge puts a record of another partition first only when that partition's
    highest time so far is at most P's after ``e``); this predicate is true when that evicts
    the key's state and the model's bound does not."""
    from .model import _Model, evicted_by, final_watermarks, record_times, throttle
    from .spec import upstream_sources, watermark_step
    ttl_stages = [s for s in spec["stages"] if s["kind"] == "map_stateful" and s["ttl"]]
    if not ttl_stages:
        return False
    model = _Model(spec, inputs, bounded=False)
    model.run()
    times = record_times(spec, inputs)
    finals = final_watermarks(spec, inputs)
    lags = {s["name"]: s["lag"] for s in spec["sources"]}
    for stage in ttl_stages:
        sources = upstream_sources(spec, stage["id"])
        if sum(len(inputs["partitions"][s]) for s in sources) < 2:
            continue
        cut = min(finals[s] for s in sources)
        ttl = stage["ttl"]
        last: dict = {}
        for e in sorted(model.events[stage["inputs"][0]], key=lambda e: e.origin):
            rt = times[e.position]
            source = e.origin[0]
            k = e.item[1]
            if k in last:
                top = max(rt.top_before, rt.ts)
                bound = min(cut, throttle(top - lags[source], watermark_step(spec, source)))
                if evicted_by(bound, last[k], ttl) and not evicted_by(rt.wm_before, last[k],
                                                                     ttl):
                    return True
            last[k] = max(last.get(k, rt.ts), rt.ts)
    return False


def a_dropped_record_moved_the_watermark(spec: Spec, inputs: Inputs) -> bool:
    """On a topic of one partition, a record that a stateless stage drops before a window or
    ttl stage moved the watermark that stage's next events meet, and so decides their fate.

    The backfill computes the watermark a window or ttl stage's records meet over Kafka from
    the records that reach the stage (engine/backfill/translate.py
    ``_own_partition_watermarks`` runs on the stage's input, after the stateless stages
    before it), so a record a ``filter``, a ``map`` returning None or an empty ``flat_map``
    dropped on the way does not move it; in the member the source's watermark moves with every
    record it reads. With several partitions the model only fixes verdicts that hold at every
    watermark up to the partition's, so a lower one changes nothing; on one partition read
    directly (the model's exact case) this predicate is true when an event's verdict (late at
    a window, its key's state evicted at a ttl) differs at the watermark of the records that
    reach the stage."""
    from .model import (
        NO_WATERMARK, _Model, evicted_by, late_at_session, late_at_ttl, late_at_window,
        record_times, throttle,
    )
    from .spec import upstream_sources, watermark_step
    model = _Model(spec, inputs, bounded=False)
    model.run()
    times = record_times(spec, inputs)
    lags = {s["name"]: s["lag"] for s in spec["sources"]}
    for stage in spec["stages"]:
        ttl = stage.get("ttl") if stage["kind"] == "map_stateful" else None
        if (stage["kind"] != "window" and ttl is None) or len(stage["inputs"]) != 1:
            continue
        up = stage["inputs"][0]
        sources = sorted(upstream_sources(spec, stage["id"]))
        source = sources[0]
        step = watermark_step(spec, source)
        if len(inputs["partitions"][source]) != 1 or not model.direct[up] or step == 0:
            continue  # not the model's exact case: it holds at any lower watermark
        events = sorted(model.events[up], key=lambda e: e.origin)
        tops: dict[int, int] = {}  # record index -> the highest time of the records before
        top = NO_WATERMARK
        for e in events:
            i = e.position[2]
            if i not in tops:
                tops[i] = top
            top = max(top, e.ts)

        def reached(e: Any) -> int:
            t = tops[e.position[2]]
            return NO_WATERMARK if t == NO_WATERMARK else throttle(t - lags[source], step)
        if stage["kind"] == "window":
            w = stage["window"]
            slide = w[1] if w[0] in ("tumbling", "session") else w[2]
            late = (late_at_session if w[0] == "session" else
                    (lambda t, wm: late_at_window(t, wm, slide)))
            if any(late(e.ts, reached(e)) != late(e.ts, times[e.position].wm_before)
                   for e in events):
                return True
            continue
        state: dict = {}  # key -> the highest time since its state was created
        for e in events:
            k, hi, mine = e.item[1], times[e.position].wm_before, reached(e)
            if k in state:
                if evicted_by(mine, state[k], ttl) != evicted_by(hi, state[k], ttl):
                    return True
                if evicted_by(hi, state[k], ttl):
                    del state[k]
            if late_at_ttl(e.ts, hi, ttl):
                continue
            state[k] = max(state.get(k, e.ts), e.ts)
    return False


def late_at_a_ttl_stage(spec: Spec, inputs: Inputs) -> bool:
    """The model judges an event late at a ``map_stateful`` ttl stage."""
    from .model import run_model
    m = run_model(spec, inputs, bounded=False)
    return any(m.late.get(s["id"]) for s in spec["stages"]
               if s["kind"] == "map_stateful" and s["ttl"] is not None)


def a_partition_unread_at_the_split(inputs: Inputs, split: dict[str, list[int]]) -> bool:
    """The backfill of a hand-off reads nothing of one partition (its offset is 0) and
    something of another.

    The hand-off watermark is computed over the partitions the backfill read records of
    (engine/backfill/translate.py ``timestamps``: ``tops`` has no entry for an
    empty range), so the windows it closes and the watermark the streaming job's window and
    ttl stages restore do not wait for that partition, whose records then arrive late in the
    streaming job; a streaming job that had read the same offsets would hold its watermark
    back until that partition delivered."""
    offsets = [o for parts in split.values() for o in parts]
    return 0 in offsets and any(offsets)


@st.composite
def splits(draw: Any, inputs: Inputs,
           excluding: Callable[[Inputs, dict], bool] | None = None
           ) -> dict[str, list[int]]:
    """Where a hand-off's backfill stops in each partition: ``{source: [offset, ...]}``,
    anywhere from 0 (nothing read) to the partition's length (everything)."""
    split = {s: [draw(st.integers(0, len(records))) for records in parts]
             for s, parts in inputs["partitions"].items()}
    if excluding is not None:
        assume(not excluding(inputs, split))
    return split
