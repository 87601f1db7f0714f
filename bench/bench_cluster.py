"""A cluster of member processes on one host: does a second member make jobs faster?

``python -m bench cluster`` (part of ``make bench``), or with options
``python -m bench.bench_cluster [--words N] [--records N] [--runs 3] [--parts
wordcount,kafka,edge] [--bootstrap HOST:PORT]``.

Under the GIL one member process uses about one core; more members on one host are how jetwake
uses more cores. Members are real processes (``jetwake member start --cluster ...`` on free
loopback ports, fresh data directories under a temporary directory, ``--cooperative-threads 1
--local-parallelism 1``), started once per part and stopped after it (SIGTERM, then SIGKILL).
Three parts, each beside a baseline measured in the same run:

1. *wordcount*: a CPU-bound word count, ``Sources.items(range(n))`` -> a costly map (about
   30 µs of pure Python per word, ``bench/cluster_workloads.py``) -> ``group_by(word)`` and
   counting -> files, on a cluster of 1 member and one of 2; beside the same work as a plain
   loop in 1 process and split over 2 processes (what the machine itself gives a second
   process). Items/s from the first item any processor saw to the last result written; the
   start-up (submit to first item) apart. The counts are checked.
2. *kafka*: workload B of ``bench/kafka_spec.py`` (Kafka -> tumbling 1 s count per key ->
   Kafka, exactly-once, snapshots every second; JSON records of about 100 bytes, 6
   partitions, 10,000 keys) on 1 member and on 2, beside the raw confluent-kafka loop of
   ``bench/kafka_runners.py``. Records/s from the first record to the last window result
   handed to the sink, as ``bench/bench_kafka_peers.py`` measures; every window's total is
   checked against the input's.
3. *edge*: chunks over one member-to-member stream (``EdgeTransport`` between two
   ``PeerNetwork`` instances in two processes), beside a plain socket loop that serializes and
   decodes the same chunks by hand and one that moves the same bytes serialized in advance.

Every row also shows the CPU the members used (cores, over the measured interval) and how busy
the whole machine was: on a shared machine a figure is only as good as the cores it had.
Runs alternate between the variants; the tables show the median and the range.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from bench import cluster_workloads as workloads
from bench import kafka_spec as spec
from bench.cluster_members import BenchCluster

MEMBER_ARGS = ["--cooperative-threads", "1", "--local-parallelism", "1"]
PARTS = ("wordcount", "kafka", "edge")
WORDCOUNT_GOAL = 1.7     # 2 members / 1 member
KAFKA_GOAL = 1.6         # 2 members / the raw loop


# --- CPU accounting ----------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float | None:
    """utime + stime of every thread of ``pid`` in seconds (from /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


def machine_busy() -> float:
    """CPU seconds every core of the machine spent busy so far (not idle, not waiting)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / _TICK


def local_broker_pid(bootstrap: str) -> int | None:
    """The pid of the broker at ``bootstrap`` when it is one that
    ``tests/support/local_kafka/kafka_local.py`` started on this host (its command line names
    its run directory ``run-PORT``); None otherwise. It shares the cores with the members."""
    port = bootstrap.rsplit(":", 1)[-1].split(",")[0]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        if "kafka.Kafka" in cmdline and f"run-{port}" in cmdline:
            return int(entry)
    return None


class CpuSampler:
    """Samples the CPU time of some processes and of the whole machine every ``interval`` s
    on a thread, so that the CPU used over any interval of the run can be read afterwards."""

    def __init__(self, pids: list[int], interval: float = 0.05) -> None:
        self.pids = pids
        self.interval = interval
        self.samples: list[tuple[float, float, float]] = []  # (time, processes, machine)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        cpus = [process_cpu(p) for p in self.pids]
        self.samples.append((time.time(), sum(c for c in cpus if c is not None),
                             machine_busy()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "CpuSampler":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sample()

    def _at(self, t: float, column: int) -> float:
        s = self.samples
        before = [x for x in s if x[0] <= t]
        after = [x for x in s if x[0] >= t]
        if not before:
            return s[0][column]
        if not after:
            return s[-1][column]
        a, b = before[-1], after[0]
        if b[0] == a[0]:
            return a[column]
        return a[column] + (b[column] - a[column]) * (t - a[0]) / (b[0] - a[0])

    def cores(self, t0: float, t1: float) -> tuple[float, float]:
        """(cores the processes used, cores the machine was busy) over [t0, t1]."""
        span = max(t1 - t0, 1e-9)
        return ((self._at(t1, 1) - self._at(t0, 1)) / span,
                (self._at(t1, 2) - self._at(t0, 2)) / span)


# --- results and tables ------------------------------------------------------------------------

@dataclass
class Run:
    rate: float | None = None          # items or records per second
    cpu: float | None = None           # cores the measured processes used
    busy: float | None = None          # cores the machine was busy
    startup: float | None = None
    complete: bool = True
    note: str = ""
    extra: dict = field(default_factory=dict)


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _rates(runs: list[Run]) -> list[float]:
    return [r.rate for r in runs if r.rate]


def _fmt_rate(x: float) -> str:
    return f"{x / 1e6:,.2f}M" if x >= 1e6 else f"{x / 1e3:,.1f}k"


def print_table(title: str, rows: list[tuple[str, list[Run]]], base: str, unit: str) -> None:
    """One row per variant: the median rate, its range, the ratio to the ``base`` row's
    median, MB/s where measured, the CPU and machine load (medians), the start-up and the
    output check."""
    print(f"\n{title}\n  (ratio: to the median of \"{base}\")")
    medians = {label: _median(_rates(rs)) for label, rs in rows if _rates(rs)}
    with_mb = any("mb_s" in r.extra for _, rs in rows for r in rs)
    mb_head = f" {'MB/s':>6}" if with_mb else ""
    print(f"  {'variant':<44} {unit:>10} {'range':>17} {'ratio':>6}{mb_head} {'CPU':>5} "
          f"{'machine':>7} {'start-up':>8}  output")
    for label, rs in rows:
        rates = _rates(rs)
        if not rates:
            print(f"  {label:<44} {'failed':>10}  {rs[-1].note if rs else ''}")
            continue
        med = medians[label]
        ratio = f"{med / medians[base]:.2f}" if base in medians else "-"
        cpu = [r.cpu for r in rs if r.cpu is not None]
        busy = [r.busy for r in rs if r.busy is not None]
        starts = [r.startup for r in rs if r.startup is not None]
        mbs = [r.extra["mb_s"] for r in rs if "mb_s" in r.extra]
        rng = f"[{_fmt_rate(min(rates))}-{_fmt_rate(max(rates))}]"
        complete = sum(r.complete for r in rs)
        cpu_text = f"{_median(cpu):.2f}" if cpu else "-"
        busy_text = f"{_median(busy):.2f}" if busy else "-"
        mb_text = (f" {_median(mbs):>6,.0f}" if mbs else f" {'-':>6}") if with_mb else ""
        print(f"  {label:<44} {med:>10,.0f} {rng:>17} {ratio:>6}{mb_text} {cpu_text:>5} "
              f"{busy_text:>7} {(f'{_median(starts):.2f}s') if starts else '-':>8}  "
              f"{complete}/{len(rs)} complete; {rs[-1].note}")


def ratio_line(rows: dict[str, list[Run]], top: str, bottom: str, what: str,
               goal: float | None = None) -> float | None:
    a, b = _rates(rows.get(top, [])), _rates(rows.get(bottom, []))
    if not a or not b:
        return None
    r = _median(a) / _median(b)
    # the ratio of each run's pair too: the spread of the machine shows in it
    pairs = [x.rate / y.rate for x, y in zip(rows[top], rows[bottom]) if x.rate and y.rate]
    span = ""
    if len(pairs) > 1:
        # other work on the machine only ever slows a run down: the best runs show what the
        # code can do, the medians what it did
        span = (f" (per run {min(pairs):.2f}-{max(pairs):.2f}; best / best "
                f"{max(a) / max(b):.2f})")
    goal_text = f"; goal >= {goal}" if goal else ""
    print(f"  {what}: {r:.2f}{span}{goal_text}")
    return r


# --- part 1: the CPU-bound word count ----------------------------------------------------------

def _plain_worker(start: int, end: int, rounds: int, pipe: Any) -> None:
    t0 = time.time()
    counts: dict[str, int] = {}
    for i in range(start, end):
        w = workloads.costly_word(i, rounds)
        counts[w] = counts.get(w, 0) + 1
    pipe.send((t0, time.time(), counts))


def plain_loops(n: int, processes: int) -> Run:
    """The word count as a plain loop, the input split over ``processes`` processes (each
    started before the clock: their own loop's first and last moment count)."""
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for k in range(processes):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_plain_worker,
                        args=(n * k // processes, n * (k + 1) // processes,
                              workloads.ROUNDS, child))
        p.start()
        pipes.append(parent)
        procs.append(p)
    with CpuSampler([p.pid for p in procs]) as sampler:
        results = [pipe.recv() for pipe in pipes]
    for p in procs:
        p.join(30)
    t0 = min(r[0] for r in results)
    t1 = max(r[1] for r in results)
    total: dict[str, int] = {}
    for _, _, counts in results:
        for w, c in counts.items():
            total[w] = total.get(w, 0) + c
    cpu, busy = sampler.cores(t0, t1)
    ok = total == workloads.expected_counts(n)
    rate = n / (t1 - t0)
    note = ("counts right" if ok else "COUNTS WRONG") + f"; {cpu / rate * 1e6:.1f} µs CPU per word"
    return Run(rate, cpu, busy, None, ok, note)


def cluster_word_count(cluster: BenchCluster, n: int, timeout: float) -> Run:
    """One word count job on ``cluster``: submit, wait until it completes, check the counts."""
    from jetwake import JobConfig

    scratch = tempfile.mkdtemp(prefix="bench-wc-")
    report_dir = os.path.join(scratch, "first")
    out_dir = os.path.join(scratch, "out")
    os.makedirs(report_dir)
    os.makedirs(out_dir)
    try:
        with CpuSampler(cluster.pids()) as sampler, cluster.client() as client:
            t_submit = time.time()
            job = client.new_job(workloads.word_count_pipeline(n, report_dir, out_dir),
                                 JobConfig(name=f"bench-wc-{uuid.uuid4().hex[:6]}"))
            job.join(timeout)
        first = workloads.first_item_time(report_dir)
        counts, last, twice = workloads.read_counts(out_dir)
        if first is None or last is None:
            return Run(complete=False, note="no first item or no output noted")
        ok = counts == workloads.expected_counts(n) and not twice
        cpu, busy = sampler.cores(first, last)
        rate = n / (last - first)
        note = "counts right" if ok else f"COUNTS WRONG ({twice} words counted twice)"
        note += f"; {cpu / rate * 1e6:.1f} µs CPU per word"
        return Run(rate, cpu, busy, first - t_submit, ok, note)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def part_wordcount(bootstrap: str, n: int, runs: int) -> dict[str, list[Run]]:
    labels = {"p1": "plain loop, 1 process", "p2": "plain loop, 2 processes",
              "c1": "cluster of 1 member", "c2": "cluster of 2 members"}
    rows: dict[str, list[Run]] = {v: [] for v in labels.values()}
    t0 = time.process_time()  # CPU time: what the map costs, however busy the machine is
    workloads.plain_loop(5000)
    per_word = (time.process_time() - t0) / 5000
    print(f"   word count: {n:,} words, costly map {per_word * 1e6:.0f} µs of CPU per word here "
          f"({workloads.ROUNDS} rounds), {workloads.VOCABULARY:,} distinct words; "
          f"starting the clusters ...", flush=True)
    timeout = 120 + n * per_word * 4
    with BenchCluster(bootstrap, 1, MEMBER_ARGS) as one, \
            BenchCluster(bootstrap, 2, MEMBER_ARGS) as two:
        variants: list[tuple[str, Callable[[], Run]]] = [
            (labels["p1"], lambda: plain_loops(n, 1)),
            (labels["c1"], lambda: cluster_word_count(one, n, timeout)),
            (labels["p2"], lambda: plain_loops(n, 2)),
            (labels["c2"], lambda: cluster_word_count(two, n, timeout)),
        ]
        for run in range(runs):
            order = variants[run % len(variants):] + variants[:run % len(variants)]
            for label, fn in order:
                r = _attempt(fn)
                rows[label].append(r)
                _print_run(run, label, r, "items/s")
    print_table(f"Word count with a costly map ({n:,} words, about {per_word * 1e6:.0f} µs "
                f"of CPU each; median of {runs} run(s), range in brackets; CPU = cores the "
                f"processes used, machine = cores busy)",
                [(label, rows[label]) for label in labels.values()],
                labels["p1"], "items/s")
    ratio_line(rows, labels["c2"], labels["c1"], "cluster of 2 members / 1 member",
               WORDCOUNT_GOAL)
    ratio_line(rows, labels["p2"], labels["p1"],
               "plain loop in 2 processes / 1 (what this machine gives a second process)")
    return rows


# --- part 2: Kafka -> tumbling window count -> Kafka -------------------------------------------

def cluster_kafka_run(cluster: BenchCluster, bootstrap: str, admin: Any, inp: Any,
                      timeout: float, broker: int | None = None) -> Run:
    """Workload B as an exactly-once job on ``cluster``; cancelled once its output is
    complete."""
    from confluent_kafka import Consumer, TopicPartition

    from bench.bench_kafka_peers import _check_b, new_topic
    from jetwake import JobConfig

    out = new_topic(admin, f"bench-out-cluster{cluster.size}")
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                      "enable.auto.commit": False, "isolation.level": "read_committed"})
    probe.assign([TopicPartition(out, p, -2) for p in range(spec.PARTITIONS)])
    values: list[bytes] = []
    run = Run()
    try:
        with CpuSampler(cluster.pids()) as sampler, \
                CpuSampler([broker] if broker else []) as broker_sampler, \
                cluster.client() as client:
            t_submit = time.time()
            job = client.new_job(
                workloads.kafka_window_pipeline(bootstrap, inp.topic, out),
                JobConfig(name=f"bench-kafka-{uuid.uuid4().hex[:6]}",
                          processing_guarantee="exactly_once", snapshot_interval_ms=1000))
            deadline = time.monotonic() + timeout
            t_first = None
            # the first record, from the sources' metrics (on the member coordinating the
            # job; every member starts its share at the same moment)
            while t_first is None:
                if any(m.get("records_in", 0) for m in job.metrics().values()):
                    t_first = time.time()
                elif time.monotonic() > deadline:
                    run.complete, run.note = False, f"no record read in {timeout:.0f} s"
                    return run
                else:
                    time.sleep(0.003)
            while len(values) < inp.window_results:
                for m in probe.consume(5000, 0.05):
                    if m.error() is None and m.key() != spec.END_KEY:
                        values.append(m.value())
                if time.monotonic() > deadline:
                    run.complete = False
                    run.note = (f"not complete after {timeout:.0f} s ({len(values):,} of "
                                f"{inp.window_results:,} results); job {job.status}: "
                                f"{job.failure or ''}")
                    return run
            t_visible = time.time()
            snap = job.last_snapshot
            snap_ms = getattr(snap, "duration_ms", None)
            job.cancel()
            job.wait_for_status(lambda info: info.get("done"), 60)
        ok, note, t_done = _check_b(values, inp)
        cpu, busy = sampler.cores(t_first, t_done)
        if broker:
            note += f"; the broker used {broker_sampler.cores(t_first, t_done)[0]:.2f} cores"
        snap_text = f", the last snapshot took {snap_ms:.0f} ms" if snap_ms is not None else ""
        rate = inp.n / (t_done - t_first)
        return Run(rate, cpu, busy, t_first - t_submit, ok,
                   f"{note}; {cpu / rate * 1e6:.2f} µs member CPU per record; visible after "
                   f"+{t_visible - t_done:.2f} s{snap_text}")
    finally:
        probe.close()


