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

__all__ = ["Counts", "StageMetrics", "vertex_counts", "stage_counts", "member_counts", "summed",
           "LATENCY_BUCKETS_MS", "latency_bucket_key", "latency_buckets", "latency_percentile",
           "with_percentiles", "readable_counters", "LATENCY_BUCKET_PREFIX", "LATENCY_SUM"]

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


# --- call latency: a histogram of counters, its percentiles derived after summing -------------

#: the upper bounds (ms) of the call latency histogram's buckets, and +inf after the last;
#: fixed, so that every processor's and member's buckets add up (percentiles do not)
LATENCY_BUCKETS_MS: tuple[int, ...] = (
    1, 2, 3, 5, 7, 10, 15, 20, 25, 30, 40, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 1500,
    2000, 3000, 5000, 10000, 30000, 60000)
LATENCY_BUCKET_PREFIX = "call_latency_ms_bucket_"
LATENCY_SUM = "call_latency_ms_sum"
LATENCY_PERCENTILES = (50, 95, 99)
_BUCKET_KEYS = tuple(f"{LATENCY_BUCKET_PREFIX}{le}" for le in LATENCY_BUCKETS_MS) + \
    (f"{LATENCY_BUCKET_PREFIX}inf",)


def latency_bucket_key(ms: float) -> str:
    """The counter of the bucket a call of ``ms`` milliseconds falls in: the first whose upper
    bound is at least ``ms`` (each bucket counts its own calls, not cumulatively)."""
    lo, hi = 0, len(LATENCY_BUCKETS_MS)
    while lo < hi:  # bisect over the bounds
        mid = (lo + hi) // 2
        if LATENCY_BUCKETS_MS[mid] < ms:
            lo = mid + 1
        else:
            hi = mid
    return _BUCKET_KEYS[lo]


def latency_buckets(counters: dict[str, float]) -> list[tuple[float, float]]:
    """``(upper bound, calls)`` of each bucket of ``counters`` (not cumulative), the last
    bound ``inf``; empty when the counters hold no latency histogram."""
    if not any(k.startswith(LATENCY_BUCKET_PREFIX) for k in counters):
        return []
    bounds = [float(b) for b in LATENCY_BUCKETS_MS] + [float("inf")]
    return [(b, counters.get(k, 0)) for b, k in zip(bounds, _BUCKET_KEYS)]


def latency_percentile(counters: dict[str, float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of the call latency in ``counters``, in ms, estimated
    from the histogram by linear interpolation inside the bucket it falls in (as Prometheus's
    ``histogram_quantile``); None without calls. A value in the last, unbounded bucket is
    given as the highest bound."""
    buckets = latency_buckets(counters)
    total = sum(n for _, n in buckets)
    if total <= 0:
        return None
    rank = total * q / 100
    seen = 0.0
    lower = 0.0
    for upper, n in buckets:
        if n and seen + n >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - seen) / n
        seen += n
        if upper != float("inf"):
            lower = upper
    return lower


def with_percentiles(counts: Counts) -> Counts:
    """``counts`` with ``call_latency_p50_ms``, ``_p95_ms`` and ``_p99_ms`` added to each
    name that has a call latency histogram: derived after the counts of every processor and
    member are summed, since percentiles themselves cannot be added. Every ``job.metrics()``
    (a member's job, a cluster's, a remote one) goes through this."""
    for counters in counts.values():
        if not any(k.startswith(LATENCY_BUCKET_PREFIX) for k in counters):
            continue
        for q in LATENCY_PERCENTILES:
            p = latency_percentile(counters, q)
            if p is not None:
                counters[f"call_latency_p{q}_ms"] = round(p, 3)
    return counts


def readable_counters(counters: dict[str, float]) -> dict[str, float]:
    """One name's counters as a person reads them (the dashboard): the latency histogram
    replaced by its percentiles."""
    out = with_percentiles({"": dict(counters)})[""]
    return {k: v for k, v in out.items()
            if not k.startswith(LATENCY_BUCKET_PREFIX) and k != LATENCY_SUM}
