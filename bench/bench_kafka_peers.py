"""Kafka pipelines side by side: jetwake, a raw confluent-kafka loop, Quix Streams and Bytewax.

``python -m bench kafka-peers`` (part of ``make bench``), or with options
``python -m bench.bench_kafka_peers [--records N | --full] [--runs 3] [--systems raw,jetwake,
quix,bytewax] [--workloads A,B] [--bootstrap HOST:PORT]``.

Two workloads over the same input (``bench/kafka_spec.py``: JSON records of about 100 bytes,
6 partitions, 10,000 keys, current timestamps, in a fresh topic with ``retention.ms=-1``):

A. Kafka -> JSON map -> Kafka, at-least-once (Bytewax: none offered).
B. Kafka -> tumbling 1 s count per key -> Kafka: exactly-once for jetwake and Quix Streams, no
   guarantee for the raw loop and Bytewax; jetwake also runs B at-least-once, which gives the
   cost of exactly-once.

Each system runs in a process of its own, started for each run, writing to a fresh output
topic; jetwake with its connectors' defaults (snapshots every second), the peers as their
documentation shows, each in a virtual environment of its own under ``.cache/bench-peers/``
that this benchmark creates (never in jetwake's dependencies; a system that cannot be
installed is reported and skipped). Figures per run:

- records/s: input records / (end - first record seen). The first record is noted by each
  runner; the end is when the output topic holds every record (A), or the latest ``t`` in the
  window results (B: the wall time each result was handed to the sink, so an exactly-once
  sink's commit latency does not count; it is printed apart as "visible after").
- CPU: the process's CPU time (all threads, from /proc) over the same interval / its length.
- start-up: from launching the process to the first record.
- output: every record present (A: distinct ids), every window's total equal to the input's
  (B), and how many duplicates.

The table shows the median of the runs (``--runs``, 3 by default) and the range, and each
median's ratio to the raw loop's. The records default to 300,000 (``BENCH_KAFKA_RECORDS`` or
``--records``; ``--full`` for the 1 million of docs/performance.md). The broker is
``--bootstrap``, else ``KAFKA_BOOTSTRAP_SERVERS``, else one started for the run on a free port
(``tests/support/local_kafka/kafka_local.py``) and stopped after.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import kafka_spec as spec

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
PEERS_DIR = REPO / ".cache" / "bench-peers"

# the peers and the exact versions installed into their virtual environments (pinned, so that
# runs on different days compare the same code)
PEERS = {
    "quix": ("Quix Streams", ["quixstreams==3.28.1"]),
    "bytewax": ("Bytewax", ["bytewax[kafka]==0.21.1"]),
}
SYSTEM_NAMES = {"raw": "raw confluent-kafka loop", "jetwake": "jetwake",
                "quix": "Quix Streams", "bytewax": "Bytewax"}


@dataclass(frozen=True)
class Variant:
    system: str
    workload: str
    guarantee: str  # what the system gives on this run

    @property
    def label(self) -> str:
        return f"{SYSTEM_NAMES[self.system]} ({self.guarantee})"


VARIANTS = [
    Variant("raw", "A", "at-least-once"),
    Variant("jetwake", "A", "at-least-once"),
    Variant("quix", "A", "at-least-once"),
    Variant("bytewax", "A", "none"),
    Variant("raw", "B", "none"),
    Variant("jetwake", "B", "exactly-once"),
    Variant("jetwake", "B", "at-least-once"),
    Variant("quix", "B", "exactly-once"),
    Variant("bytewax", "B", "none"),
]


@dataclass
class Result:
    variant: Variant
    rate: float | None = None
    cpu: float | None = None
    startup: float | None = None
    visible_after: float | None = None
    complete: bool = False
    note: str = ""


@dataclass
class Input:
    topic: str
    n: int
    base: int
    windows: dict = field(default_factory=dict)   # window start -> records (B's totals)
    window_results: int = 0


# --- the broker and topics -------------------------------------------------------------------

def _kafka_local() -> Any:
    path = REPO / "tests" / "support" / "local_kafka" / "kafka_local.py"
    mod_spec = importlib.util.spec_from_file_location("kafka_local", path)
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules["kafka_local"] = mod
    mod_spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def new_topic(admin: Any, prefix: str) -> str:
    """A fresh topic of 6 partitions whose records are never deleted by retention."""
    from confluent_kafka.admin import NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, spec.PARTITIONS, 1,
                                  config={"retention.ms": "-1"})])[name].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if md is not None and md.error is None and len(md.partitions) == spec.PARTITIONS:
            return name
        time.sleep(0.05)
    raise TimeoutError(f"topic {name} did not appear in 30 s")


def fill(bootstrap: str, admin: Any, n: int) -> Input:
    """Writes the input: n records, then one end marker per partition."""
    from confluent_kafka import Producer

    topic = new_topic(admin, "bench-in")
    base = spec.base_timestamp(n, int(time.time() * 1000))
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "batch.num.messages": 10_000,
                         "queue.buffering.max.messages": 1_000_000})
    produce, poll = producer.produce, producer.poll
    key_of, value_of, timestamp_of = spec.key_of, spec.value_of, spec.timestamp_of
    for i in range(n):
        ts = timestamp_of(base, i)
        while True:
            try:
                produce(topic, value_of(i, ts), key_of(i), timestamp=ts)
                break
            except BufferError:
                poll(0.05)
    if producer.flush(120):
        raise RuntimeError("the input was not acknowledged in 120 s")
    end = spec.end_marker_timestamp(base, n)
    for p in range(spec.PARTITIONS):
        producer.produce(topic, spec.value_of(n + p, end), spec.END_KEY, partition=p,
                         timestamp=end)
    producer.flush(30)
    return Input(topic, n, base, spec.expected_windows(n, base),
                 spec.expected_window_results(n, base))


def warm_up(bootstrap: str) -> None:
    """Creates what the first exactly-once run would otherwise create while it is timed: the
    broker's transaction log (a fresh broker makes it at the first ``init_transactions``, which
    then takes seconds) and jetwake's markers topic."""
    from confluent_kafka import Producer

    from jetwake.connectors.kafka.properties import SINK_OPTIONS
    from jetwake.connectors.kafka.sink_markers import KafkaMarkerTopic

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4()}"})
    p.init_transactions(60)
    p.begin_transaction()
    p.commit_transaction(60)
    markers = KafkaMarkerTopic(SINK_OPTIONS["jetwake.markers.topic"],
                               {"bootstrap.servers": bootstrap}, 60.0, "bench")
    markers.ensure()
    markers.close()


