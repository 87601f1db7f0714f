"""The event-time stage of a backfill (``with_timestamps``, ``with_native_timestamps``): each
item gets its event time and the watermark the streaming job would have had just before it.

A source read in order (items, files, a member's map) gives every item the watermark of the
member's one processor reading it: the highest times of the Spark partitions before, then item
by item (``watermarks_before``). Over an unbounded source (Kafka) each record carries the
watermark of its own partition, capped at the hand-off watermark (see :func:`_capped`), and the
hand-off watermark is every partition's highest time less the lag, at the slowest partition.
"""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Iterator

from jetwake.engine.core.errors import PipelineError
from jetwake.engine.operations.watermark_policy import NO_WATERMARK, throttle
from jetwake.engine.pipeline.transforms import MapStatefulTransform, TimestampTransform
from jetwake.engine.processors.insert_watermarks import TimestampError
from jetwake.engine.backfill.chunks import chunked, watermarks_before
from jetwake.engine.backfill.stage_output import StageOut

if TYPE_CHECKING:
    from jetwake.engine.backfill.translate import Translator

__all__ = ["timestamps"]

_TS = itemgetter(0)
_ITEM = itemgetter(2)
_INTS = {int}


def timestamps(backfill: Translator, t: TimestampTransform) -> StageOut:
    """``with_timestamps`` / ``with_native_timestamps``: the stage's elements become
    ``(ts, wm, item)``, unreadable timestamps going to the side output or failing the run."""
    up = backfill.outs[id(t.upstream[0])]
    fn, name = t.timestamp_fn, t.name
    if fn is None and not up.timed:
        raise PipelineError(f"stage {t.name!r}: with_native_timestamps needs a source "
                            "whose records carry a time (Sources.kafka); use "
                            "with_timestamps(fn) for this source")
    counters = backfill.counters
    side = t.side_sink is not None
    timed_in = up.timed

    def read_times(chunk: list, counting: bool = True) -> tuple[list, list]:
        """The times and the items of a chunk's items whose timestamp can be read (the
        others go to the side output, or fail the run)."""
        if fn is None:
            return list(map(_TS, chunk)), list(map(_ITEM, chunk))
        xs = list(map(_ITEM, chunk)) if timed_in else chunk
        try:
            tss = list(map(fn, xs))
        except Exception:  # noqa: BLE001 - find the item below, then report or route it
            tss = None
        if tss is not None and set(map(type, tss)) == _INTS:
            return tss, xs
        tss, good = [], []
        bad = 0
        err: Exception | None
        for x in xs:
            try:
                ts = fn(x)
                ok = isinstance(ts, int) and not isinstance(ts, bool)
            except Exception as e:  # noqa: BLE001 - side output or a clear failure
                ok, err = False, e
            else:
                err = None
            if ok:
                tss.append(ts)
                good.append(x)
                continue
            if side:
                bad += 1
                continue
            raise TimestampError(
                f"stage {name!r}: cannot read the timestamp of item {x!r}"
                + (f": {type(err).__name__}: {err}" if err is not None else
                   f": timestamp_fn returned {ts!r}, not an int"))
        if bad and counting:
            counters.add({"bad_timestamps": bad})
        return tss, good

    def stamp_chunk(chunk: list) -> list:
        tss, xs = read_times(chunk)
        return list(zip(tss, repeat(None), xs))
    if side:
        def bad_items(it: Iterator) -> Iterator:
            for chunk in it:
                for e in chunk:
                    x = e[2] if timed_in else e
                    try:
                        v = fn(x)  # type: ignore[misc]
                        if isinstance(v, int) and not isinstance(v, bool):
                            continue
                    except Exception:  # noqa: BLE001
                        pass
                    yield x
        backfill.side[id(t)] = up.uncounted().mapPartitions(lambda it: chunked(bad_items(it)))
    # 0: no window downstream, and the member's watermark stage emits one watermark per
    # chunk of events instead of one per step of event time
    step = t.watermark_step(backfill.pipeline.transforms)
    policy_factory = t.policy_factory
    if up.unbounded:
        # each record with the watermark of its own partition from every record before it
        # (a record a later stage drops moves it, as in the member's source); capped below
        # at the hand-off watermark once every partition's highest time is known
        lag = policy_factory().lag

        def own(it: Iterator) -> Iterator:
            top = NO_WATERMARK
            for chunk in it:
                tss, xs = read_times(chunk)
                if tss:
                    wms, top = watermarks_before(tss, top, lag, step)
                    yield list(zip(tss, wms, xs))
        stamped = up.chunks(counters).mapPartitions(own, preservesPartitioning=True) \
            .persist()

        def top(i: int, it: Iterator) -> Iterator:
            best = max((e[0] for chunk in it for e in chunk), default=None)
            if best is not None:
                yield i, best
        tops = stamped.mapPartitionsWithIndex(top).collect()
        record = backfill.partition_tops.get(t.upstream[0].name)
        if record is not None and t.runs_in_source(backfill.pipeline.transforms):
            record(tops)
        # the hand-off watermark: every partition's highest time, less the lag, at the
        # slowest partition (what the streaming job's watermark is after reading as far);
        # a partition read nothing of holds it back, as it holds a streaming job's: none
        # of the windows closes here, all of them go on in the hand-off
        cut = NO_WATERMARK
        if tops and len(tops) == stamped.getNumPartitions():
            cut = throttle(min(ts for _, ts in tops) - lag, step or 1)
        backfill.cuts.append(cut)
        return StageOut(stamped.map(lambda chunk: _capped(chunk, cut),
                                    preservesPartitioning=True),
                        timestamped=True, unbounded=True, cut=cut)
    if not up.ordered or policy_factory().is_real_time:
        return up.then((stamp_chunk, None), timed=True, timestamped=True)
    # the watermark before each item, as the member's one processor reading the source in
    # order would have it: the highest times of the partitions before, then item by item
    # (a first pass reads only the times: cheaper than keeping the stamped items)
    def part_max(i: int, it: Iterator) -> Iterator:
        yield i, max((max(read_times(chunk, False)[0], default=None) for chunk in it
                      if chunk), key=_none_lowest, default=None)
    # the watermark after the last event: a ttl downstream evicts at it before the end
    want_last = any(isinstance(d, MapStatefulTransform) and d.ttl is not None
                    for d in t.downstream(backfill.pipeline.transforms))
    maxima = _local_maxima(up.local, fn, want_last) \
        if up.local is not None and not timed_in else None
    if maxima is None:
        maxima = dict(up.uncounted().mapPartitionsWithIndex(part_max).collect())
    before: dict[int, int | None] = {}
    top_so_far = None
    for i in sorted(maxima):
        before[i] = top_so_far
        if maxima[i] is not None and (top_so_far is None or maxima[i] > top_so_far):
            top_so_far = maxima[i]
    lag = policy_factory().lag

    def tag(i: int, it: Iterator) -> Iterator:
        top = before.get(i)
        top = NO_WATERMARK if top is None else top
        for chunk in it:
            tss, xs = read_times(chunk)
            if not tss:
                continue
            wms, top = watermarks_before(tss, top, lag, step)
            yield tss, wms, xs
    columns = up.chunks(counters).mapPartitionsWithIndex(tag, preservesPartitioning=True)
    last = None if top_so_far is None or not want_last else \
        (throttle(top_so_far - lag, step) if step else top_so_far - lag)
    return StageOut(columns.map(_rows, preservesPartitioning=True), timestamped=True,
                    ordered=True, columns=columns, last_watermark=last)


