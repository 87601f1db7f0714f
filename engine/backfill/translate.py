"""A pipeline's stages as Spark operations (docs/backfill.md, "What each stage becomes").

Every stage becomes RDD operations on chunks of elements (``chunks.py``): sources read into
lists, stateless stages run as a chain of functions over each list inside the task that reads
them, aggregations and the first stage of windows accumulate a whole chunk per call and
shuffle one partial accumulator per key (and frame) and task, and only the stages that order a
key's items (rolling aggregates, ``map_stateful``, sessions, operations without ``combine``)
go item by item. Nothing is collected to the driver except what a sink into a member writes
there and the state a hand-off snapshot holds. :func:`check_pipeline` refuses, before any
Spark job starts, what Spark cannot run.
"""

from __future__ import annotations

import pickle
from itertools import repeat
from operator import itemgetter
from typing import Any, Callable, Iterator

from jetwake.engine.core.errors import PipelineError
from jetwake.engine.core.partitioning import partition_of
from jetwake.engine.operations.watermark_policy import NO_WATERMARK, throttle
from jetwake.engine.pipeline.pipeline import Pipeline
from jetwake.engine.pipeline.spark_form import NotOnSpark
from jetwake.engine.pipeline.transforms import (
    AggregateTransform, DistinctTransform, HashJoinTransform, MapStatefulTransform,
    MergeTransform, RebalanceTransform, RollingAggregateTransform, SideSinkTransform,
    SinkTransform, SortTransform, SourceTransform, StatelessTransform, TimestampTransform,
    Transform, WindowAggregateTransform,
)
from jetwake.engine.processors.distinct import DistinctEntries
from jetwake.engine.processors.insert_watermarks import TimestampError
from jetwake.engine.processors.map_stateful import MapStatefulEntries
from jetwake.engine.processors.sliding_window import composite_operation
from jetwake.engine.backfill import keyed
from jetwake.engine.backfill.chunks import (
    CHUNK, Step, chunked, run_chain, stateless_chunk_function, watermarks_before,
)
from jetwake.engine.backfill.connector_forms import SparkReader, SparkWriter
from jetwake.engine.backfill.stage_output import StageOut

__all__ = ["check_pipeline", "Translator", "StageOut"]


def check_pipeline(pipeline: Pipeline, member: Any) -> None:
    """Fails with a PipelineError naming the stage when Spark cannot run ``pipeline``: a stage
    or a connector whose Spark form is :class:`NotOnSpark` (or a source or sink of the user's
    own, which has none), a member source or sink without ``member``."""
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"SparkRunner.run() expects a Pipeline, got {type(pipeline).__qualname__}")
    if not pipeline.transforms:
        raise PipelineError("the pipeline is empty: start it with read_from(source)")
    if not pipeline.sinks():
        raise PipelineError("the pipeline has no sink: end it with write_to(sink)")
    for t in pipeline.transforms:
        form = type(t).add_to_spark
        if isinstance(form, NotOnSpark):
            raise PipelineError(f"stage {t.name!r} is {form.reason}")
        if isinstance(t, (SourceTransform, SinkTransform)):
            _check_connector(t, member)
        if isinstance(t, WindowAggregateTransform) and t.wdef.is_session and len(t.ops) != 1:
            raise PipelineError(f"stage {t.name!r}: co-aggregation of session windows is not "
                                "supported; use sliding or tumbling windows")


def _check_connector(t: SourceTransform | SinkTransform, member: Any) -> None:
    """Fails when the source or sink of ``t`` has no Spark reader or writer (its connector
    says why with a NotOnSpark, or gives none: a connector of the user's own), or needs a
    member and there is none."""
    form: Any
    wanted: type
    if isinstance(t, SourceTransform):
        form, place = t.source.spark, "Source(spark=...)"
        wanted = SparkReader
        what = f"source stage {t.name!r} ({'unbounded ' if t.source.is_stream else ''}" \
               f"{t.source!r}) cannot be read by a backfill"
        uses = "reads a member's map"
    else:
        form, place = t.sink.spark, "Sink(spark=...)"
        wanted = SparkWriter
        what = f"sink stage {t.name!r} ({t.sink!r}) has no Spark form"
        uses = "writes into a member"
    if not isinstance(form, wanted):
        why = form.reason if isinstance(form, NotOnSpark) else \
            f"its connector gives it no Spark {wanted.__name__[5:].lower()} ({place})"
        raise PipelineError(f"{what}: {why}")
    if form.needs_member and member is None:
        raise PipelineError(f"{'source' if wanted is SparkReader else 'sink'} stage {t.name!r} "
                            f"{uses}: pass member= (a Member or a Client) to run()")