# --- the peers' virtual environments ----------------------------------------------------------

def peer_python(system: str) -> tuple[str | None, str]:
    """The Python of ``system``'s virtual environment, made (and its package installed) on
    first use; (None, why) when that fails."""
    title, requirements = PEERS[system]
    root = PEERS_DIR / system
    python = root / "bin" / "python"
    stamp = root / ".installed"
    wanted = " ".join(requirements)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return str(python), ""
    print(f"   installing {title} ({wanted}) into {root.relative_to(REPO)} ...", flush=True)
    try:
        if root.exists():
            shutil.rmtree(root)
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True,
                       capture_output=True, text=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True,
                       capture_output=True, text=True, timeout=1200)
    except subprocess.CalledProcessError as e:
        tail = "\n".join((e.stderr or e.stdout or "").strip().splitlines()[-5:])
        return None, f"installing {wanted} failed:\n{tail}"
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"installing {wanted} failed: {e}"
    stamp.write_text(wanted)
    return str(python), ""


# --- one run -----------------------------------------------------------------------------------

def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of every thread of ``pid`` (from /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _cpu_at(samples: list[tuple[float, float]], t: float) -> float:
    """The CPU time at wall time ``t``, interpolated between the samples around it."""
    before = [s for s in samples if s[0] <= t]
    after = [s for s in samples if s[0] >= t]
    if not before:
        return samples[0][1]
    if not after:
        return samples[-1][1]
    (t0, c0), (t1, c1) = before[-1], after[0]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def command(v: Variant, bootstrap: str, inp: Input, out: str, report: str,
            peers: dict[str, str | None], scratch: str) -> list[str]:
    common = ["--bootstrap", bootstrap, "--input", inp.topic, "--output", out,
              "--report", report]
    if v.system in ("raw", "jetwake"):
        cmd = [sys.executable, "-m", "bench.kafka_runners", v.system, v.workload, *common]
        if v.system == "raw":
            from jetwake.connectors.kafka.serde import JSON_LIBRARY
            cmd += ["--json", JSON_LIBRARY]
        else:
            cmd += ["--guarantee", v.guarantee.replace("-", "_")]
        return cmd
    python = peers[v.system]
    if v.system == "quix":
        return [python, str(BENCH_DIR / "kafka_peer_quix.py"), v.workload, *common,
                "--guarantee", v.guarantee, "--state-dir", scratch]
    return [python, str(BENCH_DIR / "kafka_peer_bytewax.py"), v.workload, *common]


def run_once(v: Variant, bootstrap: str, admin: Any, inp: Input, peers: dict[str, str | None],
             timeout: float) -> Result:
    from confluent_kafka import Consumer, TopicPartition

    res = Result(v)
    out = new_topic(admin, f"bench-out-{v.system}-{v.workload}")
    scratch = tempfile.mkdtemp(prefix="bench-kafka-")
    report = os.path.join(scratch, "report.json")
    log_path = os.path.join(scratch, "runner.log")
    cmd = command(v, bootstrap, inp, out, report, peers, os.path.join(scratch, "state"))
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                      "enable.auto.commit": False, "auto.offset.reset": "earliest",
                      "isolation.level": "read_committed"})
    tps = [TopicPartition(out, p) for p in range(spec.PARTITIONS)]
    if v.workload == "B":
        probe.assign([TopicPartition(out, p, -2) for p in range(spec.PARTITIONS)])
    expected_a = inp.n + spec.PARTITIONS
    values: list[bytes] = []
    results_seen = 0
    samples: list[tuple[float, float]] = []
    t_first = t_end = None
    with open(log_path, "w") as log:
        t_launch = time.time()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            now = time.time()
            cpu = _cpu_seconds(proc.pid)
            if cpu is not None:
                samples.append((now, cpu))
            if t_first is None and os.path.exists(report):
                with open(report) as f:
                    t_first = json.load(f)["t_first"]
            if proc.poll() is not None and proc.returncode != 0:
                res.note = f"the runner exited ({proc.returncode}): {_tail(log_path)}"
                return res
            # (a runner that ends its input at the end of the topic exits 0 when done: its
            # output is then read to the end as any other)
            if v.workload == "A":
                if _written(probe, tps) >= expected_a:
                    t_end = time.time()
                    break
                time.sleep(0.05)
            else:
                for m in probe.consume(5000, 0.05):
                    if m.error() is None and m.key() != spec.END_KEY:
                        values.append(m.value())
                        results_seen += 1
                if results_seen >= inp.window_results:
                    t_end = time.time()
                    break
            if time.monotonic() > deadline:
                res.note = (f"not complete after {timeout:.0f} s ({results_seen or 'some'} "
                            f"output records); {_tail(log_path)}")
                return res
        cpu = _cpu_seconds(proc.pid)
        if cpu is not None:
            samples.append((time.time(), cpu))
    finally:
        _stop(proc)
        probe.close()
    if t_first is None:
        res.note = "the runner never reported its first record"
        return res
    res.startup = t_first - t_launch
    if v.workload == "A":
        res.complete, res.note = _check_a(bootstrap, out, inp)
        t_done = t_end
    else:
        res.complete, res.note, t_done = _check_b(values, inp)
        res.visible_after = t_end - t_done
    elapsed = t_done - t_first
    res.rate = inp.n / elapsed
    if samples:
        res.cpu = (_cpu_at(samples, t_done) - _cpu_at(samples, t_first)) / elapsed
    shutil.rmtree(scratch, ignore_errors=True)
    return res


