"""Items in chunks: how a backfill moves data through Spark without a Python call per item.

A stage's output is an RDD whose elements are *chunks*, lists of up to :data:`CHUNK` elements,
and the stateless stages after it (map, filter, flat_map) are not Spark operations of their
own: they are kept as a chain of functions over a chunk, the member's own fused-chain semantics
(``engine/pipeline/fusion.py``), and run inside whatever Spark task reads the stage, one list
comprehension per stage per chunk. In CPython a call, a generator step or a pickled tuple per
item costs more than the work of a typical stage, so the member batches the same way.

An element is the item itself or, once the stream carries event time (after
``with_timestamps``, or from a Kafka source, whose records have a time), the triple
``(ts, wm, item)``: ``wm`` is the watermark the streaming job would have had just before the
item (None when it cannot be known in advance). An element's position in its source is not
stored: every RDD of a stage keeps its source order, partition by partition (partition ``i``
before ``i + 1``, each in order), so ``(partition index, index in the partition)`` is the
position, computed by the few stages that order by it.
"""

from __future__ import annotations

from itertools import islice, repeat
from typing import Any, Callable, Iterable, Iterator, Sequence

from jetwake.engine.execution.execution_service import collect_less_often
from jetwake.engine.operations.watermark_policy import NO_WATERMARK
from jetwake.engine.pipeline.fusion import note_stage, stateless_function

__all__ = ["CHUNK", "chunked", "stateless_chunk_function", "run_chain", "Step", "watermarks_before",
           "worker_gc"]

CHUNK = 4096

# one step of a chain: a function over a chunk (None: the chunk passes unchanged) and the
# counter its output adds to (None: not counted)
Step = tuple


def chunked(items: Iterable[Any], size: int = CHUNK) -> Iterator[list]:
    """``items`` as lists of up to ``size``."""
    worker_gc()
    it = iter(items)
    while True:
        chunk = list(islice(it, size))
        if not chunk:
            return
        yield chunk


def _timed_map(fn: Callable[[Any], Any]) -> Callable[[list], list]:
    def apply(chunk: list) -> list:
        out: list[Any] = []
        add = out.append
        for t, w, x in chunk:
            y = fn(x)
            if y is not None:  # as in the member, a map returning None drops the item
                add((t, w, y))
        return out
    return apply


def _timed_filter(fn: Callable[[Any], Any]) -> Callable[[list], list]:
    return lambda chunk: [e for e in chunk if fn(e[2])]


def _timed_flat_map(fn: Callable[[Any], Any]) -> Callable[[list], list]:
    return lambda chunk: [(t, w, y) for t, w, x in chunk for y in (fn(x) or ())]


_TIMED = {"map": _timed_map, "filter": _timed_filter, "flat_map": _timed_flat_map}


def stateless_chunk_function(kind: str, fn: Callable[[Any], Any], timed: bool,
                             stage: str) -> Callable[[list], list]:
    """The chunk function of a stateless stage: the member's semantics over plain items, or the
    same over ``(ts, wm, item)`` elements whose results keep the item's time and watermark. An
    exception it raises names ``stage``, as in the member (the run's failure reports it)."""
    apply = stateless_function(kind, fn) if not timed else _TIMED[kind](fn)

    def run(chunk: list) -> list:
        try:
            return apply(chunk)
        except Exception as e:
            note_stage(e, f"stage {stage!r} ({kind})")
            raise
    return run


def run_chain(chunks: Iterable[list], steps: Sequence[Step], counters: Any) -> Iterator[list]:
    """Applies ``steps`` to each chunk of one Spark partition, counting each step's output per
    chunk; the counts go to the run's accumulator when the partition ends."""
    worker_gc()
    fns = [fn for fn, _ in steps]
    n = [0] * len(steps)
    try:
        for chunk in chunks:
            for i, fn in enumerate(fns):
                if fn is not None:
                    chunk = fn(chunk)
                n[i] += len(chunk)
                if not chunk:
                    break
            else:
                yield chunk
    finally:
        if counters is not None:
            sums: dict = {}
            for (_, key), k in zip(steps, n):
                if key is not None and k:
                    sums[key] = sums.get(key, 0) + k
            if sums:
                counters.add(sums)


def watermarks_before(tss: list, top: int, lag: int, step: int) -> tuple[list, int]:
    """The watermark each event of a chunk meets (None before any), with the limiting-lag
    policy the member's watermark stage applies: the highest time so far (``top`` before the
    chunk) less ``lag``, rounded down to ``step``; and the highest time after the chunk.
    ``step`` 0 (no window downstream): as in the member, one watermark per chunk, so every
    event of the chunk meets the one before it.

    The watermark changes only at an event whose time crosses the next step: each such event
    is found by a scan in C (``filter``, then ``index``), a few times per chunk, and the
    events between share one watermark; nothing is computed per event in Python."""
    n = len(tss)
    if step <= 0:
        hi = max(tss, default=top)
        return [None if top == NO_WATERMARK else top - lag] * n, hi if hi > top else top
    wms: list = []
    pos = 0
    while pos < n:
        if top == NO_WATERMARK:
            w = None
            k = pos  # the first event sets the highest time
            v = tss[pos]
        else:
            w = (top - lag) - (top - lag) % step
            # the first event from ``pos`` whose time moves the watermark past ``w``
            v = next(filter((w + step + lag).__le__, islice(tss, pos, None)), None)
            if v is None:
                wms.extend(repeat(w, n - pos))
                hi = max(islice(tss, pos, None))
                return wms, hi if hi > top else top
            k = tss.index(v, pos)
        wms.extend(repeat(w, k - pos + 1))  # the event at k meets the watermark before it
        # every event before k is lower than v (v is the first to reach the threshold)
        top = v if v > top else top
        pos = k + 1
    return wms, top


def worker_gc() -> None:
    """The member's garbage-collector setting in a Spark worker: chunks allocate thousands of
    tuples at once, and with CPython's default first threshold a collection (and, every
    70,000 allocations, a full one over the task's data) runs every few hundred items; measured
    on the windows benchmark, 2.3x the time of a stage's accumulation
    (``collect_less_often``)."""
    collect_less_often()
