"""Event time read in a partitioned source, per partition, beside the stage of its own it was.

The same job on the same 1 million events (4 partitions of JSON-like dicts whose event time is
in the payload, as on a Kafka topic; a tumbling 1 s count per key): once with
``with_timestamps(fn)`` right after the source, where it runs inside the source with a
watermark per partition, and once with a ``map`` of the identity in between, which keeps the
old path (a timestamp stage of its own, one watermark per source processor). The partitions
are read round-robin and level in event time, so the old path judges nothing late either and
both results are compared. The ratio is the source path's rate over the stage's.
"""

from __future__ import annotations

import random

from jetwake import AggregateOperations, Member, Pipeline, Sinks, TestSources, WindowDefinition

from .report import line, timer

EVENTS = 1_000_000
PARTITIONS = 4
KEYS = 1_000


def make_partitions(seed: int = 11) -> list[list[dict]]:
    rnd = random.Random(seed)
    parts: list[list[dict]] = [[] for _ in range(PARTITIONS)]
    for i in range(EVENTS):
        parts[i % PARTITIONS].append({"ts": i // 50 - rnd.randint(0, 20),
                                      "user": f"user-{rnd.randrange(KEYS)}"})
    return parts


def run(parts: list[list[dict]], in_source: bool, parallelism: int) -> dict:
    p = Pipeline()
    src = p.read_from(TestSources.partitioned(parts, batch=1024))
    if not in_source:
        src = src.map(lambda e: e)  # a stage in between: the timestamp stage stays one of its own
    (src.with_timestamps(lambda e: e["ts"], allowed_lag=100)
        .window(WindowDefinition.tumbling(1_000))
        .group_by(lambda e: e["user"])
        .aggregate(AggregateOperations.counting())
        .write_to(Sinks.list("counts")))
    assert ("timestamps" in {v.name for v in p.to_dag().vertices}) is not in_source
    with Member(local_parallelism=parallelism) as m:
        job = m.new_job(p)
        job.join()
        late = sum(v.get("late_events", 0) for v in job.metrics().values())
        assert late == 0, f"{late} late events"
        return {(r.start, r.key): r.result for r in m.get_list("counts")}


def main(rounds: int = 3, parallelism: int = 1) -> None:
    parts = make_partitions()
    best_source = best_stage = float("inf")
    for _ in range(rounds):  # alternated, the best of each kept
        with timer() as t_stage:
            expected = run(parts, False, parallelism)
        with timer() as t_source:
            got = run(parts, True, parallelism)
        assert got == expected, "the two paths' windows differ"
        best_stage = min(best_stage, t_stage[0])
        best_source = min(best_source, t_source[0])
    line(f"event time in the source, {EVENTS // 1_000_000}M events", EVENTS / best_source,
         EVENTS / best_stage, "events", "a stage of its own")


if __name__ == "__main__":
    main()