def _written(probe: Any, tps: list) -> int:
    """Records in the output topic (its high watermarks); 0 while a fresh topic's leaders
    are not known yet."""
    from confluent_kafka import KafkaException

    try:
        return sum(probe.get_watermark_offsets(tp, timeout=5)[1] for tp in tps)
    except KafkaException:
        return 0


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def _tail(path: str, lines: int = 6) -> str:
    try:
        with open(path, errors="replace") as f:
            return " | ".join(f.read().strip().splitlines()[-lines:])
    except OSError:
        return ""


def _check_a(bootstrap: str, topic: str, inp: Input) -> tuple[bool, str]:
    """Every input record in the output (by id), mapped."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False, "fetch.queue.backoff.ms": 0})
    ends = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
            for p in range(spec.PARTITIONS)]
    c.assign([TopicPartition(topic, p, -2) for p in range(spec.PARTITIONS)])
    total, ids, mapped = sum(ends), set(), True
    got = 0
    deadline = time.monotonic() + 120
    while got < total and time.monotonic() < deadline:
        for m in c.consume(10_000, 0.5):
            if m.error() is None:
                got += 1
                d = json.loads(m.value())
                ids.add(d["id"])
                mapped = mapped and "amount_cents" in d
    c.close()
    want = inp.n + spec.PARTITIONS
    ok = len(ids) == want and mapped
    note = f"{len(ids):,} of {want:,} records, {got - len(ids):,} duplicates"
    if not mapped:
        note += ", some not mapped"
    return ok, note


def _check_b(values: list[bytes], inp: Input) -> tuple[bool, str, float]:
    """Every window's total equals the input's; returns (ok, note, last result's t)."""
    totals: dict[int, int] = {}
    t_done = 0.0
    for raw in values:
        d = json.loads(raw)
        totals[d["start"]] = totals.get(d["start"], 0) + d["count"]
        t_done = max(t_done, d["t"])
    wrong = {s: (totals.get(s), c) for s, c in inp.windows.items() if totals.get(s) != c}
    extra = sorted(set(totals) - set(inp.windows))
    ok = not wrong and not extra and len(values) == inp.window_results
    note = f"{len(values):,} of {inp.window_results:,} results"
    if wrong:
        note += f", {len(wrong)} window total(s) wrong (e.g. {next(iter(wrong.items()))})"
    if extra:
        note += f", unexpected windows {extra[:3]}"
    return ok, note, t_done


# --- the table ---------------------------------------------------------------------------------

def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def summarize(results: dict[Variant, list[Result]], skipped: dict[str, str], n: int,
              runs: int) -> None:
    titles = {"A": "A: Kafka -> JSON map -> Kafka",
              "B": "B: Kafka -> tumbling 1 s count per key -> Kafka"}
    for w in ("A", "B"):
        vs = [v for v in VARIANTS if v.workload == w and v in results]
        if not vs:
            continue
        print(f"\n{titles[w]} ({n:,} records, {spec.PARTITIONS} partitions, {spec.KEYS:,} "
              f"keys; median of {runs} run(s), range in brackets)")
        raw = results.get(Variant("raw", w, "at-least-once" if w == "A" else "none"), [])
        raw_rates = [r.rate for r in raw if r.rate]
        raw_median = _median(raw_rates) if raw_rates else None
        print(f"  {'system (guarantee)':<40} {'records/s':>10} {'range':>17} {'vs raw':>6} "
              f"{'CPU':>5} {'start-up':>8}  output")
        for v in vs:
            rs = results[v]
            rates = [r.rate for r in rs if r.rate]
            if not rates:
                print(f"  {v.label:<40} {'failed':>10}  {rs[-1].note if rs else ''}")
                continue
            med = _median(rates)
            ratio = f"{med / raw_median:.2f}" if raw_median else "-"
            cpu = _median([r.cpu for r in rs if r.cpu is not None] or [0.0])
            start = _median([r.startup for r in rs if r.startup is not None])
            complete = sum(r.complete for r in rs)
            rng = f"[{min(rates) / 1000:,.1f}k-{max(rates) / 1000:,.1f}k]"
            out = f"{complete}/{len(rs)} complete; {rs[-1].note}"
            vis = [r.visible_after for r in rs if r.visible_after is not None]
            if vis and v.guarantee == "exactly-once":
                out += f"; visible after +{_median(vis):.2f} s"
            print(f"  {v.label:<40} {med:>10,.0f} {rng:>17} {ratio:>6} {cpu:>5.0%} "
                  f"{start:>7.2f}s  {out}")
        if w == "B":
            eo = [r.rate for r in results.get(Variant("jetwake", "B", "exactly-once"), [])
                  if r.rate]
            alo = [r.rate for r in results.get(Variant("jetwake", "B", "at-least-once"), [])
                   if r.rate]
            if eo and alo:
                print(f"  jetwake exactly-once / at-least-once on B: "
                      f"{_median(eo) / _median(alo):.2f}")
    for system, why in skipped.items():
        print(f"\n  {SYSTEM_NAMES[system]} not measured: {why}")


# --- main --------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_kafka_peers",
                                 description="Kafka pipelines: jetwake beside a raw "
                                 "confluent-kafka loop, Quix Streams and Bytewax")
    ap.add_argument("--records", type=int,
                    default=int(os.environ.get("BENCH_KAFKA_RECORDS", 300_000)))
    ap.add_argument("--full", action="store_true", help="1,000,000 records")
    ap.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_KAFKA_RUNS", 3)))
    ap.add_argument("--systems", default="raw,jetwake,quix,bytewax")
    ap.add_argument("--workloads", default="A,B")
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""))
    args = ap.parse_args(argv)
    if args.full:
        args.records = 1_000_000
    if args.records < 1000:
        ap.error(f"--records must be at least 1000, got {args.records}")
    if args.runs < 1:
        ap.error(f"--runs must be at least 1, got {args.runs}")
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEM_NAMES]
    if unknown:
        ap.error(f"unknown system(s) {unknown}; choose from {sorted(SYSTEM_NAMES)}")
    args.workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    if any(w not in ("A", "B") for w in args.workloads):
        ap.error(f"--workloads are A and/or B, got {args.workloads}")
    return args


