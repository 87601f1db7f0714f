"""The window stage of a backfill: sliding, tumbling and session windows.

Operations that combine run in two stages, as on a member: each task accumulates its chunks
per key and frame (``keyed.frame_partials``), and one record per shuffle partition takes the
frames to the task that combines them and emits the windows (``keyed.frame_windows``, by
the member's combining rule); the others, and sessions, take a pass per key in arrival order.
With a hand-off the windows still open at the hand-off watermark go to the snapshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from jetwake.engine.core.errors import PipelineError
from jetwake.engine.pipeline.transforms import WindowAggregateTransform
from jetwake.engine.processors.sliding_window import composite_operation
from jetwake.engine.backfill import keyed
from jetwake.engine.backfill.chunks import chunked
from jetwake.engine.backfill.stage_output import StageOut

if TYPE_CHECKING:
    from jetwake.engine.backfill.translate import Translator

__all__ = ["window_aggregate"]


def window_aggregate(backfill: Translator, t: WindowAggregateTransform) -> StageOut:
    """Windows of one or several inputs (co-aggregation), their late events dropped or sent
    to the side output."""
    ups = [backfill.outs[id(u)] for u in t.upstream]
    for u, up in zip(t.upstream, ups):
        if not up.timestamped:
            raise PipelineError(f"stage {t.name!r}: its input {u.name!r} has no "
                                "timestamps; call with_timestamps() before windowing")
    backfill.window_stages += 1
    # several inputs: the member's watermark is the lowest of theirs, and what it was when
    # an event arrived depends on how they interleaved, which a backfill cannot know: no
    # event is judged late (merge() drops the watermarks instead)
    judge_late = len(ups) == 1
    wdef, ops, key_fns, name = t.wdef, t.ops, t.key_fns, t.name
    session = wdef.is_session
    slide, size, gap = wdef.slide, wdef.size, wdef.gap
    unbounded = any(u.unbounded for u in ups)
    cuts = [u.cut for u in ups if u.cut is not None]
    wm = min(cuts) if unbounded and cuts else None
    # a window stage's watermark: the frame the watermark is in (sliding), itself (session)
    cut = None if wm is None else (wm if session else wm - wm % slide)
    counters = backfill.counters
    export = backfill.export_state and cut is not None
    # an event is late when it is before the watermark's frame (sliding) or the watermark
    # (session) it met
    floor = 1 if session else slide

    def late(n: int) -> None:
        counters.add({"late_events": n})

    if t.side_sink is not None and judge_late:
        def late_items(it: Iterator) -> Iterator:
            for chunk in it:
                for ts, w, x in chunk:
                    if w is not None and ts < w - w % floor:
                        yield x
        lates = [up.uncounted().mapPartitions(lambda it: chunked(late_items(it)))
                 for up in ups]
        backfill.side[id(t)] = lates[0] if len(lates) == 1 else backfill.sc.union(lates)
    keyed_stage = key_fns is not None
    two_stage = t.two_stage
    if two_stage:
        # each task accumulates its events per (key, frame), a chunk per call; the partial
        # accumulators go by key to the task that combines them and emits the key's windows
        n = len(ops)
        op = ops[0] if n == 1 else composite_operation(ops)
        shuffled = backfill.partitions
        from pyspark.rdd import portable_hash
        parts = []
        for i, up in enumerate(ups):
            kf = key_fns[i] if key_fns is not None else None
            columnar = up.columns is not None
            if columnar:  # counted as the chain would count the rows
                keys = tuple(k for _, k in up.chain if k is not None)
                chunks = up.columns.mapPartitions(
                    lambda it, keys=keys: _count_columns(it, keys, counters),
                    preservesPartitioning=True)
            else:
                chunks = up.chunks(counters)
            parts.append(chunks.mapPartitions(
                lambda it, kf=kf, i=i, columnar=columnar: keyed.frame_partials(
                    it, ops[i], kf, slide, i, n, late, columnar, shuffled,
                    portable_hash, judge_late)))
        pairs = parts[0] if n == 1 else backfill.sc.union(parts)

        def windows(it: Iterator) -> Iterator:
            return keyed.frame_windows(it, ops, op, size, slide, keyed_stage, cut, name,
                                       export)
        # the records are already one per partition of the shuffle, numbered
        tagged = pairs.partitionBy(shuffled, _own_number).mapPartitions(windows)
    else:
        op = ops[0]
        kf = key_fns[0] if key_fns is not None else None

        def drop_late(chunk: list) -> list:
            kept = [e for e in chunk if e[1] is None or e[0] >= e[1] - e[1] % floor]
            if len(kept) < len(chunk):
                late(len(chunk) - len(kept))
            return kept
        rows = backfill.by_key_sorted(ups[0].then((drop_late, None)), kf)
        if session:
            tagged = rows.mapPartitions(lambda it: keyed.sessions(
                it, op, kf, gap, cut, name, export))
        else:
            tagged = rows.mapPartitions(lambda it: keyed.sliding_no_combine(
                it, op, kf, size, slide, cut, name, export))
    if export:
        assert cut is not None  # export
        for vertex, k, v in keyed.window_watermark_entries(name, cut, slide, two_stage,
                                                           session):
            backfill.driver_state.append((vertex, k, v))
    results = backfill.split(name, tagged)
    if t.post is not None:
        post = t.post
        results = results.map(lambda chunk: [y for r in chunk for y in post(r)])
    return StageOut(results, unbounded=unbounded, cut=wm)


def _count_columns(chunks: Iterator, keys: tuple, counters: Any) -> Iterator:
    """Chunks of ``(times, watermarks, items)`` passed on, each counted under ``keys``."""
    n = 0
    try:
        for chunk in chunks:
            n += len(chunk[0])
            yield chunk
    finally:
        if n and keys:
            counters.add({k: n for k in keys})
def _own_number(k: int) -> int:
    return k
