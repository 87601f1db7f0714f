"""What a job's processors counted: items in and out per vertex and per fused stage, with the
other counters processors keep in ``context.metrics`` (``late_events``, ``bad_timestamps``...).

A member counts its own processors (:func:`member_counts`); ``Job.metrics()`` on a cluster is
the sum of every member's counts (:func:`summed`), as Jet's ``Job.getMetrics()`` merges every
member's: a running execution's members are asked for theirs, an ended one's sent them with
their end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from jetwake.engine.core.edge_transform import EdgeTransform
from jetwake.engine.execution.tasklet import ProcessorTasklet

__all__ = ["Counts", "StageMetrics", "vertex_counts", "stage_counts", "member_counts", "summed"]

#: name (a vertex, or a stateless stage fused into one) -> counter -> value
Counts = dict[str, dict[str, float]]


def vertex_counts(tasklets: Iterable[ProcessorTasklet]) -> Counts:
    """Items in and out per vertex, summed over ``tasklets`` (processors), with the other
    numeric counters they keep in ``context.metrics``."""
    out: Counts = {}
    for t in tasklets:
        m = out.setdefault(t.context.vertex_name, {"items_in": 0, "items_out": 0})
        m["items_in"] += t.items_in
        m["items_out"] += t.items_out
        for k, v in t.context.metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                m[k] = m.get(k, 0) + v
    return out


@dataclass
class StageMetrics:
    """Items in and out of one fused stage, summed over the processors it runs in."""
    vertex: str
    kind: str
    items_in: int = 0
    items_out: int = 0


def stage_counts(tasklets: Iterable[ProcessorTasklet]) -> dict[str, StageMetrics]:
    """Items in and out of each stateless stage fused into a vertex, summed over
    ``tasklets``: each edge transform that runs pipeline stages (a pipeline's fused chain)
    says what each counted, on the outbound edges of the vertex the stages are fused into."""
    out: dict[str, StageMetrics] = {}
    for t in tasklets:
        for s in t.outbound:
            chain = s.transform
            if not isinstance(chain, EdgeTransform):
                continue  # a plain function counts nothing
            for step, n_in, n_out in chain.stage_counts():
                m = out.get(step.stage)
                if m is None:
                    m = out[step.stage] = StageMetrics(t.context.vertex_name, step.kind)
                m.items_in += n_in
                m.items_out += n_out
    return out


def member_counts(tasklets: Iterable[ProcessorTasklet]) -> Counts:
    """Every vertex's and every fused stage's counts over ``tasklets``: every stage the user
    wrote is there, under its own name or as the vertex named after it."""
    tasklets = list(tasklets)
    out = vertex_counts(tasklets)
    for stage, m in stage_counts(tasklets).items():
        out[stage] = {"items_in": m.items_in, "items_out": m.items_out}
    return out


def summed(parts: Iterable[Counts]) -> Counts:
    """Several members' counts as one: each name's counters added up."""
    out: Counts = {}
    for part in parts:
        for name, counters in part.items():
            m = out.setdefault(name, {})
            for k, v in counters.items():
                m[k] = m.get(k, 0) + v
    return out