def _untimed(chunk: list) -> list:
    return [e[2] for e in chunk]


def _value(tagged: tuple) -> Any:
    return tagged[1]


def _is_state(tagged: tuple) -> bool:
    return tagged[0] == "s"


def _outputs(it: Iterator) -> Iterator[list]:
    """The chunks of a stateful stage's outputs from its tagged records."""
    return chunked(v for tag, v in it if tag == "o")


def read_source_bounds(pipeline: Pipeline, until: Any) -> dict[int, Any]:
    """What each source of ``pipeline`` will read (its reader's ``bounds``: the files, the
    Kafka offset ranges), found before Spark starts so that a wrong path, a missing topic,
    brokers that do not answer or an ``until`` before the start fail with their own message
    and no Spark session; by source transform id."""
    bounds: dict[int, Any] = {}
    read: set[str] = set()  # the topics the Kafka sources read
    for t in pipeline.transforms:
        if not isinstance(t, SourceTransform):
            continue
        reader = t.source.spark
        assert isinstance(reader, SparkReader)  # check_pipeline
        bounds[id(t)] = reader.bounds(until)
        read.update(reader.topics)
    if isinstance(until, dict):
        unknown = sorted(set(until) - read)
        if unknown:
            raise ValueError(f"until: offsets for topic(s) {unknown}, which no Kafka source of "
                             f"the pipeline reads (they read {sorted(read)})")
    return bounds


