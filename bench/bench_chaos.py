"""``python -m bench chaos [--duration S] [--seed N] [--members 3] [--brokers 1|3]``
(``make chaos DURATION=...``): an exactly-once job under a seeded nemesis, checked record by
record.

Its own Kafka (``--brokers`` KRaft brokers of tests/support/local_kafka/kafka_local.py; with
three, topics have three replicas and ``min.insync.replicas`` 2), ``--members`` member
processes (``jetwake member start``), a producer writing ``--rate`` records a second into a
three-partition input topic, and the job: a running ``[sum, count]`` per key in keyed state
in RocksDB (``map_stateful``, state_backend "rocksdb"), written after each record to a Kafka
output topic, exactly once, a snapshot every second. The nemesis (bench/chaos/nemesis.py)
kills, pauses, cuts off and restarts members and brokers, one fault at a time, and waits
after each (at most ``RECOVERY_BOUND`` s) until the output flows again.

At the end everything is healed, the producer stops, and the run waits for the output to
catch up; then every output record is checked (bench/chaos/checker.py: a ``read_committed``
reader must see each input once, in order per key) and so is the job's final state. It
prints and writes as JSON (``--report``) the faults (kind, target, time, time to output
again, the longest stretch without output), the longest stretch without output of the run,
the time to catch up, and each member's resident memory over time (from /proc). It exits
with status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from bench.chaos.checker import check_output
from bench.chaos.harness import (
    Brokers, KEYS, Members, MemorySampler, Output, Producer, create_topic, finish,
    partition_network
)
from bench.chaos.nemesis import Nemesis

# `python -m bench` with no names runs every benchmark: this one runs when named
RUN_BY_DEFAULT = False
RECOVERY_BOUND = 120.0
CATCH_UP_BOUND = 300.0
MEMBER_ARGS = ["--cooperative-threads", "1", "--local-parallelism", "1"]
WARM_UP_S = 5.0


def job_pipeline(bootstrap: str, source: str, sink: str) -> Any:
    """The job: a running [sum, count] per key in RocksDB keyed state, to the sink topic.
    Built from text so that its functions travel to the members by value."""
    namespace: dict = {}
    exec(textwrap.dedent(f"""
        from jetwake import Pipeline, Sinks, Sources
        props = {{"bootstrap.servers": {bootstrap!r}}}

        def add(state, key, item):
            state[0] += item[1]
            state[1] += 1
            return (key, [state[0], state[1]])

        pipeline = Pipeline()
        (pipeline.read_from(Sources.kafka({source!r}, props, key_deserializer="str",
                                          value_deserializer="json"))
            .group_by(lambda kv: kv[0])
            .map_stateful(lambda: [0, 0], add).set_name("sums")
            .write_to(Sinks.kafka({sink!r}, props, key_serializer="str",
                                  value_serializer="json")))
    """), namespace)  # noqa: S102 - our own text
    return namespace["pipeline"]


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench chaos", description=__doc__.split("\n")[2])
    ap.add_argument("--duration", type=float, default=120.0,
                    help="seconds of faults (the run goes on until each kind happened once)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--brokers", type=int, choices=(1, 3), default=3)
    ap.add_argument("--rate", type=int, default=200, help="input records a second")
    ap.add_argument("--report", type=Path, help="write the report as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the logs even when checks pass")
    args = ap.parse_args(argv)
    if args.duration <= 0 or args.members < 2 or args.rate < 1:
        ap.error("--duration must be > 0, --members at least 2 and --rate at least 1")
    return args


def final_state(members: Members, deadline: float) -> dict | None:
    """The job's state of stage "sums", read live from a member."""
    keys = [f"k{i}" for i in range(KEYS)]
    while time.monotonic() < deadline:
        for m in members.live():
            try:
                with m.client(timeout=5.0) as c:
                    job = c.get_job("chaos")
                    got = job.state("sums", "latest").get_all(keys)
                    return {k: list(v) for k, v in got.items()}
            except Exception:  # noqa: BLE001 - the job may still be restarting
                continue
        time.sleep(1.0)
    return None