def raw_kafka_run(bootstrap: str, admin: Any, inp: Any, timeout: float) -> Run:
    from bench.bench_kafka_peers import Variant, run_once

    r = run_once(Variant("raw", "B", "none"), bootstrap, admin, inp, {}, timeout)
    note = r.note
    if r.rate and r.cpu is not None:
        note += f"; {r.cpu / r.rate * 1e6:.2f} µs CPU per record"
    return Run(r.rate, r.cpu, None, r.startup, r.complete, note)


def part_kafka(bootstrap: str, records: int, runs: int) -> dict[str, list[Run]]:
    from confluent_kafka.admin import AdminClient

    from bench.bench_kafka_peers import fill, warm_up

    labels = {"raw": "raw confluent-kafka loop (no guarantee)",
              "c1": "cluster of 1 member (exactly-once)",
              "c2": "cluster of 2 members (exactly-once)"}
    rows: dict[str, list[Run]] = {v: [] for v in labels.values()}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    print(f"   kafka: filling {records:,} records ...", flush=True)
    t0 = time.perf_counter()
    inp = fill(bootstrap, admin, records)
    warm_up(bootstrap)
    print(f"   input {inp.topic} written in {time.perf_counter() - t0:.1f} s; starting the "
          "clusters ...", flush=True)
    timeout = 120 + records / 2000
    broker = local_broker_pid(bootstrap)
    with BenchCluster(bootstrap, 1, MEMBER_ARGS) as one, \
            BenchCluster(bootstrap, 2, MEMBER_ARGS) as two:
        variants: list[tuple[str, Callable[[], Run]]] = [
            (labels["raw"], lambda: raw_kafka_run(bootstrap, admin, inp, timeout)),
            (labels["c1"], lambda: cluster_kafka_run(one, bootstrap, admin, inp, timeout,
                                                     broker)),
            (labels["c2"], lambda: cluster_kafka_run(two, bootstrap, admin, inp, timeout,
                                                     broker)),
        ]
        for run in range(runs):
            order = variants[run % len(variants):] + variants[:run % len(variants)]
            for label, fn in order:
                r = _attempt(fn)
                rows[label].append(r)
                _print_run(run, label, r, "records/s")
    print_table(f"Kafka -> tumbling 1 s count per key -> Kafka ({records:,} records, "
                f"{spec.PARTITIONS} partitions, {spec.KEYS:,} keys; median of {runs} run(s); "
                "CPU = cores the members or the raw loop used, the broker not included)",
                [(label, rows[label]) for label in labels.values()], labels["raw"],
                "records/s")
    ratio_line(rows, labels["c2"], labels["raw"], "cluster of 2 members / raw loop",
               KAFKA_GOAL)
    ratio_line(rows, labels["c2"], labels["c1"], "cluster of 2 members / 1 member")
    return rows


