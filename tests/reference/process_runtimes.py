"""Runtimes in other processes: a cluster of three member processes, and one member process
SIGKILLed and restarted under exactly-once. Each is ``(spec, inputs) -> RunResult`` once bound
to its fixture (``PROCESS_RUNTIMES`` maps a name to a factory taking the fixture).

Cluster (:func:`run_on_cluster`)
    The spec's job, ``TestSources.partitioned`` sources and ``Sinks.list`` sinks, submitted
    through a client to the ``three`` fixture's cluster (members with one processor per
    vertex each: a source's partitions are spread over three processors). Its lists are named
    after the sink's label (the same lists in every run: each is a Kafka topic every member
    tails), read through a client once the batch job has completed, then cleared. The
    pipeline's functions travel by value (the members cannot import ``reference``).

    Two engine bugs this runtime found are fixed and kept as tests in
    tests/test_conformance_cluster.py: a two-stage window's accumulator whose input fell idle
    held its partial frames past the idle marker (the combiner then dropped them as late),
    and a keyless aggregate gave one result per member.

    A source of one partition runs on three processors there, two of them without a
    partition: until those have finished, they hold the watermark of every stage downstream
    back, so the member's exact case (one partition fixes the watermark, see
    ``reference/model.py``) does not hold. :func:`run_cluster_model` is the model with that
    case left out (every watermark may be as low as none, as with several partitions), and
    :func:`cluster_scenarios` draws and repairs inputs against it. Under it no event is ever
    determinately late: the cluster conforms on outputs and on-time verdicts.

    ``Job.metrics()`` on a cluster sums every member's processors, so ``late_counts`` are
    the whole cluster's.

SIGKILL (:func:`run_with_kills`)
    One member process (tests/support/conformance_process.py) on a data directory runs the job with
    ``JobConfig(processing_guarantee="exactly_once", snapshot_interval_ms=...)``; it is killed
    with SIGKILL at seeded random moments, each a little after that start committed a new
    snapshot (or, for a kill before the last, three times in ten at any moment: while it
    starts, restores or runs), and started again on the same directory, where the job
    resumes from its last snapshot. After the last start it runs the job to completion and
    writes every sink's items to a file (pickled). Each start records, from the member's log,
    whether it resumed the job and from which snapshot (:attr:`KillRun.resumed_mid_job`: the
    test fails unless one start resumed it mid-run from a snapshot).

    The sinks: ``Sinks.list`` is not usable across a kill (a named list lives in the member's
    memory: the process that dies loses it; docs/fault-tolerance.md). The existing kill tests
    write to a map (``Sinks.map``), which is durable (RocksDB in the data directory) and
    idempotent: a put replayed after a restore writes the same entry. A sink's items are a
    multiset, though (a keyed rolling max emits the same ``(key, max)`` several times), so
    :class:`NumberedMapSink` puts the ``n``-th occurrence of an item under ``(item, n)``,
    counting occurrences per item in snapshotted state: a replay after a restore numbers the
    items again from the counts of the snapshot, and overwrites the same entries. A lost item
    leaves its entry missing, an item emitted once too often adds an entry ``n + 1``.

    The source is ``TestSources.partitioned``'s processor reading at a set pace
    (:class:`PacedPartitionedSource`: the same class and code, one run of a partition per
    call, the next call after a pause) so that the job lasts about three seconds, with
    snapshots in between, and can be killed mid-run. ``late_events`` metrics are counters of
    the current execution (as in Jet): after a restart they count the replayed part again or
    not at all, so :func:`run_with_kills` leaves ``late_counts`` out of the result (the late
    events routed to late sinks are compared exactly) and keeps the last execution's in
    :attr:`KillRun.last_late_counts`, which can only be at most the model's.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
import uuid
import zlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

from hypothesis import assume, strategies as st

from jetwake import Inbox, Processor, ProcessorContext, ProcessorMetaSupplier, Sink, Source
from jetwake.connectors.partitioned_items import PartitionedItemsSourceProcessor
from jetwake.engine.core.partitioning import owner_of_partition

from . import generate
from .generate import build_pipeline, inputs_for, late_label, out_label, specs
from .model import NO_WATERMARK, ModelResult, _Model, expected_run
from .result import RunResult, canonical
from .runners import ORDERS, Runtime, collect
from .spec import Inputs, Spec, node_ids

__all__ = ["PROCESS_RUNTIMES", "run_on_cluster", "run_cluster_model", "cluster_expected",
           "cluster_scenarios", "functions_by_value",
           "run_with_kills",
           "kill_expected", "KillRun", "NumberedMapSink", "numbered_map_sink",
           "read_numbered_map", "PacedPartitionedSource", "paced_partitioned",
           "inputs_from_json", "sink_labels", "stable_key", "read_order"]

JOB_TIMEOUT = 120  # seconds
LIST_PREFIX = "conformance-"
"""The cluster runtime's lists: ``LIST_PREFIX + label``, the same in every run (a cluster's
list is a Kafka topic that every member tails: one per run would pile up), cleared before and
after each run; runs on one cluster must not overlap."""


def read_order(spec: Spec, inputs: Inputs) -> tuple[int, int]:
    """``(batch, seed)`` of ``TestSources.partitioned`` drawn from the inputs (as
    ``runners.run_on_member`` does): examples see different interleavings, a failing one the
    same again."""
    digest = zlib.crc32(repr((spec, inputs)).encode())
    return (1, 3, 8, 64)[digest % 4], digest


# --- the model of several source processors ---------------------------------------------------

class _SeveralProcessorsModel(_Model):
    """The model where a source of one partition has other processors beside the one reading
    it: the watermark a stage sees may be as low as none for every event."""

    def watermark_range(self, stage: dict, e: Any) -> tuple[int, int]:
        return NO_WATERMARK, super().watermark_range(stage, e)[1]


def run_cluster_model(spec: Spec, inputs: Inputs, *args: Any, **kwargs: Any) -> ModelResult:
    """``model.run_model`` for a cluster (see the module doc); other arguments as there."""
    return _SeveralProcessorsModel(spec, inputs, *args, **kwargs).run()


def cluster_expected(spec: Spec, inputs: Inputs) -> RunResult:
    """What a cluster run of ``spec`` must give (every verdict fixed for any watermark up to
    the partition's own)."""
    return expected_run(run_cluster_model(spec, inputs))


@contextlib.contextmanager
def _model_for_repair(run_model: Callable[[Spec, Inputs], ModelResult]) -> Iterator[None]:
    """``generate.repair`` judging doubts by ``run_model`` (it calls the module's
    ``run_model``)."""
    saved = generate.run_model
    generate.run_model = run_model  # type: ignore[assignment]
    try:
        yield
    finally:
        generate.run_model = saved  # type: ignore[assignment]


@st.composite
def cluster_scenarios(draw: Any, beyond_lag: bool = True,
                      max_records: int = 40) -> tuple[Spec, Inputs]:
    """``generate.scenarios`` repaired and checked against :func:`run_cluster_model`."""
    spec = draw(specs())
    raw = draw(inputs_for(spec, beyond_lag, False, max_records))
    with _model_for_repair(run_cluster_model):
        inputs = generate.repair(spec, raw)
    assume(not run_cluster_model(spec, inputs).indeterminate)
    return spec, inputs


# --- the cluster ------------------------------------------------------------------------------

@contextlib.contextmanager
def functions_by_value() -> Iterator[None]:
    """The pipeline's functions travel by value: member processes cannot import
    ``reference`` (tests/ is not on their path)."""
    import cloudpickle

    from . import functions
    modules = [functions, generate, sys.modules[__name__]]
    for m in modules:
        cloudpickle.register_pickle_by_value(m)
    try:
        yield
    finally:
        for m in modules:
            cloudpickle.unregister_pickle_by_value(m)


def run_on_cluster(cluster: Any, spec: Spec, inputs: Inputs, *, order: str = "round_robin",
                   batch: int | None = None, seed: int | None = None,
                   via: int | None = None) -> RunResult:
    """The spec's job on ``cluster`` (a ``support.cluster_processes.ClusterProcesses``, its
    members up), submitted through member ``via`` (drawn from the inputs by default) and read
    through another."""
    from jetwake import JobConfig, Sinks, TestSources
    b, s = read_order(spec, inputs)
    batch = b if batch is None else batch
    seed = s if seed is None else seed
    members = [m for m in cluster.members if m.alive()]
    via = seed % len(members) if via is None else via
    run = f"cf{uuid.uuid4().hex[:10]}"

    def source_for(name: str, partitions: list) -> Any:
        return TestSources.partitioned(partitions, batch=batch, order=order, seed=seed)

    def sink_for(label: str) -> Any:
        return Sinks.list(f"{LIST_PREFIX}{label}")

    pipeline = build_pipeline(spec, inputs, source_for, sink_for)
    names = [f"{LIST_PREFIX}{label}" for label in sink_labels(spec)]
    with members[via].client() as client:
        for n in names:  # anything an earlier run left
            client.get_list(n).clear()
        with functions_by_value():
            job = client.new_job(pipeline, JobConfig(name=run))
        try:
            job.join(timeout=JOB_TIMEOUT)
        except BaseException:
            with contextlib.suppress(Exception):
                job.cancel()
            raise
        metrics = job.metrics()
    with members[(via + 1) % len(members)].client() as client:
        lists = {n: client.get_list(n).to_list() for n in names}
        for n in names:
            client.get_list(n).clear()
    return collect(spec, lambda label: lists[f"{LIST_PREFIX}{label}"], metrics)


def sink_labels(spec: Spec) -> list[str]:
    """Every sink label of ``spec``'s job."""
    return [out_label(n) for n in node_ids(spec)] + \
        [late_label(s["id"]) for s in spec["stages"] if s["kind"] == "window" and s["late_sink"]]


# --- the member killed with SIGKILL -------------------------------------------------------------

def stable_key(x: Any) -> str:
    """A text for ``x`` the same in every process (``repr`` of a set depends on the process's
    string hashing), equal for items equal across runtimes (``result.canonical``)."""
    return _stable(canonical(x))


def _stable(c: Any) -> str:
    if isinstance(c, tuple):
        return "(" + ",".join(_stable(y) for y in c) + ")"
    if isinstance(c, frozenset):
        return "{" + ",".join(sorted(_stable(y) for y in c)) + "}"
    return repr(c)


def _from_json(x: Any) -> Any:
    """Inputs back from JSON: lists become tuples (records, build pairs), as the generator
    made them."""
    if isinstance(x, list):
        return tuple(_from_json(y) for y in x)
    if isinstance(x, dict):
        return {k: _from_json(v) for k, v in x.items()}
    return x


def inputs_from_json(data: dict) -> Inputs:
    """Inputs as JSON gave them back: each partition a list of record tuples."""
    return {"partitions": {s: [[_from_json(r) for r in records] for records in parts]
                           for s, parts in data["partitions"].items()},
            "build": [_from_json(b) for b in data.get("build", [])]}


class NumberedMapSink(Processor):
    """Puts the ``n``-th occurrence of an item into the member's map ``name`` as
    ``(stable_key(item), n) -> item``; the counts per item are saved in snapshots (see the
    module doc). Items reach it partitioned by ``stable_key``: one processor counts an item,
    and its saved count goes back to that processor on a restore."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.counts: dict[str, int] = {}
        self._map: Any = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._map = context.member.get_map(self.name)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        entries = []
        for x in inbox.drain():
            k = stable_key(x)
            n = self.counts.get(k, 0) + 1
            self.counts[k] = n
            entries.append(((k, n), x))
        self._map.put_all(entries)

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_all_to_snapshot(list(self.counts.items()))

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for k, n in inbox.drain():
            self.counts[k] = n


def numbered_map_sink(name: str) -> Sink:
    """A ``Sink`` writing every item once into the map ``name`` (see :class:`NumberedMapSink`),
    exactly once through restores; read it with :func:`read_numbered_map`."""
    return Sink(f"numbered-map-sink-{name}",
                ProcessorMetaSupplier.of(partial(NumberedMapSink, name)),
                partition_key_fn=stable_key)


def read_numbered_map(m: Any) -> tuple[list, list[str]]:
    """The items a numbered map holds, and the gaps in its numbering (an item whose ``n``-th
    occurrence is there but not an earlier one: empty when the map is whole)."""
    items, seen = [], {}
    for (k, n), x in m.items():
        items.append(x)
        seen.setdefault(k, set()).add(n)
    gaps = [f"{k} #{sorted(ns)}" for k, ns in seen.items() if ns != set(range(1, len(ns) + 1))]
    return items, gaps


class _Pause(Exception):
    """Ends a :class:`PacedPartitionedSource`'s ``complete()`` between two runs."""


class PacedPartitionedSource(PartitionedItemsSourceProcessor):
    """``TestSources.partitioned``'s processor reading one run of a partition per call of
    ``complete()`` and then none for ``pace`` seconds per item it read, so that a small input
    lasts long enough to be killed in the middle, with snapshots in between (the original
    reads until its outbox is full: all of a small input in one call, before any barrier).

    The connector's ``complete()`` runs unchanged: it is left between two runs, where it
    would stop for a full outbox, by an exception from ``_next_run``."""

    def __init__(self, partitions: list, batch: int, order: str, seed: int,
                 pace: float) -> None:
        super().__init__(partitions, batch, order, seed)
        self.pace = pace
        self._runs_left = 0
        self._next_at = 0.0

    def complete(self) -> bool:
        if time.monotonic() < self._next_at:
            return False
        self._runs_left = 1
        try:
            return super().complete()
        except _Pause:
            return False

    def _next_run(self) -> tuple[int, int] | None:
        if self._runs_left <= 0:
            raise _Pause
        self._runs_left -= 1
        run = super()._next_run()
        if run is not None:
            p, n = run
            self._next_at = time.monotonic() + \
                self.pace * min(n, len(self.partitions[p]) - self.pos[p])
        return run


def paced_partitioned(partitions: list, *, batch: int, order: str, seed: int,
                      pace: float) -> Source:
    """A ``Source`` like ``TestSources.partitioned`` reading about one item per ``pace``
    seconds per processor."""
    data = [list(p) for p in partitions]
    return Source("test-partitions", ProcessorMetaSupplier.of(
        partial(PacedPartitionedSource, data, batch, order, seed, pace)), partitioned=True)


SCRIPT = Path(__file__).resolve().parent.parent / "support" / "conformance_process.py"


@dataclass
class KillRun:
    """What :func:`run_with_kills` did: the kills and what each start found."""
    seed: int
    kills: list[dict] = field(default_factory=list)
    starts: list[dict] = field(default_factory=list)
    result: RunResult | None = None
    gaps: list[str] = field(default_factory=list)
    last_late_counts: dict[str, int] = field(default_factory=dict)
    """The ``late_events`` of each window and ttl stage in the last execution alone: each
    event it processed it judged once, so at most the model's count for the whole run."""

    @property
    def resumed_mid_job(self) -> int:
        """Starts that resumed the job, running when the process before was killed, from a
        snapshot that process had committed (the member's log says both)."""
        return sum(1 for s in self.starts
                   if s.get("resumed_from") is not None and s.get("restored_snapshot") is not None)

    def describe(self) -> str:
        keys = ("resumed_from", "restored_snapshot", "status")
        return (f"kill seed {self.seed}; kills {self.kills}; starts "
                f"{[{k: s.get(k) for k in keys} for s in self.starts]}")


def _start(case: Path, data_dir: Path, final: bool) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JETWAKE_")}
    args = [sys.executable, str(SCRIPT), str(case), str(data_dir)] + (["final"] if final else [])
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _progress(data_dir: Path) -> dict:
    try:
        return json.loads((data_dir.parent / "progress.json").read_text())
    except (OSError, ValueError):
        return {}


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    if proc.stderr is not None:
        proc.stderr.close()


def run_with_kills(spec: Spec, inputs: Inputs, workdir: Path, seed: int, *, kills: int = 2,
                   order: str | None = None, seconds: float = 3.0,
                   snapshot_interval_ms: int = 100, local_parallelism: int = 2) -> KillRun:
    """The spec's job on one member process killed ``kills`` times (see the module doc).
    ``seconds``: about how long the sources take to read their inputs (the pace follows);
    ``seed`` fixes the read order's seed and the moments of the kills."""
    from support.waiting import poll_until
    rnd = random.Random(seed)
    batch, source_seed = read_order(spec, inputs)
    order = order or ORDERS[seed % len(ORDERS)]
    # the most records one source processor reads (a source of one partition has one)
    most = 1
    for parts in inputs["partitions"].values():
        n = local_parallelism if len(parts) > 1 else 1
        for j in range(n):
            most = max(most, sum(len(records) for p, records in enumerate(parts)
                                 if owner_of_partition(0, p, 1, n) == j))
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir = workdir / "member"
    case = workdir / "case.json"
    case.write_text(json.dumps({
        "spec": spec, "inputs": inputs, "batch": batch, "order": order, "seed": source_seed,
        "pace": seconds / most, "snapshot_interval_ms": snapshot_interval_ms,
        "local_parallelism": local_parallelism}))
    run = KillRun(seed)
    t0 = time.monotonic()
    for i in range(kills):
        proc = _start(case, data_dir, final=False)
        try:
            before = _progress(data_dir).get("snapshot", -1)
            # the last kill always comes after a snapshot of its own start: at least one
            # start resumes the job from a snapshot in the middle of its run
            anywhere = i < kills - 1 and rnd.random() < 0.3
            # the waits end early when the process exits; the kill's record says so
            if anywhere:  # any moment: while starting, restoring or running
                poll_until(lambda: proc.poll() is not None, timeout=rnd.uniform(0.05, 1.2))
            else:  # once this start committed a snapshot, then a little later
                def snapshot_of_its_own(proc: subprocess.Popen = proc) -> bool:
                    p = _progress(data_dir)
                    return proc.poll() is not None or p.get("pid") == proc.pid and (
                        p.get("snapshot", -1) > before or p.get("status") == "COMPLETED")
                poll_until(snapshot_of_its_own, timeout=60, interval=0.005)
                time.sleep(rnd.uniform(0.0, 0.3))  # the moment of the kill is the experiment
            p = _progress(data_dir)
            run.kills.append({"at": round(time.monotonic() - t0, 2), "anywhere": anywhere,
                              "status": p.get("status") if p.get("pid") == proc.pid else None,
                              "snapshot": p.get("snapshot") if p.get("pid") == proc.pid
                              else None,
                              "exited": proc.poll()})
        finally:
            _kill(proc)
    proc = _start(case, data_dir, final=True)
    try:
        _, err = proc.communicate(timeout=JOB_TIMEOUT)
    finally:
        _kill(proc)
    starts_file = workdir / "starts.jsonl"
    if starts_file.exists():
        run.starts = [json.loads(line) for line in starts_file.read_text().splitlines()
                      if line.strip()]
    if proc.returncode != 0:
        raise AssertionError(f"{run.describe()}\nthe last start exited with "
                             f"{proc.returncode}:\n{err.decode()[-4000:]}")
    with open(workdir / "result.pickle", "rb") as f:
        data = pickle.load(f)
    lists = data["sinks"]
    result = collect(spec, lambda label: lists.get(label, []), data["metrics"])
    run.last_late_counts = result.late_counts
    result.late_counts = {}  # counters of the last execution only (see the module doc)
    run.result = result
    run.gaps = data["gaps"]
    return run


def kill_expected(spec: Spec, inputs: Inputs) -> RunResult:
    """The model's run without late counts (see :func:`run_with_kills`)."""
    from .model import run_model
    expected = expected_run(run_model(spec, inputs))
    expected.late_counts = {}
    return expected


# --- the registry --------------------------------------------------------------------------------

def _killed_member(workdir: Path, spec: Spec, inputs: Inputs) -> RunResult:
    run = run_with_kills(spec, inputs, workdir / uuid.uuid4().hex[:8],
                         zlib.crc32(repr((spec, inputs)).encode()))
    assert run.result is not None
    return run.result


PROCESS_RUNTIMES: dict[str, Callable[[Any], Runtime]] = {
    **{f"cluster-{order}": (lambda order: lambda cluster: partial(
        run_on_cluster, cluster, order=order))(order) for order in ORDERS},
    "member-sigkill": lambda workdir: partial(_killed_member, Path(workdir)),
}
"""Runtimes in processes of their own, by name: each a factory taking its fixture (the
``three`` cluster; a work directory for the SIGKILL runtime) and returning the
``(spec, inputs) -> RunResult`` runtime. Compare a cluster run with :func:`cluster_expected`
and a SIGKILL run with :func:`kill_expected` (no late counts); tests/test_conformance_kill.py
calls :func:`run_with_kills` itself, to check that the kills happened."""
