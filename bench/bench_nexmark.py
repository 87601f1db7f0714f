"""NEXMark through Kafka: ``python -m bench nexmark [--events N] [--queries q0,q5]
[--members 1,2] [--guarantees exactly_once,at_least_once] [--peers quix,bytewax] [--rate R]
[--latency-seconds S] [--latency-guarantees G] [--partitions P] [--bootstrap HOST:PORT]``.

Fills the three input topics once with ``--events`` generated events, then for each query x
member count x guarantee runs the query as a jetwake job on fresh member processes' cluster
(``bench/nexmark/runner.py`` says what is measured and how), checks every output against the
query's reference, and prints a table per query beside Flink 1.13's published per-core
figures; a latency run per query at ``--rate`` events/s (default: half the measured 1-member
exactly-once rate); Quix Streams and Bytewax beside where the module
``bench.nexmark.peers`` exists and the query names the peer. A failed output check is
printed loudly and makes the benchmark exit non-zero. docs/nexmark.md describes the benchmark.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from typing import Any

from bench.nexmark.queries import QUERY_NAMES, Query, query

# Flink 1.13, events/s per core (exactly-once, RocksDB, 3-minute checkpoints); none published
# for q3, q6, q12
FLINK_PER_CORE = {"q0": 155_000, "q1": 158_000, "q2": 175_000, "q4": 34_300, "q5": 22_100,
                  "q7": 12_300, "q8": 146_000, "q11": 39_700}
PEERS = ("quix", "bytewax")
DEFAULT_EVENTS = 100_000
# the latency runs' default input rate: half the measured rate, at most this (a Python
# producer on the same cores as the members keeps to it)
MAX_DEFAULT_RATE = 20_000


def parse_args(argv: list[str]) -> argparse.Namespace:
    from bench.nexmark.runner import GUARANTEES

    ap = argparse.ArgumentParser(prog="python -m bench nexmark",
                                 description="NEXMark queries through Kafka: jetwake beside "
                                 "Flink's published figures and the Python peers")
    ap.add_argument("--events", type=int, default=int(os.environ.get("BENCH_NEXMARK_EVENTS",
                                                                     DEFAULT_EVENTS)))
    ap.add_argument("--queries", default=",".join(QUERY_NAMES))
    ap.add_argument("--members", default="1,2")
    ap.add_argument("--guarantees", default=",".join(GUARANTEES))
    ap.add_argument("--peers", default=",".join(PEERS), help="'' or none for no peers")
    ap.add_argument("--rate", type=int, default=0,
                    help="events/s of the latency runs (0: half the measured rate, at most "
                    f"{MAX_DEFAULT_RATE:,}; -1: none)")
    ap.add_argument("--latency-seconds", type=float, default=5.0)
    ap.add_argument("--latency-guarantees", default="exactly_once",
                    help="the guarantees of the latency runs (exactly_once,at_least_once)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--out-of-order-ms", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--topic-prefix", default="",
                    help="before the input topics' standard names (the peers read those)")
    ap.add_argument("--in-process", action="store_true",
                    help="run the 1-member jobs on a member in this process (its CPU counted)")
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""))
    a = ap.parse_args(argv)
    if a.events < 1000:
        ap.error(f"--events must be at least 1000, got {a.events}")
    a.queries = [x.strip() for x in a.queries.split(",") if x.strip()]
    bad = [x for x in a.queries if x not in QUERY_NAMES]
    if bad or not a.queries:
        ap.error(f"--queries takes some of {','.join(QUERY_NAMES)}, got {bad or a.queries}")
    try:
        a.members = sorted({int(x) for x in a.members.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--members takes member counts such as 1,2, got {a.members!r}")
    if not a.members or min(a.members) < 1:
        ap.error(f"--members takes counts of 1 or more, got {a.members}")
    a.guarantees = [x.strip() for x in a.guarantees.split(",") if x.strip()]
    if not a.guarantees or any(g not in GUARANTEES for g in a.guarantees):
        ap.error(f"--guarantees takes some of {','.join(GUARANTEES)}, got {a.guarantees}")
    a.latency_guarantees = [x.strip() for x in a.latency_guarantees.split(",") if x.strip()]
    if not a.latency_guarantees or any(g not in GUARANTEES for g in a.latency_guarantees):
        ap.error(f"--latency-guarantees takes some of {','.join(GUARANTEES)}, got "
                 f"{a.latency_guarantees}")
    a.peers = [x.strip() for x in a.peers.split(",") if x.strip() and x.strip() != "none"]
    if any(p not in PEERS for p in a.peers):
        ap.error(f"--peers takes some of {','.join(PEERS)} (or none), got {a.peers}")
    if a.partitions < 1:
        ap.error(f"--partitions must be at least 1, got {a.partitions}")
    return a


def _k(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k"


def _load() -> str:
    return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"


def load_queries(names: list[str]) -> list[Query]:
    """The queries whose module exists; a line for each that does not."""
    found = []
    for name in names:
        try:
            found.append(query(name))
        except ModuleNotFoundError as e:
            if e.name != f"bench.nexmark.queries.{name}":
                raise
            print(f"   {name}: skipped (bench/nexmark/queries/{name}.py is not there yet)",
                  flush=True)
    return found


def peer_runner() -> Any:
    try:
        return importlib.import_module("bench.nexmark.peers").run_peer
    except ModuleNotFoundError as e:
        if e.name != "bench.nexmark.peers":
            raise
        return None


def run_peers(q: Query, peers: list[str], inp: Any, timeout: float) -> dict[str, Any]:
    """Each peer's run of ``q`` with its outputs checked: peer -> (PeerRun or None, note)."""
    from bench.nexmark.queries import check_output
    from bench.nexmark.runner import new_output_topic

    run_peer = peer_runner()
    results: dict[str, Any] = {}
    for peer in peers:
        if peer not in q.peers:
            continue
        if run_peer is None:
            results[peer] = (None, "the module bench.nexmark.peers is not there yet")
            continue
        try:
            out = new_output_topic(inp.bootstrap, q, inp.partitions)
            extra = {"topic_prefix": inp.prefix} if inp.prefix else {}
            r = run_peer(peer, q.name, inp.bootstrap, out, inp.events, timeout, **extra)
            problems = check_output(q, inp.events, list(r.outputs))
            results[peer] = (r, "; ".join(problems) if problems else "output checked")
        except Exception as e:  # noqa: BLE001 - a failed peer is a row, not the end
            results[peer] = (None, f"{type(e).__name__}: {e}")
    return results