# --- part 3: one member-to-member edge ---------------------------------------------------------

EDGE_SHAPES = {
    # shape: (items per chunk, chunks, what an item is); each run lasts a second or more: a
    # stream's window starts at 1 MiB and about doubles with each ack (every 20 ms), so a run
    # of a few hundred ms at 1 GB/s would mostly measure that ramp
    "tuples": (1000, 2000, "(int, short str) tuples, chunks of 1000"),
    "bytes1k": (64, 24000, "1 KiB bytes values, chunks of 64"),
}
EDGE_MODES = {"edge": "EdgeTransport (PeerNetwork to PeerNetwork)",
              "raw": "socket loop, dumps + loads per chunk",
              "raw-bytes": "socket loop, bytes serialized in advance"}


def edge_run(mode: str, shape: str, timeout: float = 120.0) -> Run:
    from bench import cluster_edge_peer as peer

    chunk_items, chunk_count, _ = EDGE_SHAPES[shape]
    ctx = multiprocessing.get_context("spawn")
    r_parent, r_child = ctx.Pipe()
    s_parent, s_child = ctx.Pipe()
    receiver = ctx.Process(target=peer.receive, args=(r_child, mode), daemon=True)
    receiver.start()
    sender = None
    try:
        if not r_parent.poll(60):
            return Run(complete=False, note="the receiver did not start")
        address = r_parent.recv()
        sender = ctx.Process(target=peer.send, args=(s_child, mode, address, shape,
                                                     chunk_items, chunk_count), daemon=True)
        sender.start()
        with CpuSampler([receiver.pid, sender.pid]) as sampler:
            cpu0 = [process_cpu(sender.pid), process_cpu(receiver.pid)]
            s_parent.send("go")
            if not r_parent.poll(timeout):
                return Run(complete=False, note=f"not received in {timeout:.0f} s")
            got = r_parent.recv()
            sent = s_parent.recv()
            cpu1 = [process_cpu(sender.pid), process_cpu(receiver.pid)]
            s_parent.send("stop")
        elapsed = got["t_done"] - sent["t_start"]
        want = chunk_items * chunk_count
        items = got["items"] if mode != "raw-bytes" else got["entries"] * chunk_items
        ok = got["entries"] == chunk_count and items == want
        cpu, busy = sampler.cores(sent["t_start"], got["t_done"])
        mb = sent["payload_bytes"] / elapsed / 1e6
        # each process's CPU per item: what the figure costs, whatever else ran meanwhile
        per_item = [(b - a) / want * 1e6 if a is not None and b is not None else float("nan")
                    for a, b in zip(cpu0, cpu1)]
        note = (f"{got['entries']:,} chunks; CPU per item: sender {per_item[0]:.2f} µs, "
                f"receiver {per_item[1]:.2f} µs")
        if "stats" in got:
            peer_stats = next(iter(got["stats"]["peers"].values()), {})
            note += f"; {peer_stats.get('packets_received', 0):,} packets"
        if not ok:
            note += f"; RECEIVED {got['entries']} of {chunk_count} chunks"
        return Run(want / elapsed, cpu, busy, None, ok, note, {"mb_s": mb})
    finally:
        for p in (sender, receiver):
            if p is not None:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join(5)


