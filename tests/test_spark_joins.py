"""The joins of two streams in the Spark backfill over bounded inputs: the same output as an
embedded member, the pairs' times kept for a window after the join. (Over Kafka, with the
hand-off, see tests/test_conformance_spark.py.)"""

from __future__ import annotations

import random

import pytest

from jetwake import AggregateOperations as ops, Sinks, Sources, WindowDefinition

from support.spark_fixtures import (  # noqa: F401 - spark_runner is a fixture
    canonical, run_on_member, run_on_spark, spark_runner,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration]

rng = random.Random(3)
LEFTS = [(7 * i + rng.randint(0, 40), f"k{rng.randint(0, 4)}", i) for i in range(600)]
RIGHTS = [(5 * i + rng.randint(0, 40), f"k{rng.randint(0, 4)}", -i) for i in range(800)]


def key(e):
    return e[1]


def ts(e):
    return e[0]


def build(p):
    left = p.read_from(Sources.items(LEFTS)).with_timestamps(ts, 50)
    right = p.read_from(Sources.items(RIGHTS)).with_timestamps(ts, 50)
    pairs = left.join_interval(right, key, key, -10, 25)
    pairs.write_to(Sinks.list("pairs"))
    pairs.window(WindowDefinition.tumbling(500)).aggregate(ops.counting()) \
        .write_to(Sinks.list("per-window"))
    left.join_asof(right, key, key, tolerance_ms=12).write_to(Sinks.list("asof"))
    left.join_asof(right, key, key, how="inner",
                   fn=lambda a, b: None if a[2] % 3 else (a[2], b[2])) \
        .write_to(Sinks.list("inner"))


def test_the_backfill_joins_two_bounded_streams_as_a_member_does(spark_runner):
    names = ["pairs", "per-window", "asof", "inner"]
    on_member = run_on_member(build, names)
    on_spark, _ = run_on_spark(spark_runner, build, names)
    for name in names:
        assert canonical(on_spark[name]) == canonical(on_member[name]), name
    want = sorted((a, b) for a in LEFTS for b in RIGHTS
                  if key(a) == key(b) and ts(a) - 10 <= ts(b) <= ts(a) + 25)
    assert sorted(on_spark["pairs"]) == want and len(want) > 300
    assert sum(w.result for w in on_spark["per-window"]) == len(want)
    assert len(on_spark["asof"]) == len(LEFTS)