class Translator:
    """Builds the RDDs of one run; :meth:`run_sinks` starts the Spark jobs."""

    def __init__(self, sc: Any, pipeline: Pipeline, member: Any, bounds: dict[int, Any],
                 export_state: bool, counters: Any, partitions: int) -> None:
        self.sc = sc
        self.pipeline = pipeline
        self.member = member
        self.bounds = bounds  # read_source_bounds()
        self.export_state = export_state
        self.counters = counters
        self.partitions = max(1, partitions)
        self.outs: dict[int, StageOut] = {}
        self.side: dict[int, Any] = {}      # owner transform id -> RDD of its side output
        self.state_rdds: list = []          # RDDs of (vertex, key, value) for the hand-off
        self.driver_state: list = []        # (vertex, key, value) known on the driver
        self.offsets: dict[str, dict[int, int]] = {}
        self.cuts: list[int] = []
        self._partition_tops: dict[str, Callable[[list], None]] = {}  # on_partition_tops
        self.window_stages = 0
        self.sink_counts: dict[str, int] = {}
        self._consumers: dict[int, int] = {}
        for t in pipeline.transforms:
            # a stage with a side output (late or bad events) reads its input a second time
            reads = 2 if getattr(t, "side_sink", None) is not None else 1
            for u in t.upstream:
                self._consumers[id(u)] = self._consumers.get(id(u), 0) + reads

    # --- helpers ---------------------------------------------------------------------------

    def _out(self, t: Transform, out: StageOut) -> StageOut:
        key = f"out:{t.name}"
        if not (out.chain and out.chain[-1][1] == key):
            out = out.then((None, key))  # counted per chunk where it is read
        if self._consumers.get(id(t), 0) > 1:
            # read by several stages: computed (and counted) once
            out = StageOut(out.chunks(self.counters).persist(), local=out.local,
                           **out.flags())
        self.outs[id(t)] = out
        return out

    def _split(self, name: str, tagged: Any) -> Any:
        """The chunks of a stateful stage's output from its tagged records, keeping its state
        records for the hand-off."""
        if self.export_state:
            tagged = tagged.persist()
            self.state_rdds.append(tagged.filter(_is_state).map(_value))
        return tagged.mapPartitions(_outputs, preservesPartitioning=True)

    def _positions(self, up: StageOut) -> Any:
        """``((partition, index), element)`` per element: its position in the source order."""
        def pos(i: int, it: Iterator) -> Iterator:
            j = 0
            for chunk in it:
                for e in chunk:
                    yield (i, j), e
                    j += 1
        return up.chunks(self.counters).mapPartitionsWithIndex(pos)

    def _by_key_sorted(self, up: StageOut, key_fn: Callable[[Any], Any] | None) -> Any:
        """Each key's elements in one partition, in the order a member's processor for the key
        would get them; keys placed by jetwake's own partitioning.

        A source read in order gives them in that order (partition by partition, each in
        order), as the member's one source processor does. Kafka partitions are read side by
        side: each partition's records stay in offset order, and the partitions are merged by
        how far each has got in event time (the highest record time read so far in it), then
        by partition, as a member reading them at the same pace would; a key in one partition
        sees exactly its offset order."""
        n = self.partitions
        timed = up.timed
        by_progress = up.timestamped and not up.ordered

        def pid(e: Any) -> int:
            return 0 if key_fn is None else partition_of(key_fn(e[2] if timed else e)) % n

        def rows(i: int, it: Iterator) -> Iterator:
            j = 0
            for chunk in it:
                for e in chunk:
                    yield (pid(e), i, j), e
                    j += 1

        def rows_by_progress(i: int, it: Iterator) -> Iterator:
            j = 0
            top = NO_WATERMARK
            for chunk in it:
                for e in chunk:
                    if e[0] > top:
                        top = e[0]
                    yield (pid(e), top, i, j), e
                    j += 1
        return up.chunks(self.counters).mapPartitionsWithIndex(
            rows_by_progress if by_progress else rows) \
            .repartitionAndSortWithinPartitions(n, partitionFunc=_first)

    def _results(self, rdd: Any) -> Any:
        """Chunks of a stage's results, one RDD element per result."""
        return rdd.mapPartitions(chunked, preservesPartitioning=True)

    # --- building ----------------------------------------------------------------------------

    def build(self) -> None:
        """Builds every stage's RDDs: each transform adds its own Spark form
        (``Transform.add_to_spark``, which calls back one of the methods below)."""
        for t in self.pipeline.transforms:
            out = t.add_to_spark(self)
            if out is not None:
                self._out(t, out)

    def sink(self, t: SinkTransform) -> None:
        """A sink's Spark form: written by :meth:`run_sinks` once every stage is built (a side
        output's sink is fed by its owner's late or bad events)."""

    def run_sinks(self) -> None:
        """Starts one Spark job per sink, written by its connector's Spark writer (what a
        member writes runs on the driver, chunk by chunk; the other sinks write inside the
        tasks)."""
        for t in self.pipeline.transforms:
            if not isinstance(t, SinkTransform):
                continue
            if isinstance(t, SideSinkTransform):
                rdd = self.side.get(id(t.upstream[0]))
                if rdd is None:
                    continue
            else:
                up = self.outs[id(t.upstream[0])]
                rdd = up.chunks(self.counters)
                if up.timed:
                    rdd = rdd.map(_untimed, preservesPartitioning=True)
            writer = t.sink.spark
            assert isinstance(writer, SparkWriter)  # check_pipeline
            self.sink_counts[t.name] = writer.write(self, t, rdd)

    # --- sources -----------------------------------------------------------------------------

    def source(self, t: SourceTransform) -> StageOut:
        """A source's stage, as its connector's Spark reader reads it."""
        reader = t.source.spark
        assert isinstance(reader, SparkReader)  # check_pipeline
        return reader.read(self, t, self.bounds.get(id(t)))

    def local_items(self, data: list) -> StageOut:
        """A stage of items the driver holds (a list, a member's map), in order: up to a slice
        per core, partition ``i`` holding slice ``i``, each chunk pickled on its own."""
        slices = max(1, min(self.partitions, len(data) // 1000 or 1))
        per = -(-len(data) // slices) if data else 1
        parts = [data[s:s + per] for s in range(0, len(data), per)] or [[]]
        blobs = [[_dumps(c) for c in chunked(part)] for part in parts]
        rdd = self.sc.parallelize(blobs, len(blobs)).flatMap(_loads_all,
                                                             preservesPartitioning=True)
        return StageOut(rdd, ordered=True, local=parts)

    def file_runs(self, paths: list[str],
                  read_path: Callable[[str], Iterator[list]]) -> StageOut:
        """A stage of files read in order, ``read_path`` giving the chunks of one file: a task
        per core, each reading a run of files of about the same bytes (a Spark task costs
        about 35 ms of the JVM's and the worker's time, a file of a million words 0.2 s)."""
        if not paths:
            return StageOut(self.sc.emptyRDD(), ordered=True)

        def read_all(group: list) -> Iterator[list]:
            for path in group:
                yield from read_path(path)
        groups = _file_groups(paths, self.partitions)
        rdd = self.sc.parallelize(groups, len(groups)).flatMap(read_all,
                                                               preservesPartitioning=True)
        return StageOut(rdd, ordered=True)

    def task_counter(self) -> Callable[[str, int], None]:
        """A function that adds to one of the run's counters from inside a Spark task."""
        counters = self.counters

        def count(key: str, n: int) -> None:
            if n:
                counters.add({key: n})
        return count

    def on_partition_tops(self, source: SourceTransform,
                          record: Callable[[list], None]) -> None:
        """Has ``record`` called with the highest event time of each of the source's
        partitions (``(Spark partition, time)`` pairs) when a timestamp stage runs inside the
        source, so its hand-off entry resumes each partition's watermark where the backfill
        left it."""
        self._partition_tops[source.name] = record

    # --- stateless ---------------------------------------------------------------------------

    def stateless(self, t: StatelessTransform) -> StageOut:
        up = self.outs[id(t.upstream[0])]
        fn = stateless_chunk_function(t.op, t.fn, up.timed, t.name)
        return up.then((fn, f"out:{t.name}"))

    def rebalance(self, t: RebalanceTransform) -> StageOut:
        return self.outs[id(t.upstream[0])].then((None, None))

    def merge(self, t: MergeTransform) -> StageOut:
        ups = [self.outs[id(u)] for u in t.upstream]
        timed = all(u.timed for u in ups)
        rdds = []
        for u in ups:
            rdd = u.chunks(self.counters)
            if u.timed and not timed:  # a timed input merged with plain ones: items only
                rdd = rdd.map(_untimed, preservesPartitioning=True)
            elif timed and len(ups) > 1:
                rdd = rdd.map(_watermark_unknown, preservesPartitioning=True)
            rdds.append(rdd)
        cuts = [u.cut for u in ups if u.cut is not None]
        return StageOut(self.sc.union(rdds), timed=timed,
                        timestamped=all(u.timestamped for u in ups),
                        unbounded=any(u.unbounded for u in ups), cut=min(cuts) if cuts else None)

    # --- event time --------------------------------------------------------------------------

    def timestamps(self, t: TimestampTransform) -> StageOut:
        up = self.outs[id(t.upstream[0])]
        fn, name = t.timestamp_fn, t.name
        if fn is None and not up.timed:
            raise PipelineError(f"stage {t.name!r}: with_native_timestamps needs a source "
                                "whose records carry a time (Sources.kafka); use "
                                "with_timestamps(fn) for this source")
        counters = self.counters
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
            self.side[id(t)] = up.uncounted().mapPartitions(lambda it: chunked(bad_items(it)))
        # 0: no window downstream, and the member's watermark stage emits one watermark per
        # chunk of events instead of one per step of event time
        step = t.watermark_step(self.pipeline.transforms)
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
            record = self._partition_tops.get(t.upstream[0].name)
            if record is not None and t.runs_in_source(self.pipeline.transforms):
                record(tops)
            # the hand-off watermark: every partition's highest time, less the lag, at the
            # slowest partition (what the streaming job's watermark is after reading as far);
            # a partition read nothing of holds it back, as it holds a streaming job's: none
            # of the windows closes here, all of them go on in the hand-off
            cut = NO_WATERMARK
            if tops and len(tops) == stamped.getNumPartitions():
                cut = throttle(min(ts for _, ts in tops) - lag, step or 1)
            self.cuts.append(cut)
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
                        for d in t.downstream(self.pipeline.transforms))
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

    # --- keyed and aggregating ---------------------------------------------------------------

    def aggregate(self, t: AggregateTransform) -> StageOut:
        up = self.outs[id(t.upstream[0])]
        op, key_fn = t.op, t.key_fn
        create, combine, finish = op.create, op.combine, op.finish
        timed = up.timed
        chunks = up.chunks(self.counters)
        if op.can_combine and key_fn is not None:
            # each task accumulates its chunks per key (one accumulate_grouped per chunk) and
            # shuffles one partial accumulator per key; the partials are combined by key
            def partial(it: Iterator) -> Iterator:
                table: dict = {}
                for chunk in it:
                    items = [e[2] for e in chunk] if timed else chunk
                    op.accumulate_grouped(table, map(key_fn, items), items)
                return iter(table.items())
            res = chunks.mapPartitions(partial).reduceByKey(combine, self.partitions)
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
            pairs = chunks.mapPartitions(partial_all).union(self.sc.parallelize([(0, marker)], 1))

            def first(a: Any) -> Any:
                return create() if isinstance(a, _EmptyMarker) else a

            def add(a: Any, b: Any) -> Any:
                return a if isinstance(b, _EmptyMarker) else combine(a, b)

            def merge(a: Any, b: Any) -> Any:
                return combine(a, b)
            res = pairs.combineByKey(first, add, merge, 1)
            return StageOut(res.map(lambda ka: [finish(ka[1])]))
        # no combine: every item of a key in one task, in order
        accumulate = op.accumulate
        rows = self._by_key_sorted(up, key_fn)

        def agg(it: Iterator) -> Iterator:
            accs: dict = {}
            for _, e in it:
                x = e[2] if timed else e
                k = key_fn(x) if key_fn is not None else None
                accs[k] = accumulate(accs[k] if k in accs else create(), x)
            for k, a in accs.items():
                yield (k, finish(a)) if key_fn is not None else finish(a)
        res = rows.mapPartitions(agg)
        if key_fn is None:
            marker = _EmptyMarker()
            res = res.map(lambda r: (0, r)).union(self.sc.parallelize([(0, marker)], 1)) \
                .groupByKey(1).flatMap(lambda kv: [r for r in kv[1]
                                                   if not isinstance(r, _EmptyMarker)]
                                       or [finish(create())])
        return StageOut(self._results(res))

    def distinct(self, t: DistinctTransform) -> StageOut:
        up = self.outs[id(t.upstream[0])]
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
        firsts = up.chunks(self.counters).mapPartitionsWithIndex(firsts_of_task) \
            .reduceByKey(lambda a, b: a if a[0] <= b[0] else b, self.partitions)
        if self.export_state:
            name = t.name
            self.state_rdds.append(firsts.map(lambda kv: (name, *DistinctEntries.seen(kv[0]))))
        return StageOut(self._results(firsts.map(lambda kv: kv[1][1])))

    def sort(self, t: SortTransform) -> StageOut:
        up = self.outs[id(t.upstream[0])]
        key, reverse, timed = t.key, t.reverse, up.timed
        rows = self._positions(up)

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
        return StageOut(self._results(ordered.map(item)), ordered=True)

    def hash_join(self, t: HashJoinTransform) -> StageOut:
        stream = self.outs[id(t.upstream[0])]
        build = self.outs[id(t.upstream[1])]
        key_fn, bk, bv, join_fn, outer = (t.key_fn, t.build_key_fn, t.build_value_fn,
                                          t.join_fn, t.outer)
        s_timed, b_timed = stream.timed, build.timed
        b = self._positions(build).map(
            lambda row: (lambda x: (bk(x), (row[0], bv(x))))(row[1][2] if b_timed else row[1]))
        s = self._positions(stream).map(
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
        return StageOut(self._results(s.cogroup(b, self.partitions).flatMap(join)))

    def rolling_aggregate(self, t: RollingAggregateTransform) -> StageOut:
        up = self.outs[id(t.upstream[0])]
        op, key_fn, name, export, timed = t.op, t.key_fn, t.name, self.export_state, up.timed
        rows = self._by_key_sorted(up, key_fn)
        tagged = rows.mapPartitions(lambda it: keyed.rolling(it, op, key_fn, name, export,
                                                             timed))
        return StageOut(self._split(name, tagged), timed=timed, timestamped=up.timestamped,
                        unbounded=up.unbounded, cut=up.cut, last_watermark=up.last_watermark)

    def map_stateful(self, t: MapStatefulTransform) -> StageOut:
        up = self.outs[id(t.upstream[0])]
        counters, timed = self.counters, up.timed
        args = (t.create_fn, t.map_fn, t.key_fn, up.timestamped, t.ttl, t.on_evict, t.name,
                not up.unbounded, up.cut, self.export_state, up.last_watermark)

        def late(n: int) -> None:
            counters.add({"late_events": n})
        rows = self._by_key_sorted(up, t.key_fn)
        tagged = rows.mapPartitions(lambda it: keyed.map_stateful(it, *args, late=late,
                                                                  timed=timed))
        out = self._split(t.name, tagged)
        if self.export_state and up.unbounded and up.cut is None:
            self.driver_state.append((t.name, *MapStatefulEntries.watermark(NO_WATERMARK)))
        return StageOut(out, timed=timed, timestamped=up.timestamped, unbounded=up.unbounded,
                        cut=up.cut, last_watermark=up.last_watermark)

    # --- windows -----------------------------------------------------------------------------

    def window_aggregate(self, t: WindowAggregateTransform) -> StageOut:
        ups = [self.outs[id(u)] for u in t.upstream]
        for u, up in zip(t.upstream, ups):
            if not up.timestamped:
                raise PipelineError(f"stage {t.name!r}: its input {u.name!r} has no "
                                    "timestamps; call with_timestamps() before windowing")
        self.window_stages += 1
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
        counters = self.counters
        export = self.export_state and cut is not None
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
            self.side[id(t)] = lates[0] if len(lates) == 1 else self.sc.union(lates)
        keyed_stage = key_fns is not None
        two_stage = not session and all(op.can_combine for op in ops) \
            and (not wdef.early_results_period or len(ops) > 1)
        if two_stage:
            # each task accumulates its events per (key, frame), a chunk per call; the partial
            # accumulators go by key to the task that combines them and emits the key's windows
            n = len(ops)
            op = ops[0] if n == 1 else composite_operation(ops)
            shuffled = self.partitions
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
            pairs = parts[0] if n == 1 else self.sc.union(parts)
            combine = op.combine
            assert combine is not None  # two_stage: every op can combine

            def windows(it: Iterator) -> Iterator:
                for k, frames in keyed.merge_frames(it, ops, combine).items():
                    yield from keyed.frame_windows(k, frames, op, size, slide,
                                                   keyed_stage, cut, name, n, export)
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
            rows = self._by_key_sorted(ups[0].then((drop_late, None)), kf)
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
                self.driver_state.append((vertex, k, v))
        results = self._split(name, tagged)
        if t.post is not None:
            post = t.post
            results = results.map(lambda chunk: [y for r in chunk for y in post(r)])
        return StageOut(results, unbounded=unbounded, cut=wm)


class _EmptyMarker:
    """Stands for "no items" in a keyless aggregation (its result is then that of create())."""


_MISSING = object()
_TS = itemgetter(0)
_ITEM = itemgetter(2)
_INTS = {int}


def _watermark_unknown(chunk: list) -> list:
    """Timed elements without the watermark they met. Where several timestamped inputs are
    merged, the member's watermark is the lowest of theirs, and what that was when an event
    arrived depends on how the inputs interleaved, which a backfill cannot know: as for Kafka
    partitions, no event is judged late (a co-aggregating window does not read them instead:
    ``frame_partials(judge_late=False)``)."""
    return [(t, None, x) for t, _, x in chunk]


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


def _file_groups(paths: list[str], n: int) -> list[list[str]]:
    """``paths`` (in order) cut into at most ``n`` runs of about the same number of bytes."""
    import os
    sizes = []
    for path in paths:
        try:
            sizes.append(max(1, os.path.getsize(path)))
        except OSError:  # not visible here (a cluster's own storage): count it as one
            sizes.append(1)
    n = max(1, min(n, len(paths)))
    total = sum(sizes)
    groups: list[list[str]] = [[]]
    done = 0
    for path, size in zip(paths, sizes):
        # a new run when this file lies mostly past the current run's share of the bytes
        if groups[-1] and len(groups) < n and done + size / 2 >= total * len(groups) / n:
            groups.append([])
        groups[-1].append(path)
        done += size
    return groups


def _dumps(chunk: list) -> bytes:
    """A chunk pickled (by value, through cloudpickle, when plain pickle cannot)."""
    try:
        return pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - lambdas, local classes: what Spark itself pickles
        import cloudpickle
        return cloudpickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL)


def _loads_all(blobs: list) -> Iterator[list]:
    return map(pickle.loads, blobs)


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


def _first(k: tuple) -> int:
    return k[0]


def _own_number(k: int) -> int:
    return k