def _capped(chunk: list, cut: int) -> list:
    """Kafka records with the watermark of their own partition capped at the hand-off
    watermark ``cut``.

    This is the highest watermark a member could have had when the record arrived: the
    member's is the lowest over the partitions, never above the record's own partition's nor
    above another partition's last (the lowest of which is the hand-off watermark). So a record
    within the lag of its own partition is never late by it; on a topic of one partition it is
    exactly the member's watermark; and where the member's verdict depends on how far the other
    partitions were read, it is the verdict of the read order that is furthest ahead."""
    return [(ts, None if w is None else (w if w < cut else cut), x) for ts, w, x in chunk]
def _rows(columns: tuple) -> list:
    """A chunk of ``(ts, wm, item)`` from its three lists."""
    return list(zip(*columns))
def _local_maxima(parts: list, fn: Callable[[Any], Any] | None,
                  with_last: bool) -> dict | None:
    """The highest timestamp of each partition's items, read on the driver that holds them
    (cheaper than a Spark pass over them); None when a timestamp cannot be read there (the
    Spark pass then routes or reports the item). Unless ``with_last``, the last partition's
    is not read (only the partitions after one use its maximum): None."""
    if fn is None:
        return None
    maxima: dict = {len(parts) - 1: None}
    try:
        for i, part in enumerate(parts if with_last else parts[:-1]):
            tss = list(map(fn, part))
            if tss and set(map(type, tss)) != _INTS:
                return None
            maxima[i] = max(tss, default=None)
    except Exception:  # noqa: BLE001 - left to the Spark pass
        return None
    return maxima
def _none_lowest(x: Any) -> Any:
    return NO_WATERMARK if x is None else x
