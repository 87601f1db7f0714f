"""``python -m bench soak [--duration S]``: a long run (30 minutes by default) of an
exactly-once windowed job on three members with a snapshot every second, to see that nothing
grows: each member's resident memory (from /proc) and the size on disk of the cluster's
snapshot data topic (the blocks its partitions' files take in the brokers' log directories,
every replica counted) are sampled every ``--every`` seconds and reported as start, end,
largest and least-squares slope per hour.

The run has its own Kafka (kafka_local, ``--brokers`` brokers) and members (the chaos
harness's, bench/chaos/harness.py); a producer writes ``--rate`` records a second; the job
counts records per key in tumbling one-second windows of the records' Kafka timestamps and
writes each window's count to a Kafka topic. At the end the output is checked as a
``read_committed`` reader sees it: every closed window once, with the count of its input.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.chaos.harness import (
    Brokers, Members, MemorySampler, Output, Producer, create_topic, finish, slope_per_hour
)

RUN_BY_DEFAULT = False
MEMBER_ARGS = ["--cooperative-threads", "1", "--local-parallelism", "1"]
WINDOW_MS = 1000


def job_pipeline(bootstrap: str, source: str, sink: str) -> Any:
    """Counts per key in tumbling one-second windows, each window written as
    ``key -> [start, count]``."""
    namespace: dict = {}
    exec(textwrap.dedent(f"""
        from jetwake import AggregateOperations, Pipeline, Sinks, Sources, WindowDefinition
        props = {{"bootstrap.servers": {bootstrap!r}}}
        pipeline = Pipeline()
        (pipeline.read_from(Sources.kafka({source!r}, props, key_deserializer="str",
                                          value_deserializer="json"))
            .with_native_timestamps(200)
            .window(WindowDefinition.tumbling({WINDOW_MS}))
            .group_by(lambda kv: kv[0])
            .aggregate(AggregateOperations.counting())
            .write_to(Sinks.kafka({sink!r}, props, key_fn=lambda r: r.key,
                                  value_fn=lambda r: [r.start, r.result],
                                  key_serializer="str", value_serializer="json")))
    """), namespace)  # noqa: S102 - our own text
    return namespace["pipeline"]


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench soak")
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds (default 30 min)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--rate", type=int, default=200, help="input records a second")
    ap.add_argument("--brokers", type=int, choices=(1, 3), default=1)
    ap.add_argument("--report", type=Path, help="write the report as JSON here")
    args = ap.parse_args(argv)
    if args.duration <= 0 or args.every <= 0 or args.rate < 1:
        ap.error("--duration, --every and --rate must be positive")
    return args


def check_windows(acked: list[tuple[int, int, str, int, int]],
                  records: list[tuple[str, Any]]) -> list[str]:
    """Each window that closed (all but the last second of input) once, with its count."""
    want = Counter((k, ts - ts % WINDOW_MS) for _p, _o, k, _v, ts in acked)
    got: dict[tuple[str, int], int] = {}
    problems = []
    for key, (start, count) in records:
        if (key, start) in got:
            problems.append(f"window {key}@{start} written twice")
        got[(key, start)] = count
    if not got:
        return ["no window was written"]
    closed = max(s for _k, s in got) - WINDOW_MS
    wrong = [w for w in want if w[1] <= closed and want[w] != got.get(w)]
    if wrong:
        problems.append(f"{len(wrong)} closed window(s) with a wrong count, e.g. {wrong[0]}: "
                        f"got {got.get(wrong[0])}, want {want[wrong[0]]}")
    return problems[:5]


class TimedProducer(Producer):
    """The chaos producer, keeping each record's Kafka timestamp too."""

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.acked.append((msg.partition(), msg.offset(), msg.key().decode(),  # type: ignore[arg-type]
                               json.loads(msg.value()), msg.timestamp()[1]))


