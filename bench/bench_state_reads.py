"""Reads of a running job's state (``job.state``) beside the job's throughput.

Run ``python -m bench state-reads [--keys K] [--seconds S]``. A member runs an endless
generated stream into a running count per key over K keys (100,000), ``rolling_aggregate``
named "totals", into a no-op sink, and for S seconds each (3):

1. the job alone: items/s into "totals";
2. a thread reading one key at a time with ``consistency="latest"`` (served by the processor
   owning it, on its own thread): reads/s, their median and 99th percentile latency, and the
   job's items/s meanwhile;
3. a thread scanning all K keys live (``items()``): seconds per scan, and the job's items/s;
4. a live ``count()`` (each processor counts its keys: nothing is copied);
5. after ``job.take_snapshot()``: the first snapshot read (the stage's K entries decoded) and
   then one key's read from the decoded snapshot.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any, Callable

from jetwake import AggregateOperations, JobConfig, Member, Pipeline, Sinks, TestSources

from .report import figure, line, timer

KEYS = 100_000
SECONDS = 3.0


def _pipeline(keys: int) -> Pipeline:
    p = Pipeline()
    (p.read_from(TestSources.item_stream(10_000_000, lambda ts, seq: f"k{seq % keys}"))
        .group_by(lambda k: k)
        .rolling_aggregate(AggregateOperations.counting()).set_name("totals")
        .write_to(Sinks.noop()))
    return p


def _items_in(job: Any) -> float:
    return float(job.metrics().get("totals", {}).get("items_in", 0))


def _rate_while(job: Any, seconds: float, reader: Callable[[threading.Event], None] | None
                ) -> float:
    """The job's items/s into "totals" over ``seconds``, with ``reader`` running beside."""
    stop = threading.Event()
    t = threading.Thread(target=reader, args=(stop,), daemon=True) if reader else None
    if t:
        t.start()
    before, t0 = _items_in(job), time.perf_counter()
    time.sleep(seconds)
    after, t1 = _items_in(job), time.perf_counter()
    stop.set()
    if t:
        t.join()
    return (after - before) / (t1 - t0)


def run(keys: int, seconds: float) -> None:
    with Member(local_parallelism=2) as m:
        job = m.new_job(_pipeline(keys), JobConfig(processing_guarantee="exactly_once",
                                                   snapshot_interval_ms=3_600_000))
        live = job.state("totals", consistency="latest")
        deadline = time.monotonic() + 60
        while live.count() < keys and time.monotonic() < deadline:
            time.sleep(0.1)
        alone = _rate_while(job, seconds, None)
        figure("job alone", alone, "items/s")

        latencies: list[float] = []

        def one_key_reads(stop: threading.Event) -> None:
            i = 0
            while not stop.is_set():
                t0 = time.perf_counter()
                live.get(f"k{(i * 7919) % keys}")
                latencies.append(time.perf_counter() - t0)
                i += 1

        during = _rate_while(job, seconds, one_key_reads)
        lat = sorted(latencies)
        figure("one-key latest reads", len(lat) / seconds, "reads/s")
        figure("one-key latest read, median", statistics.median(lat) * 1e3, "ms")
        figure("one-key latest read, p99", lat[int(len(lat) * 0.99)] * 1e3, "ms")
        line("job during one-key reads", during, alone, "items", "job alone")

        scans: list[float] = []

        def scans_of_all(stop: threading.Event) -> None:
            while not stop.is_set():
                with timer() as t:
                    n = sum(1 for _ in live.items())
                scans.append(t[0])
                assert n == keys, n

        during = _rate_while(job, seconds, scans_of_all)
        figure(f"latest scan of {keys:,} keys", statistics.median(scans), "s",
               f"({len(scans)} scans)")
        line(f"job during {keys:,}-key scans", during, alone, "items", "job alone")

        with timer() as t:
            for _ in range(20):
                live.count()
        figure(f"latest count of {keys:,} keys", t[0] / 20 * 1e3, "ms", "(nothing copied)")

        job.take_snapshot()
        committed = job.state("totals")
        with timer() as t:
            committed.get("k1")
        figure(f"first snapshot read ({keys:,} keys decoded)", t[0], "s")
        with timer() as t:
            for i in range(1000):
                committed.get(f"k{i}")
        figure("one-key snapshot read, decoded", t[0], "ms")  # 1000 reads: ms per read
        with timer() as t:
            n = sum(1 for _ in committed.items())
        figure(f"snapshot scan of {n:,} keys", t[0], "s")
        job.cancel()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench state-reads")
    ap.add_argument("--keys", type=int, default=KEYS)
    ap.add_argument("--seconds", type=float, default=SECONDS)
    a, _ = ap.parse_known_args(sys.argv[2:] if argv is None else argv)
    run(a.keys, a.seconds)


if __name__ == "__main__":
    main(sys.argv[1:])