def print_query_table(q: Query, runs: list[Any], latencies: list[Any],
                      peers: dict[str, Any]) -> None:
    flink = FLINK_PER_CORE.get(q.name)
    print(f"\n{q.name}: {q.title}  (events/s = input events read / first record read -> "
          f"last output or end of input; per core = / member CPU s; {_load()})")
    print(f"  {'run':<30} {'events/s':>9} {'per core':>9} {'Flink/core':>10} {'ratio':>6} "
          f"{'broker CPU':>10} {'snapshot ms med/max':>19} {'snap KB':>8}  output")
    base: dict[str, float] = {}
    for r in runs:
        label = f"{r.members} member{'s' if r.members > 1 else ''}, {r.guarantee}"
        if r.events_per_s is None:
            print(f"  {label:<30} {'failed':>9}  {r.note} {'; '.join(r.problems)}")
            continue
        if r.members == 1:
            base[r.guarantee] = r.events_per_s
        pc = r.per_core
        ratio = f"{pc / flink:.2f}" if pc and flink else "-"
        snap = (f"{statistics.median(r.snapshot_ms):.0f}/{max(r.snapshot_ms):.0f}"
                if r.snapshot_ms else "-")
        kb = f"{max(r.snapshot_bytes) / 1024:.0f}" if r.snapshot_bytes else "-"
        broker = f"{r.broker_cpu_s:.1f}s" if r.broker_cpu_s is not None else "-"
        check = "OK" if not r.problems else "CHECK FAILED: " + "; ".join(r.problems)
        print(f"  {label:<30} {_k(r.events_per_s):>9} {_k(pc):>9} {_k(flink):>10} {ratio:>6} "
              f"{broker:>10} {snap:>19} {kb:>8}  {check} ({r.outputs:,} outputs) {r.note}")
    for r in runs:
        if r.members > 1 and r.events_per_s and base.get(r.guarantee):
            print(f"  {r.members} members / 1 member ({r.guarantee}): "
                  f"{r.events_per_s / base[r.guarantee]:.2f}")
    for latency in latencies:
        k, v = latency.percentiles("kafka"), latency.percentiles("visible")
        if k and v:
            print(f"  latency at {latency.rate:,} events/s (1 member, {latency.guarantee}, "
                  f"{len(latency.kafka_ms):,} outputs): by Kafka timestamp p50/p95/p99 "
                  f"{k[0]:.0f}/{k[1]:.0f}/{k[2]:.0f} ms; visible to a read_committed reader "
                  f"{v[0]:.0f}/{v[1]:.0f}/{v[2]:.0f} ms; writer at most {latency.behind_ms} ms "
                  f"behind")
        else:
            print(f"  latency at {latency.rate:,} events/s ({latency.guarantee}): "
                  f"{latency.note or 'no outputs'}")
    # each peer beside jetwake's 1-member run of the guarantee the peer runs with (or the
    # weakest stronger one measured), and beside jetwake's exactly-once run
    ones = {r.guarantee: r for r in runs if r.members == 1 and r.events_per_s and r.per_core}
    for peer, (pr, note) in peers.items():
        if pr is None:
            print(f"  peer {peer}: not run ({note})")
            continue
        per_core = pr.events_per_s * pr.wall_s / pr.cpu_s if pr.cpu_s else None
        runs_with = peer_guarantee(peer)
        shares = []
        for g in comparable_guarantees(runs_with, ones):
            shares.append(f"{per_core / ones[g].per_core:.2f} x jetwake's per core (1 member, "
                          f"{g})" if per_core else "-")
        print(f"  peer {peer} ({runs_with}): {_k(pr.events_per_s)} events/s, {_k(per_core)} "
              f"per core = {'; '.join(shares) or '-'}; {note}")