def run(args: argparse.Namespace) -> dict:
    from jetwake import JobConfig
    from jetwake.engine.cluster.snapshot_data_topic import snapshot_data_topic
    root = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    brokers = members = producer = output = sampler = None
    report: dict[str, Any] = {"duration_s": args.duration, "rate": args.rate,
                              "brokers": args.brokers, "load_start": os.getloadavg()[0]}
    print(f"   {args.duration:.0f} s, {args.rate} records/s, {args.brokers} broker(s), a "
          f"sample every {args.every:.0f} s; load {os.getloadavg()[0]:.1f}; logs in {root}",
          flush=True)
    try:
        brokers = Brokers(args.brokers)
        source = create_topic(brokers.bootstrap, args.brokers, prefix="soak-in")
        sink = create_topic(brokers.bootstrap, args.brokers, prefix="soak-out")
        members = Members(root, brokers.bootstrap, 3, None, MEMBER_ARGS)
        members.start()
        topic = snapshot_data_topic(members.name)
        with members.members[0].client(timeout=30.0) as c:
            c.new_job(job_pipeline(brokers.bootstrap, source, sink), JobConfig(
                name="soak", processing_guarantee="exactly_once", snapshot_interval_ms=1000))
        t0 = time.monotonic()
        output = Output(brokers.bootstrap, sink)
        producer = TimedProducer(brokers.bootstrap, source, args.rate)
        sampler = MemorySampler(members.members, args.every, t0)
        output.start()
        producer.start()
        sizes: list[tuple[float, float]] = []
        end = t0 + args.duration
        while True:
            now = time.monotonic()
            sampler.sample()
            sizes.append((round(now - t0, 1), round(brokers.topic_bytes(topic) / 2**20, 2)))
            print(f"   {now - t0:7.0f} s  snapshot data {sizes[-1][1]:8.2f} MiB  memory "
                  + "  ".join(f"{k} {v} MiB" for k, v in sampler.samples[-1].items()
                              if k != "t")
                  + f"  output {output.count():,}", flush=True)
            if now >= end:
                break
            time.sleep(min(args.every, max(0.0, end - now)))
        producer.stop.set()
        producer.join(120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the last closed windows arrive
            n = output.count()
            time.sleep(3.0)
            if output.count() == n:
                break
        output.close()
        problems = check_windows(producer.acked, output.records)
        dead = [m.slot for m in members.members if not m.alive()]
        if dead:
            problems.append(f"member(s) {dead} exited during the soak")
        memory = {}
        for m in members.members:
            key = f"member-{m.slot}"
            points = [(s["t"], s[key]) for s in sampler.samples if s.get(key) is not None]
            memory[key] = {"start": points[0][1], "end": points[-1][1],
                           "max": max(v for _, v in points),
                           "slope_mib_per_hour": round(slope_per_hour(points), 1)}
        report.update({
            "snapshot_data_topic": topic,
            "snapshot_data_mib": {"start": sizes[0][1], "end": sizes[-1][1],
                                  "max": max(v for _, v in sizes),
                                  "slope_mib_per_hour": round(slope_per_hour(sizes), 1)},
            "memory_mib": memory, "size_samples": sizes, "memory_samples": sampler.samples,
            "input_records": len(producer.acked), "output_windows": len(output.records),
            "problems": problems, "passed": not problems, "load_end": os.getloadavg()[0]})
        return report
    finally:
        for thing in (producer, output):
            if thing is not None:
                thing.stop.set()
        if members is not None:
            members.stop()
        if brokers is not None:
            brokers.stop()
        if report.get("passed"):
            shutil.rmtree(root, ignore_errors=True)


def print_report(report: dict) -> None:
    s = report["snapshot_data_mib"]
    print(f"   {report['input_records']:,} input records, {report['output_windows']:,} windows "
          f"written; load {report['load_start']:.1f} -> {report['load_end']:.1f}")
    print(f"{'soak: snapshot data topic on disk':<40} start {s['start']:.2f} MiB, end "
          f"{s['end']:.2f} MiB, max {s['max']:.2f} MiB, slope {s['slope_mib_per_hour']:+.1f} "
          "MiB/h")
    for member, m in report["memory_mib"].items():
        print(f"{'soak: resident memory ' + member:<40} start {m['start']:.0f} MiB, end "
              f"{m['end']:.0f} MiB, max {m['max']:.0f} MiB, slope "
              f"{m['slope_mib_per_hour']:+.1f} MiB/h")
    print("soak: windows checked: each closed window once with its count" if report["passed"]
          else "soak: CHECKS FAILED:\n  - " + "\n  - ".join(report["problems"]))


def main(argv: list[str] | None = None) -> None:
    args = parse(argv or [])
    finish(run(args), args.report, print_report)


if __name__ == "__main__":
    main(sys.argv[1:])
