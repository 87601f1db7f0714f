"""The Spark form of ``map_using_service`` and ``map_using_service_async`` (docs/backfill.md).

Each Spark task (a partition) creates the stage's service once, as a member's processor does
(``shared_per`` has no meaning across Spark's Python workers: a service per task), and runs
the member's own rules over its elements (``engine/processors/service_calls.py``): the
synchronous call, or :class:`AsyncCalls` on an event loop of the task's own with the same
``max_concurrent``, per-key order, ordering, timeout and retry policy. The grouped form first
brings each key's elements to one partition in the member's order (``by_key_sorted``).
Results keep their element's time and watermark; a call that fails for good goes to the
``errors_to`` sink or fails the run naming the item. The stage has no state for a hand-off:
a member's processor saves none either (its snapshots wait for the calls in flight).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

from jetwake.engine.backfill.chunks import chunked
from jetwake.engine.backfill.stage_output import StageOut
from jetwake.engine.processors.service_calls import (
    DATA, SIDE, AsyncCalls, CallMetrics, ServiceLease, call_failed, call_sync, failure_record,
)

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.backfill.translate import Translator
    from jetwake.engine.pipeline.transforms import MapUsingServiceTransform

__all__ = ["map_using_service", "run_service_calls"]

_OUT, _ERR = "o", "e"


def map_using_service(backfill: "Translator", t: "MapUsingServiceTransform") -> StageOut:
    up = backfill.outs[id(t.upstream[0])]
    counters, timed = backfill.counters, up.timed
    side = t.side_sink is not None
    args = (t.factory, t.fn, t.name, t.is_async, t.key_fn, timed, side, t.max_concurrent,
            t.preserve_order, t.timeout_ms, t.retrying)

    def count(m: dict[str, Any]) -> None:
        counters.add({k: m[k] for k in ("calls", "call_retries", "call_failures") if m[k]})
    if t.key_fn is not None:
        elements = backfill.by_key_sorted(up, t.key_fn).mapPartitions(
            lambda it: (e for _, e in it), preservesPartitioning=True)
    else:
        elements = up.chunks(counters).mapPartitions(_flat, preservesPartitioning=True)
    tagged = elements.mapPartitions(lambda it: run_service_calls(it, *args, count=count),
                                    preservesPartitioning=True)
    if side:
        tagged = tagged.persist()  # the calls run once for the results and the failures
        backfill.side[id(t)] = tagged.filter(_is_error).mapPartitions(
            lambda it: chunked(v for _, v in it))
    out = tagged.filter(_is_out).mapPartitions(lambda it: chunked(v for _, v in it),
                                               preservesPartitioning=True)
    return StageOut(out, timed=timed, timestamped=up.timestamped,
                    ordered=up.ordered and t.key_fn is None and t.preserve_order,
                    unbounded=up.unbounded, cut=up.cut, last_watermark=up.last_watermark)


def run_service_calls(elements: Iterable[Any], factory: Any, fn: Any, stage: str,
                      is_async: bool, key_fn: Any, timed: bool, errors_to: bool,
                      max_concurrent: int, preserve_order: bool, timeout_ms: Any,
                      retrying: Any, count: Any = None) -> Iterator[tuple[str, Any]]:
    """The stage over one partition's elements (items, or ``(ts, wm, item)`` when ``timed``):
    ``("o", result element)`` and ``("e", failure record)``, the service created before the
    first call and destroyed after the last."""
    lease = ServiceLease(factory, stage, None, is_async)
    metrics: dict[str, Any] = {}
    calls_metrics = CallMetrics(metrics)
    try:
        if is_async:
            assert lease.loop is not None
            calls = AsyncCalls(lease.loop, lease.service, fn, stage, max_concurrent,
                               preserve_order, timeout_ms, retrying, key_fn is not None,
                               errors_to, calls_metrics)
            for e in elements:
                while not calls.has_room():
                    calls.wait(0.05)
                    yield from _async_out(calls, timed)
                if timed:
                    calls.add((e[0], e[1]), e[2], key_fn(e[2]) if key_fn is not None else None)
                else:
                    calls.add(None, e, key_fn(e) if key_fn is not None else None)
                calls.start()
                yield from _async_out(calls, timed)
            while not calls.idle:
                calls.wait(0.05)
                yield from _async_out(calls, timed)
            return
        for e in elements:
            item = e[2] if timed else e
            r, error, ms = call_sync(fn, lease.service, item)
            calls_metrics.done(ms, 1, error is not None)
            if error is not None:
                if not errors_to:
                    raise call_failed(stage, item, error, 1) from error
                yield _ERR, failure_record(stage, item, error, 1)
            elif r is not None:
                yield _OUT, ((e[0], e[1], r) if timed else r)
    finally:
        lease.close()
        if count is not None:
            count(metrics)


def _async_out(calls: AsyncCalls, timed: bool) -> Iterator[tuple[str, Any]]:
    for kind, ts, x in calls.take():
        if kind == DATA:
            yield _OUT, ((ts[0], ts[1], x) if timed else x)
        elif kind == SIDE:
            yield _ERR, x


def _flat(chunks: Iterator[list]) -> Iterator[Any]:
    for chunk in chunks:
        yield from chunk


def _is_out(tagged: tuple) -> bool:
    return tagged[0] == _OUT


def _is_error(tagged: tuple) -> bool:
    return tagged[0] == _ERR