def main(argv: list[str] | None = None) -> None:
    from confluent_kafka import libversion, version
    from confluent_kafka.admin import AdminClient

    args = parse_args(argv if argv is not None else [])
    peers: dict[str, str | None] = {}
    skipped: dict[str, str] = {}
    for system in args.systems:
        if system in PEERS:
            peers[system], why = peer_python(system)
            if peers[system] is None:
                skipped[system] = why
                print(f"   {SYSTEM_NAMES[system]} is skipped: {why}", flush=True)
    variants = [v for v in VARIANTS if v.system in args.systems
                and v.workload in args.workloads and v.system not in skipped]
    bootstrap = args.bootstrap.strip()
    kl = port = None
    if not bootstrap:
        kl = _kafka_local()
        port = kl.free_port()
        bootstrap = kl.start_broker(port)
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        print(f"   broker {bootstrap}; confluent-kafka {version()}, librdkafka "
              f"{libversion()[0]}; load average {os.getloadavg()[0]:.2f}; filling "
              f"{args.records:,} records ...", flush=True)
        t0 = time.perf_counter()
        inp = fill(bootstrap, admin, args.records)
        print(f"   input {inp.topic} written in {time.perf_counter() - t0:.1f} s", flush=True)
        warm_up(bootstrap)
        timeout = 120 + args.records / 2000
        results: dict[Variant, list[Result]] = {v: [] for v in variants}
        for run in range(args.runs):
            # a different order each run, so that no system always follows the same one
            order = variants[run % len(variants):] + variants[:run % len(variants)]
            for v in order:
                r = run_once(v, bootstrap, admin, inp, peers, timeout)
                results[v].append(r)
                rate = f"{r.rate:,.0f} records/s" if r.rate else "failed"
                cpu = f", CPU {r.cpu:.0%}" if r.cpu is not None else ""
                print(f"   run {run + 1} {v.workload} {v.label}: {rate}{cpu}, "
                      f"{'complete' if r.complete else 'INCOMPLETE'} ({r.note})", flush=True)
        summarize(results, skipped, args.records, args.runs)
        print(f"   load average at the end {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        admin = None  # no client of this process outlives the broker (it would log its loss)
        if kl is not None:
            kl.stop_broker(port)


if __name__ == "__main__":
    main(sys.argv[1:])
