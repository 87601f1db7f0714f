"""The Spark backfill beside an embedded member, same pipelines, same machine.

Word count over ``BACKFILL_WORDS`` words (10 million by default) and the sliding-window count of
``bench_windows`` (2 million events), on Spark ``local[2]`` and on one member with local
parallelism 2: records/s of each once started, the ratio, and Spark's start-up time apart (the
session, and a first small run that starts the Python workers). The word count reads from text
files (one Spark task per file, as a backfill reads its input); the member reads the same
files. Each pipeline runs ``BACKFILL_ROUNDS`` times (3) on each, alternately, and the best run
of each counts: on a shared 2-core host one run varies by up to 3x with what else runs.
``BACKFILL_CASES`` (``words,windows`` by default) picks the pipelines.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile

from jetwake import AggregateOperations, Member, Pipeline, Sinks, Sources, WindowDefinition

from .bench_windows import EVENTS, LAG, SIZE, SLIDE, make_events
from .report import figure, line, timer

WORDS = int(os.environ.get("BACKFILL_WORDS", 10_000_000))
ROUNDS = int(os.environ.get("BACKFILL_ROUNDS", 3))
CASES = os.environ.get("BACKFILL_CASES", "words,windows").split(",")
FILES = 8


def write_words(directory: str) -> None:
    rnd = random.Random(3)
    vocab = [f"word{i}" for i in range(5_000)]
    per_file = WORDS // FILES
    for n in range(FILES):
        with open(os.path.join(directory, f"{n}.txt"), "w") as f:
            for _ in range(per_file // 10):
                f.write(" ".join(rnd.choices(vocab, k=10)) + "\n")


def word_count(directory: str) -> Pipeline:
    p = Pipeline()
    (p.read_from(Sources.files(os.path.join(directory, "*.txt")))
      .flat_map(str.split)
      .group_by(lambda w: w)
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.map("counts")))
    return p


def tiny() -> Pipeline:
    """A first run that starts Spark's Python workers (part of the start-up)."""
    p = Pipeline()
    (p.read_from(Sources.items(["to be or not to be"]))
      .flat_map(str.split)
      .group_by(lambda w: w)
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.map("counts")))
    return p


def windows(events: list) -> Pipeline:
    p = Pipeline()
    (p.read_from(Sources.items(events))
      .with_timestamps(lambda e: e[0], allowed_lag=LAG)
      .window(WindowDefinition.sliding(SIZE, SLIDE))
      .group_by(lambda e: e[1])
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.noop()))
    return p


def main() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("pyspark is not installed: pip install -e '.[spark]'", file=sys.stderr)
        return
    from jetwake import SparkRunner

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    directory = tempfile.mkdtemp(prefix="jetwake-bench-backfill-")
    try:
        if "words" in CASES:
            write_words(directory)
        events = make_events()
        runner = SparkRunner(master="local[2]", conf={"spark.default.parallelism": "2"})
        with timer() as t_start:
            runner.spark.sparkContext.setLogLevel("ERROR")
        with timer() as t_first:
            with Member() as m:
                runner.run(tiny(), member=m)
        figure("backfill: Spark local[2] start-up", t_start[0], "s",
               f"(session; a first small run {t_first[0]:.2f} s)")
        cases = [(f"word count, {WORDS / 1e6:g}M words", lambda: word_count(directory), WORDS,
                  "words"),
                 (f"sliding 10s/1s count, {EVENTS // 1_000_000}M ev", lambda: windows(events),
                  EVENTS, "windows")]
        for name, build, n, case in cases:
            if case not in CASES:
                continue
            best_member = best_spark = float("inf")
            for _ in range(ROUNDS):
                with Member(local_parallelism=2) as m:
                    with timer() as t_member:
                        m.new_job(build()).join()
                with Member() as m:
                    with timer() as t_spark:
                        runner.run(build(), member=m)
                best_member = min(best_member, t_member[0])
                best_spark = min(best_spark, t_spark[0])
            line(f"backfill {name}", n / best_spark, n / best_member, "rec",
                 "member (parallelism 2)")
        runner.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