def run(args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    net, no_partition = partition_network(args.members)
    host = net.host_address if net is not None else "127.0.0.1"
    brokers = members = producer = output = sampler = None
    report: dict[str, Any] = {"seed": args.seed, "members": args.members,
                              "brokers": args.brokers, "rate": args.rate,
                              "duration_s": args.duration, "logs": str(root),
                              "partitions": no_partition or "network namespaces",
                              "cpus": os.cpu_count(), "load_start": os.getloadavg()[0]}
    print(f"   seed {args.seed}; {args.members} members, {args.brokers} broker(s), "
          f"{args.rate} records/s; load {os.getloadavg()[0]:.1f}; logs in {root}", flush=True)
    if no_partition:
        print(f"   partition faults skipped: {no_partition}", flush=True)
    try:
        brokers = Brokers(args.brokers, host)
        source = create_topic(brokers.bootstrap, args.brokers, prefix="chaos-in")
        sink = create_topic(brokers.bootstrap, args.brokers, prefix="chaos-out")
        members = Members(root, brokers.bootstrap, args.members, net, MEMBER_ARGS)
        members.start()
        from jetwake import JobConfig
        with members.members[0].client(timeout=30.0) as c:
            c.new_job(job_pipeline(brokers.bootstrap, source, sink), JobConfig(
                name="chaos", processing_guarantee="exactly_once", snapshot_interval_ms=1000,
                state_backend="rocksdb"))
        t0 = time.monotonic()
        output = Output(brokers.bootstrap, sink)
        producer = Producer(brokers.bootstrap, source, args.rate)
        sampler = MemorySampler(members.members, max(2.0, min(30.0, args.duration / 60)), t0)
        output.start()
        producer.start()
        sampler.start()
        deadline = time.monotonic() + 120
        while output.count() == 0:
            if time.monotonic() > deadline:
                raise TimeoutError("no output within 120 s of submitting the job")
            time.sleep(0.1)
        time.sleep(WARM_UP_S)
        nemesis = Nemesis(members, brokers, output, net, args.seed, t0, args.rate,
                          RECOVERY_BOUND)
        nemesis.run(time.monotonic() + args.duration, time.monotonic() + 3 * args.duration + 300)
        healed = time.monotonic()
        deadline = healed + 180
        while not all(m.serving() for m in members.members):
            if time.monotonic() > deadline:
                raise TimeoutError("the members did not all serve within 180 s of healing")
            nemesis.restart_exited()
            time.sleep(0.5)
        producer.stop.set()
        producer.join(600)
        stopped = time.monotonic()
        events = producer.events()
        deadline = stopped + CATCH_UP_BOUND
        while output.count() < len(events) and time.monotonic() < deadline:
            time.sleep(0.1)
        caught_up = output.arrivals[-1] if output.count() >= len(events) else None
        # a duplicate written late (by a restarted sink) would land in these seconds
        quiet = time.monotonic()
        while time.monotonic() - quiet < 3.0:
            n = output.count()
            time.sleep(0.5)
            if output.count() != n:
                quiet = time.monotonic()
        state = final_state(members, time.monotonic() + 60)
        sampler.stop()
        output.close()
        arrivals = output.arrivals
        gaps = [(b - a, a) for a, b in zip(arrivals, arrivals[1:]) if b <= stopped]
        longest = max(gaps, default=(0.0, t0))
        problems = check_output(events, output.records, state)
        if producer.failed:
            problems.append(f"{len(producer.failed)} input records Kafka did not take "
                            f"(e.g. {producer.failed[0]}); they are left out of the check")
        if caught_up is None:
            problems.append(f"the output did not catch up within {CATCH_UP_BOUND:.0f} s of the "
                            f"producer stopping ({output.count():,} of {len(events):,})")
        report.update({
            "input_records": len(events), "output_records": len(output.records),
            "faults": [f.to_dict() for f in nemesis.faults], "member_exits": nemesis.exits,
            "longest_stretch_without_output_s": round(longest[0], 2),
            "longest_stretch_at_s": round(longest[1] - t0, 1),
            "heal_to_producer_stop_s": round(stopped - healed, 1),
            "catch_up_s": None if caught_up is None else round(caught_up - stopped, 2),
            "memory_mib": sampler.summary(), "memory_samples": sampler.samples,
            "problems": problems, "passed": not problems,
            "load_end": os.getloadavg()[0]})
        return report
    finally:
        if sampler is not None:
            sampler._stop.set()
        if producer is not None:
            producer.stop.set()
        if output is not None:
            output.stop.set()
        if members is not None:
            members.stop()
        if brokers is not None:
            brokers.stop()
        if net is not None:
            net.close()
        # the logs are kept when a check failed, or a fault was not recovered within the bound
        slow = any(f.get("recovered_s") is None for f in report.get("faults", []))
        if report.get("passed") and not slow and not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def print_report(report: dict) -> None:
    by_kind: dict[str, list[dict]] = {}
    for f in report["faults"]:
        by_kind.setdefault(f["kind"], []).append(f)
    print(f"   {len(report['faults'])} faults; {report['input_records']:,} input records, "
          f"{report['output_records']:,} output records; load {report['load_start']:.1f} -> "
          f"{report['load_end']:.1f}")
    for kind, faults in sorted(by_kind.items()):
        stretches = [f["stretch_s"] for f in faults]
        rec = [f["recovered_s"] for f in faults if f["recovered_s"] is not None]
        print(f"{'chaos: ' + kind:<32} x{len(faults):<3} stretch without output "
              f"{min(stretches):.1f}-{max(stretches):.1f} s (mean "
              f"{sum(stretches) / len(stretches):.1f}); output again after "
              + (f"{min(rec):.1f}-{max(rec):.1f} s" if rec else "-")
              + (f"; {len(faults) - len(rec)} not within the bound" if len(rec) < len(faults)
                 else ""))
    for e in report["member_exits"]:
        print(f"   {e['member']} exited by itself at {e['at_s']:.0f} s (status {e['status']}; "
              f"started again): {e['log']}")
    print(f"{'chaos: longest stretch without output':<40} "
          f"{report['longest_stretch_without_output_s']:.1f} s (at "
          f"{report['longest_stretch_at_s']:.0f} s)")
    print(f"{'chaos: time to catch up':<40} "
          + ("-" if report["catch_up_s"] is None else f"{report['catch_up_s']:.1f} s")
          + " (from the producer's stop to the last output record)")
    for member, mem in report["memory_mib"].items():
        print(f"{'chaos: resident memory ' + member:<40} start {mem['start']:.0f} MiB, max "
              f"{mem['max']:.0f} MiB, end {mem['end']:.0f} MiB")
    if report["passed"]:
        print("chaos: checks passed: every output record once and in order, the final state "
              "exact")
    else:
        print("chaos: CHECKS FAILED:\n  - " + "\n  - ".join(report["problems"]))


def main(argv: list[str] | None = None) -> None:
    args = parse(argv or [])
    finish(run(args), args.report, print_report)


if __name__ == "__main__":
    main(sys.argv[1:])