def part_edge(runs: int) -> dict[str, list[Run]]:
    all_rows: dict[str, list[Run]] = {}
    for shape, (chunk_items, chunk_count, what) in EDGE_SHAPES.items():
        rows: dict[str, list[Run]] = {label: [] for label in EDGE_MODES.values()}
        variants = list(EDGE_MODES.items())
        for run in range(runs):
            order = variants[run % len(variants):] + variants[:run % len(variants)]
            for mode, label in order:
                r = _attempt(lambda: edge_run(mode, shape))
                rows[label].append(r)
                _print_run(run, f"{shape}: {label}", r, "items/s")
        print_table(f"One stream between two processes: {chunk_items * chunk_count:,} items, "
                    f"{what} (median of {runs} run(s); CPU = cores of both processes)",
                    list(rows.items()), EDGE_MODES["raw"], "items/s")
        ratio_line(rows, EDGE_MODES["edge"], EDGE_MODES["raw"],
                   "EdgeTransport / socket loop doing the same serialization")
        all_rows.update({f"{shape}: {k}": v for k, v in rows.items()})
    return all_rows


# --- main --------------------------------------------------------------------------------------

def _attempt(fn: Callable[[], Run]) -> Run:
    """Runs one measurement; an error becomes a failed row with the reason, not the end of
    the benchmark."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported in the table
        return Run(complete=False, note=f"{type(e).__name__}: {e}")


def _print_run(run: int, label: str, r: Run, unit: str) -> None:
    rate = f"{r.rate:,.0f} {unit}" if r.rate else "failed"
    if "mb_s" in r.extra:
        rate += f" ({r.extra['mb_s']:,.0f} MB/s)"
    cpu = f", CPU {r.cpu:.2f}" if r.cpu is not None else ""
    busy = f", machine {r.busy:.2f}" if r.busy is not None else ""
    start = f", start-up {r.startup:.2f} s" if r.startup is not None else ""
    print(f"   run {run + 1} {label}: {rate}{cpu}{busy}{start} "
          f"({'complete' if r.complete else 'INCOMPLETE'}: {r.note})", flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_cluster",
                                 description="jetwake on a cluster of 1 and 2 member processes "
                                 "on one host, beside plain loops and a raw Kafka loop")
    ap.add_argument("--words", type=int,
                    default=int(os.environ.get("BENCH_CLUSTER_WORDS", 200_000)))
    ap.add_argument("--records", type=int,
                    default=int(os.environ.get("BENCH_CLUSTER_RECORDS", 1_000_000)))
    ap.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_CLUSTER_RUNS", 3)))
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""))
    args = ap.parse_args(argv)
    if args.words < 1000:
        ap.error(f"--words must be at least 1000, got {args.words}")
    if args.records < 1000:
        ap.error(f"--records must be at least 1000, got {args.records}")
    if args.runs < 1:
        ap.error(f"--runs must be at least 1, got {args.runs}")
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown or not args.parts:
        ap.error(f"--parts takes some of {','.join(PARTS)}, got {args.parts}")
    return args


def main(argv: list[str] | None = None) -> None:
    import cloudpickle

    args = parse_args(argv if argv is not None else [])
    # the jobs' functions travel to the members by value: a member needs no bench/ on its path
    cloudpickle.register_pickle_by_value(workloads)
    cloudpickle.register_pickle_by_value(spec)
    print(f"   {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; members run with "
          f"{' '.join(MEMBER_ARGS)}", flush=True)
    needs_kafka = any(p in args.parts for p in ("wordcount", "kafka"))
    bootstrap = args.bootstrap.strip()
    kl = port = None
    if needs_kafka and not bootstrap:
        from bench.bench_kafka_peers import _kafka_local
        kl = _kafka_local()
        port = kl.free_port()
        bootstrap = kl.start_broker(port)
    try:
        if needs_kafka:
            print(f"   broker {bootstrap} (the members find each other through it)", flush=True)
        if "wordcount" in args.parts:
            part_wordcount(bootstrap, args.words, args.runs)
        if "kafka" in args.parts:
            part_kafka(bootstrap, args.records, args.runs)
        if "edge" in args.parts:
            part_edge(args.runs)
        print(f"   load average at the end {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        if kl is not None:
            kl.stop_broker(port)


if __name__ == "__main__":
    main(sys.argv[1:])
