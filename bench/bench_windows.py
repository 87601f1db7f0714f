"""Sliding windows on one member beside a plain-Python loop computing the same windows.

2 million events over 10,000 keys, 20 s of event time (100 events per ms, up to 50 ms out of
order), a window of 10 s sliding by 1 s, counting per key. The loop is the same frame algorithm
written directly (a dict of per-(key, frame) counts, then each window as the sum of its ten
frames); both results are compared.
"""

from __future__ import annotations

import random
from collections import defaultdict

from jetwake import AggregateOperations, Member, Pipeline, Sinks, Sources, WindowDefinition

from .report import figure, timer

EVENTS = 2_000_000
KEYS = 10_000
SIZE, SLIDE = 10_000, 1_000
LAG = 100


def make_events(seed: int = 7) -> list[tuple[int, str]]:
    rnd = random.Random(seed)
    keys = [f"user-{i}" for i in range(KEYS)]
    choice = rnd.choice
    rand = rnd.random
    return [(i // 100 - int(rand() * 50), choice(keys)) for i in range(EVENTS)]


def plain_loop(events: list[tuple[int, str]]) -> dict:
    frames: dict = {}
    get = frames.get
    for ts, key in events:
        k = (key, ts - ts % SLIDE)
        frames[k] = get(k, 0) + 1
    windows: dict = defaultdict(int)
    for (key, f), n in frames.items():
        for end in range(f + SLIDE, f + SIZE + 1, SLIDE):
            windows[(end - SIZE, end, key)] += n
    return windows


def engine(events: list[tuple[int, str]], parallelism: int) -> dict:
    p = Pipeline()
    (p.read_from(Sources.items(events))
      .with_timestamps(lambda e: e[0], allowed_lag=LAG)
      .window(WindowDefinition.sliding(SIZE, SLIDE))
      .group_by(lambda e: e[1])
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.list("windows")))
    with Member(local_parallelism=parallelism) as m:
        job = m.new_job(p)
        job.join()
        late = sum(v.get("late_events", 0) for v in job.metrics().values())
        assert late == 0, f"{late} late events: the lag must cover the disorder"
        return {(r.start, r.end, r.key): r.result for r in m.get_list("windows")}


def main(rounds: int = 3, parallelism: int = 2) -> None:
    events = make_events()
    best_loop = best_engine = float("inf")
    for _ in range(rounds):
        with timer() as t_loop:
            expected = plain_loop(events)
        with timer() as t_engine:
            got = engine(events, parallelism)
        assert got == expected, "the engine's windows differ from the loop's"
        best_loop = min(best_loop, t_loop[0])
        best_engine = min(best_engine, t_engine[0])
    name = f"sliding 10s/1s count, {EVENTS // 1_000_000}M ev, {KEYS // 1000}k keys"
    figure(f"{name}: engine", EVENTS / best_engine, "events/s",
           f"(one member, local parallelism {parallelism}, {len(expected):,} window results)")
    figure(f"{name}: plain Python", EVENTS / best_loop, "events/s")
    figure(f"{name}: ratio engine/plain", best_loop / best_engine, "")


if __name__ == "__main__":
    main()
