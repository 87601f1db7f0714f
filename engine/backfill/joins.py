"""The joins of two streams in event time (``join_interval``, ``join_asof``) in a backfill.

Both inputs are shuffled by their join key's partition (jetwake's own partitioning) into the
same Spark partitions, each sorted by event time, then by side, then by position in its
source; one pass per Spark partition runs the member's own join
(``IntervalJoinState``, ``AsofJoinState``, ``asof_results``) with the time reached so far as
its watermark: every element after it in the pass is at or above it, so, as on a member
where nothing is late, an interval join emits every pair of the input and an as-of join
matches every left element with the latest right one of its key at or before it (ties: the
last in source order, as one partition's order on a member).

No element is judged late: the member's watermark at a join is the lowest of its two
inputs', which depends on how they interleaved (as for a merge, see ``translate.py``).

Over Kafka the pass's watermark stops at the hand-off watermark ``cut`` (the lower of the two
inputs'): the as-of join emits the left elements below it, and the hand-off snapshot holds
what the member's processor holds at that watermark, through the processors' codecs (the
entries the watermark has not expired, the left elements still waiting), so a streaming job
started from it emits exactly the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from jetwake.engine.core.partitioning import partition_of
from jetwake.engine.core.stream_items import NO_WATERMARK
from jetwake.engine.processors.asof_join import (
    END_OF_TIME, AsofJoinEntries, AsofJoinState, asof_results,
)
from jetwake.engine.processors.interval_join import IntervalJoinEntries, IntervalJoinState
from jetwake.engine.processors.stream_join import LEFT
from jetwake.engine.backfill.stage_output import StageOut

if TYPE_CHECKING:
    from jetwake.engine.backfill.translate import Translator
    from jetwake.engine.pipeline.transforms import AsofJoinTransform, IntervalJoinTransform

__all__ = ["interval_join", "asof_join"]


def _sorted_rows(backfill: Translator, t: Any) -> tuple[Any, bool, int | None]:
    """Both inputs' elements as ``((partition, ts, side, i, j), (key, item))``, each join key
    in one Spark partition, sorted; whether the run is bounded, and the hand-off watermark."""
    n = backfill.partitions
    rdds = []
    outs = [backfill.outs[id(u)] for u in t.upstream]
    for side, (up, key_fn) in enumerate(zip(outs, (t.key_fn, t.other_key_fn))):
        def rows(i: int, it: Iterator, side: int = side, key_fn: Any = key_fn) -> Iterator:
            j = 0
            for chunk in it:
                for ts, _, x in chunk:
                    k = key_fn(x)
                    yield (partition_of(k) % n, ts, side, i, j), (k, x)
                    j += 1
        rdds.append(up.chunks(backfill.counters).mapPartitionsWithIndex(rows))
    unbounded = any(u.unbounded for u in outs)
    cuts = [u.cut for u in outs if u.cut is not None]
    cut = min(cuts) if cuts else (NO_WATERMARK if unbounded else None)
    rows_rdd = backfill.sc.union(rdds).repartitionAndSortWithinPartitions(
        n, partitionFunc=_first)
    return rows_rdd, not unbounded, cut


def _first(k: tuple) -> int:
    return k[0]


def _stage_out(backfill: Translator, t: Any, tagged: Any, bounded: bool,
               cut: int | None, codec: Any) -> StageOut:
    if backfill.export_state and cut is not None:
        backfill.driver_state.append((t.name, *codec.watermark(cut)))
    return StageOut(backfill.split(t.name, tagged), timestamped=True, unbounded=not bounded,
                    cut=cut)


def interval_join(backfill: Translator, t: IntervalJoinTransform) -> StageOut:
    rows, bounded, cut = _sorted_rows(backfill, t)
    args = (t.lower, t.upper, t.fn, cut, backfill.export_state, t.name)
    tagged = rows.mapPartitions(lambda it: interval_pass(it, *args))
    return _stage_out(backfill, t, tagged, bounded, cut, IntervalJoinEntries)


def interval_pass(rows: Iterable[tuple], lower: int, upper: int,
                  fn: Callable[[Any, Any], Any] | None, cut: int | None,
                  export_state: bool, vertex: str) -> Iterator[tuple]:
    """One Spark partition of an interval join: ``("o", (ts, None, result))`` per pair and,
    with a hand-off, ``("s", (vertex, key, entry))`` per key of the state at ``cut``."""
    state = IntervalJoinState(lower, upper)
    wm = NO_WATERMARK
    for (_, ts, side, _, _), (k, x) in rows:
        limit = ts if cut is None or ts < cut else cut
        if limit > wm:
            wm = limit
            state.expire(wm)
        for tp, left, right in state.add(side, k, ts, x, wm):
            r = (left, right) if fn is None else fn(left, right)
            if r is not None:
                yield "o", (tp, None, r)
    if export_state and cut is not None:
        state.expire(cut)
        for entry in state.entries():
            yield "s", (vertex, *entry)


def asof_join(backfill: Translator, t: AsofJoinTransform) -> StageOut:
    rows, bounded, cut = _sorted_rows(backfill, t)
    args = (t.tolerance, t.fn, t.how == "inner", cut, backfill.export_state, t.name)
    tagged = rows.mapPartitions(lambda it: asof_pass(it, *args))
    return _stage_out(backfill, t, tagged, bounded, cut, AsofJoinEntries)


def asof_pass(rows: Iterable[tuple], tolerance: int | None,
              fn: Callable[[Any, Any], Any] | None, inner: bool, cut: int | None,
              export_state: bool, vertex: str) -> Iterator[tuple]:
    """One Spark partition of an as-of join: ``("o", (tl, None, result))`` per left element
    the watermark completes (bounded: every one at the end) and, with a hand-off,
    ``("s", (vertex, key, entry))`` per key of the state at ``cut``."""
    state = AsofJoinState(tolerance)
    wm = NO_WATERMARK

    def release(limit: int) -> Iterator[tuple]:
        matched, _ = state.advance(limit)
        for tl, r in asof_results(matched, fn, inner):
            yield "o", (tl, None, r)
    for (_, ts, side, _, _), (k, x) in rows:
        limit = ts if cut is None or ts < cut else cut
        if limit > wm:
            wm = limit
            yield from release(wm)
        if side == LEFT:
            state.add_left(k, ts, x)
        else:
            state.add_right(k, ts, x)
    yield from release(END_OF_TIME if cut is None else cut)
    if export_state and cut is not None:
        for entry in state.entries():
            yield "s", (vertex, *entry)
