"""The runtimes a spec runs on, each ``(spec, inputs) -> RunResult``.

A runtime builds the spec's job with :func:`generate.build_pipeline`, giving it its own
sources (each source's partitions) and sinks, runs the job to its end and collects what every
sink received and the ``late_events`` metric of each window and ttl stage (:func:`collect`).
``RUNTIMES`` lists them by name; the conformance suite runs every one against the model. To
add one (a cluster of members, the Spark backfill, a backfill handed over to a streaming job,
a member killed mid-run), write a function of the same signature and add it there: it must
feed each source's partitions as partitions (each in its order), read what each sink label
received, and sum the metric over the stage's vertices (``late_vertices``). Where one
partition fixes the watermark exactly (see tests/reference/model.py), the runtime must not let
a source processor without partitions hold it back: ``build_pipeline`` gives a one-partition
source one processor per member, so a cluster runtime needs to pin it to one processor in all.
"""

from __future__ import annotations

import zlib
from functools import partial
from typing import Any, Callable

from .generate import build_pipeline, late_label, out_label
from .result import RunResult, multiset
from .spec import Inputs, Spec, node_ids

__all__ = ["Runtime", "RUNTIMES", "ORDERS", "run_on_member", "run_on_member_items", "collect",
           "late_vertices"]

Runtime = Callable[[Spec, Inputs], RunResult]

ORDERS = ("round_robin", "sequential", "random")
"""How ``TestSources.partitioned`` interleaves a processor's partitions."""

JOB_TIMEOUT = 60  # seconds; a conformance job takes milliseconds


def late_vertices(stage_id: str) -> tuple[str, ...]:
    """The vertices of a window, ttl or join stage that may count late events: a two-stage
    window's frame accumulator and its combiner, or the stage's one vertex."""
    return (stage_id, f"{stage_id}-accumulate")


def collect(spec: Spec, read_sink: Callable[[str], list], metrics: dict[str, dict]) -> RunResult:
    """The ``RunResult`` of a finished job: ``read_sink(label)`` gives what a sink received,
    ``metrics`` is the job's ``Job.metrics()``."""
    result = RunResult()
    for node in node_ids(spec):
        result.outputs[node] = multiset(read_sink(out_label(node)))
    for s in spec["stages"]:
        if s["kind"] == "window" and s["late_sink"]:
            result.late_items[s["id"]] = multiset(read_sink(late_label(s["id"])))
        if s["kind"] in ("window", "interval_join", "asof_join") or (
                s["kind"] == "map_stateful" and s["ttl"] is not None):
            result.late_counts[s["id"]] = sum(metrics.get(v, {}).get("late_events", 0)
                                              for v in late_vertices(s["id"]))
    return result


def _run_member(spec: Spec, inputs: Inputs, source_for: Callable[[str, list], Any],
                local_parallelism: int) -> RunResult:
    from jetwake import Member, Sinks
    with Member(local_parallelism=local_parallelism) as member:
        pipeline = build_pipeline(spec, inputs, source_for, Sinks.list)
        job = member.new_job(pipeline)
        job.join(timeout=JOB_TIMEOUT)
        return collect(spec, lambda label: list(member.get_list(label)), job.metrics())


def run_on_member(spec: Spec, inputs: Inputs, *, order: str = "round_robin",
                  batch: int | None = None, seed: int | None = None,
                  local_parallelism: int = 2) -> RunResult:
    """One embedded member; each source is ``TestSources.partitioned`` over its partitions,
    read in ``order``, up to ``batch`` items of a partition at a time. ``batch`` and ``seed``
    (of the random order) default to values drawn from the inputs, so that examples see
    different interleavings, and a failing one the same again."""
    from jetwake import TestSources
    digest = zlib.crc32(repr((spec, inputs)).encode())
    if batch is None:
        batch = (1, 3, 8, 64)[digest % 4]
    if seed is None:
        seed = digest

    def source_for(name: str, partitions: list) -> Any:
        return TestSources.partitioned(partitions, batch=batch, order=order, seed=seed)
    return _run_member(spec, inputs, source_for, local_parallelism)


def run_on_member_items(spec: Spec, inputs: Inputs, *, local_parallelism: int = 2) -> RunResult:
    """One embedded member, each source ``Sources.items`` of its one partition (one processor:
    its watermarks are the partition's). For specs whose sources have one partition each."""
    from jetwake import Sources

    def source_for(name: str, partitions: list) -> Any:
        if len(partitions) != 1:
            raise ValueError(f"source {name!r} has {len(partitions)} partitions; "
                             "Sources.items reads one")
        return Sources.items(list(partitions[0]))
    return _run_member(spec, inputs, source_for, local_parallelism)


RUNTIMES: dict[str, Runtime] = {
    f"member-{order}": partial(run_on_member, order=order) for order in ORDERS
}
"""Every runtime the conformance suite checks against the model, by name."""
