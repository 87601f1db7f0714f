"""The aggregating stages of a backfill: ``aggregate`` (keyed and keyless), ``distinct``,
``sort`` and ``hash_join``, as Spark's own shuffles (``reduceByKey``, ``sortBy``,
``cogroup``), each task accumulating a chunk per call where the operation combines."""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, Any, Iterator

from jetwake.engine.pipeline.transforms import (
    AggregateTransform, DistinctTransform, HashJoinTransform, SortTransform,
)
from jetwake.engine.core.functions import is_identity
from jetwake.engine.processors.aggregation import NO_ACC, accumulate_chunk
from jetwake.engine.processors.distinct import DistinctEntries
from jetwake.engine.backfill.chunks import CHUNK, chunked
from jetwake.engine.backfill.stage_output import StageOut

if TYPE_CHECKING:
    from jetwake.engine.backfill.translate import Translator

__all__ = ["aggregate", "distinct", "sort", "hash_join"]

_MISSING = object()


def aggregate(backfill: Translator, t: AggregateTransform) -> StageOut:
    """``aggregate``: partial accumulators per task combined by key, or (no combine) a pass
    per key in arrival order by the member's one-stage step (``accumulate_chunk``); keyless,
    one result even of no items."""
    up = backfill.outs[id(t.upstream[0])]
    op, key_fn = t.op, t.key_fn
    create, combine, finish = op.create, op.combine, op.finish
    timed = up.timed
    chunks = up.chunks(backfill.counters)
    if op.can_combine and key_fn is not None:
        # each task accumulates its chunks per key (one accumulate_grouped per chunk) and
        # shuffles one partial accumulator per key; the partials are combined by key
        def partial(it: Iterator) -> Iterator:
            table: dict = {}
            for chunk in it:
                items = [e[2] for e in chunk] if timed else chunk
                op.accumulate_grouped(table, map(key_fn, items), items)
            return iter(table.items())
        res = chunks.mapPartitions(partial).reduceByKey(combine, backfill.partitions)
        return StageOut(res.mapPartitions(
            lambda it: chunked((k, finish(a)) for k, a in it)))
    if op.can_combine:
        assert combine is not None
        # keyless: one partial per task that saw items, and a marker that makes the
        # result of no items that of create()
        def partial_all(it: Iterator) -> Iterator:
            acc = _MISSING
            for chunk in it:
                items = [e[2] for e in chunk] if timed else chunk
                acc = op.accumulate_all(create() if acc is _MISSING else acc, items)
            if acc is not _MISSING:
                yield 0, acc
        marker = _EmptyMarker()
        pairs = chunks.mapPartitions(partial_all).union(backfill.sc.parallelize([(0, marker)], 1))

        def first(a: Any) -> Any:
            return create() if isinstance(a, _EmptyMarker) else a

        def add(a: Any, b: Any) -> Any:
            return a if isinstance(b, _EmptyMarker) else combine(a, b)

        def merge(a: Any, b: Any) -> Any:
            return combine(a, b)
        res = pairs.combineByKey(first, add, merge, 1)
        return StageOut(res.map(lambda ka: [finish(ka[1])]))
    # no combine: every item of a key in one task, in order, accumulated a chunk at a time as
    # the member's one-stage processor does
    rows = backfill.by_key_sorted(up, key_fn)
    identity_key = key_fn is not None and is_identity(key_fn)

    def agg(it: Iterator) -> Iterator:
        table: dict = {}
        acc = NO_ACC
        while True:
            items = [e[2] if timed else e for _, e in islice(it, CHUNK)]
            if not items:
                break
            acc = accumulate_chunk(op, key_fn, items, table, acc, identity_key)
        if key_fn is None:
            if acc is not NO_ACC:
                yield finish(acc)
            return
        for k, a in table.items():
            yield k, finish(a)
    res = rows.mapPartitions(agg)
    if key_fn is None:
        marker = _EmptyMarker()
        res = res.map(lambda r: (0, r)).union(backfill.sc.parallelize([(0, marker)], 1)) \
            .groupByKey(1).flatMap(lambda kv: [r for r in kv[1]
                                               if not isinstance(r, _EmptyMarker)]
                                   or [finish(create())])
    return StageOut(backfill.results(res))

def distinct(backfill: Translator, t: DistinctTransform) -> StageOut:
    """``distinct``: the first item of each key in source order."""
    up = backfill.outs[id(t.upstream[0])]
    key_fn, timed = t.key_fn, up.timed

    def firsts_of_task(i: int, it: Iterator) -> Iterator:
        # the first item of each key in this task, with its position
        seen: dict = {}
        j = 0
        for chunk in it:
            for e in chunk:
                x = e[2] if timed else e
                k = key_fn(x) if key_fn is not None else x
                if k not in seen:
                    seen[k] = ((i, j), x)
                j += 1
        return iter(seen.items())
    # the first item of each key in source order, as the member keeps the first it sees
    firsts = up.chunks(backfill.counters).mapPartitionsWithIndex(firsts_of_task) \
        .reduceByKey(lambda a, b: a if a[0] <= b[0] else b, backfill.partitions)
    if backfill.export_state:
        name = t.name
        backfill.state_rdds.append(firsts.map(lambda kv: (name, *DistinctEntries.seen(kv[0]))))
    return StageOut(backfill.results(firsts.map(lambda kv: kv[1][1])))

def sort(backfill: Translator, t: SortTransform) -> StageOut:
    """``sort``: ``sortBy``, equal items in source order."""
    up = backfill.outs[id(t.upstream[0])]
    key, reverse, timed = t.key, t.reverse, up.timed
    rows = backfill.positions(up)

    def item(row: tuple) -> Any:
        return row[1][2] if timed else row[1]
    # equal items keep their source order, as Python's stable sort does (also reversed)
    if reverse:
        def sort_key(row: tuple) -> Any:
            x = item(row)
            i, j = row[0]
            return (key(x) if key is not None else x), (-i, -j)
        ordered = rows.sortBy(sort_key, ascending=False)
    else:
        ordered = rows.sortBy(lambda row: (key(item(row)) if key is not None
                                           else item(row), row[0]))
    return StageOut(backfill.results(ordered.map(item)), ordered=True)

def hash_join(backfill: Translator, t: HashJoinTransform) -> StageOut:
    """``hash_join``: ``cogroup`` of the stream and the build side, each in source order."""
    stream = backfill.outs[id(t.upstream[0])]
    build = backfill.outs[id(t.upstream[1])]
    key_fn, bk, bv, join_fn, outer = (t.key_fn, t.build_key_fn, t.build_value_fn,
                                      t.join_fn, t.outer)
    s_timed, b_timed = stream.timed, build.timed
    b = backfill.positions(build).map(
        lambda row: (lambda x: (bk(x), (row[0], bv(x))))(row[1][2] if b_timed else row[1]))
    s = backfill.positions(stream).map(
        lambda row: (lambda x: (key_fn(x), (row[0], x)))(row[1][2] if s_timed else row[1]))

    def join(kv: tuple) -> Iterator:
        _, (items, values) = kv
        matches = [v for _, v in sorted(values, key=lambda pv: pv[0])]
        for _, x in sorted(items, key=lambda px: px[0]):
            if matches:
                for m in matches:
                    r = join_fn(x, m)
                    if r is not None:
                        yield r
            elif outer:
                r = join_fn(x, None)
                if r is not None:
                    yield r
    return StageOut(backfill.results(s.cogroup(b, backfill.partitions).flatMap(join)))


class _EmptyMarker:
    """Stands for "no items" in a keyless aggregation (its result is then that of create())."""