STRENGTH = ("none", "at_least_once", "exactly_once")


def peer_guarantee(peer: str) -> str:
    """The guarantee ``peer`` runs with, in jetwake's words."""
    return importlib.import_module("bench.nexmark.peers").PEER_GUARANTEES.get(peer, "none")


def comparable_guarantees(guarantee: str, measured: dict[str, Any]) -> list[str]:
    """jetwake's measured guarantees to compare a peer of ``guarantee`` with: the same one, or
    the weakest stronger one measured (a like-for-like figure), then exactly-once (the
    headline figure) when that is another."""
    out = [g for g in STRENGTH[STRENGTH.index(guarantee):] if g in measured][:1]
    if "exactly_once" in measured and "exactly_once" not in out:
        out.append("exactly_once")
    return out


def main(argv: list[str] | None = None) -> None:
    code = run(parse_args(argv if argv is not None else []))
    if code:
        raise SystemExit(code)


def run(a: argparse.Namespace) -> int:
    """The whole benchmark; returns 1 when an output check failed, else 0."""
    import cloudpickle

    import bench.nexmark
    from bench.bench_cluster import local_broker_pid
    from bench.nexmark.generator import GeneratorConfig
    from bench.nexmark.kafka_input import fill
    from bench.nexmark.runner import LatencyRun, QueryRun, Target, run_latency, run_query

    cloudpickle.register_pickle_by_value(bench.nexmark)
    queries = load_queries(a.queries)
    if not queries:
        print("   no query to run")
        return 0
    bootstrap = a.bootstrap.strip()
    kl = port = None
    if not bootstrap:
        from bench.bench_kafka_peers import _kafka_local
        kl = _kafka_local()
        port = kl.free_port()
        bootstrap = kl.start_broker(port)
    failed = 0
    try:
        broker = local_broker_pid(bootstrap)
        print(f"   broker {bootstrap}; {_load()}; generating and writing {a.events:,} events "
              f"({a.partitions} partitions per topic) ...", flush=True)
        inp = fill(bootstrap, GeneratorConfig(a.events, out_of_order_ms=a.out_of_order_ms),
                   prefix=a.topic_prefix, partitions=a.partitions, replace=True)
        print(f"   written in {inp.write_s:.1f} s ({a.events / inp.write_s:,.0f} events/s): "
              f"{dict(inp.counts)}", flush=True)
        results: dict[str, list[Any]] = {q.name: [] for q in queries}
        for members in a.members:
            print(f"   starting {members} member process(es) ...", flush=True)
            with Target(bootstrap, members, a.in_process and members == 1) as target:
                if not a.in_process:
                    # a fresh member's first job also pays for its imports, connections and
                    # RocksDB's start: one run not measured, so the first query is not slower
                    warm = run_query(queries[0], inp, target, "at_least_once", a.timeout)
                    print(f"   warm-up run ({queries[0].name}) {'done' if warm.ok else 'failed'}",
                          flush=True)
                for q in queries:
                    for g in a.guarantees:
                        t0 = time.time()
                        try:
                            r = run_query(q, inp, target, g, a.timeout, broker)
                        except Exception as e:  # noqa: BLE001 - a failed row, not the end
                            r = QueryRun(q.name, members, g, note=f"{type(e).__name__}: {e}")
                        results[q.name].append(r)
                        status = "ok" if r.ok else "FAILED " + "; ".join(r.problems) + r.note
                        print(f"   {q.name} {members} member(s) {g}: {_k(r.events_per_s)} "
                              f"events/s, {_k(r.per_core)} per core, {r.outputs:,} outputs, "
                              f"{time.time() - t0:.1f} s; {status}", flush=True)
        latencies: dict[str, list[Any]] = {q.name: [] for q in queries}
        if a.rate >= 0:
            with Target(bootstrap, 1, a.in_process) as target:
                for q in queries:
                    measured = [r.events_per_s for r in results[q.name]
                                if r.members == 1 and r.events_per_s]
                    rate = a.rate or int(min(max(measured, default=0) / 2,
                                             MAX_DEFAULT_RATE))
                    if rate < 1:
                        continue
                    for g in a.latency_guarantees:
                        try:
                            lat = run_latency(q, target, bootstrap, rate, a.latency_seconds,
                                              a.partitions, g)
                        except Exception as e:  # noqa: BLE001 - reported in the table
                            lat = LatencyRun(q.name, rate, g, note=f"{type(e).__name__}: {e}")
                        latencies[q.name].append(lat)
        for q in queries:
            peers = run_peers(q, a.peers, inp, a.timeout) if a.peers else {}
            print_query_table(q, results[q.name], latencies[q.name], peers)
            for r in results[q.name]:
                if r.problems or r.events_per_s is None:
                    failed += 1
        if failed:
            print(f"\n!!! {failed} run(s) FAILED their output check or did not finish: see "
                  "above !!!", flush=True)
        print(f"   {_load()} at the end", flush=True)
    finally:
        if kl is not None:
            kl.stop_broker(port)
    return 1 if failed else 0


if __name__ == "__main__":
    main(sys.argv[1:])
