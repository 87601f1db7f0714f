"""A pipeline's stages as Spark operations (docs/backfill.md, "What each stage becomes").

Every stage becomes RDD operations on chunks of elements (``chunks.py``): sources read into
lists, stateless stages run as a chain of functions over each list inside the task that reads
them, aggregations and the first stage of windows accumulate a whole chunk per call and
shuffle one partial accumulator per key (and frame) and task, and only the stages that order a
key's items (rolling aggregates, ``map_stateful``, sessions, operations without ``combine``)
go item by item. Nothing is collected to the driver except what a sink into a member writes
there and the state a hand-off snapshot holds. :func:`check_pipeline` refuses, before any
Spark job starts, what Spark cannot run.

The :class:`Translator` builds one run: each transform's ``add_to_spark`` calls its builder
(its methods, the larger ones kept in ``event_time.py``, ``aggregations.py`` and
``windows.py``), and each source's and sink's connector reads and writes through its own
``SparkReader`` and ``SparkWriter`` (``connector_forms.py``).
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Iterator

from jetwake.engine.core.errors import PipelineError
from jetwake.engine.core.partitioning import partition_of
from jetwake.engine.operations.watermark_policy import NO_WATERMARK
from jetwake.engine.pipeline.pipeline import Pipeline
from jetwake.engine.pipeline.spark_form import NotOnSpark
from jetwake.engine.pipeline.transforms import (
    MapStatefulTransform, MergeTransform, RebalanceTransform, RollingAggregateTransform,
    JoinTableTransform, MapUsingMapTransform,
    SideSinkTransform, SinkTransform, SourceTransform, StatelessTransform, Transform,
)
from jetwake.engine.processors.map_stateful import MapStatefulEntries
from jetwake.engine.processors.map_lookup import MapLookup
from jetwake.engine.processors.table_join import TableEntries, TableJoinRule, apply_changes
from jetwake.engine.backfill import aggregations, event_time, keyed, windows
from jetwake.engine.backfill import joins
from jetwake.engine.pipeline.transforms import AsofJoinTransform, IntervalJoinTransform
from jetwake.engine.backfill.chunks import chunked, stateless_chunk_function
from jetwake.engine.backfill.connector_forms import SparkReader, SparkWriter
from jetwake.engine.backfill.stage_output import StageOut

__all__ = ["check_pipeline", "release_source_bounds", "Translator", "StageOut"]


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


def release_source_bounds(pipeline: Pipeline, bounds: dict[int, Any]) -> None:
    """Gives each source's reader back its bounds once the run has ended (see
    ``SparkReader.release``)."""
    for t in pipeline.transforms:
        if isinstance(t, SourceTransform) and id(t) in bounds:
            reader = t.source.spark
            assert isinstance(reader, SparkReader)
            reader.release(bounds[id(t)])


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
        self.partition_tops: dict[str, Callable[[list], None]] = {}  # on_partition_tops
        self.window_stages = 0
        self.sink_counts: dict[str, int] = {}
        self._consumers: dict[int, int] = {}
        for t in pipeline.transforms:
            # a stage with a side output (late or bad events) reads its input a second time
            reads = 2 if t.side_sink is not None else 1
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

    def split(self, name: str, tagged: Any) -> Any:
        """The chunks of a stateful stage's output from its tagged records, keeping its state
        records for the hand-off."""
        if self.export_state:
            tagged = tagged.persist()
            self.state_rdds.append(tagged.filter(_is_state).map(_value))
        return tagged.mapPartitions(_outputs, preservesPartitioning=True)

    def positions(self, up: StageOut) -> Any:
        """``((partition, index), element)`` per element: its position in the source order."""
        def pos(i: int, it: Iterator) -> Iterator:
            j = 0
            for chunk in it:
                for e in chunk:
                    yield (i, j), e
                    j += 1
        return up.chunks(self.counters).mapPartitionsWithIndex(pos)

    def by_key_sorted(self, up: StageOut, key_fn: Callable[[Any], Any] | None) -> Any:
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

    def results(self, rdd: Any) -> Any:
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
        self.partition_tops[source.name] = record

    # --- the stages: each transform's add_to_spark calls one of these ------------------------

    timestamps = event_time.timestamps
    aggregate = aggregations.aggregate
    distinct = aggregations.distinct
    sort = aggregations.sort
    hash_join = aggregations.hash_join
    window_aggregate = windows.window_aggregate

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

    # --- tables and maps (docs/enrichment.md, "Tables") --------------------------------------

    def map_using_map(self, t: MapUsingMapTransform) -> StageOut:
        """``map_using_map``: the map's contents read once from the member given to the run
        and broadcast to the tasks, each chunk looked up as the member's processor looks it up
        (``MapLookup``)."""
        if self.member is None:
            raise PipelineError(
                f"stage {t.name!r} (map_using_map({t.map_name!r})) reads a member's map: pass "
                "member= (the Member or a Client of the member that holds the map) to run()")
        contents = self.sc.broadcast(dict(self.member.get_map(t.map_name).items()))
        lookup, count = MapLookup(t.key_fn, t.fn), self.task_counter()
        up = self.outs[id(t.upstream[0])]

        def apply(chunk: list) -> list:
            table = contents.value
            out, misses = lookup.apply(chunk, lambda keys: {k: table[k] for k in keys
                                                            if k in table})
            count("map_lookups", len(chunk))
            count("map_misses", misses)
            return out
        return StageOut(_plain_chunks(up, self.counters).map(apply, preservesPartitioning=True),
                        unbounded=up.unbounded)

    def join_table(self, t: JoinTableTransform) -> StageOut:
        """``join_table``: the table is its topic read up to the run's ``until`` (what a
        first start's bootstrap reads), its changes applied in offset order in each Kafka
        partition's task (``apply_changes``); each stream item is joined to it by the member's
        rule (``TableJoinRule``). Partitioned: the stream and the table grouped by key;
        broadcast: the table collected once and broadcast to the tasks. A hand-off holds the
        table as the join processor saves it (``TableEntries``), and the table source's
        offsets (its Kafka reader's entry)."""
        stream, table = (self.outs[id(u)] for u in t.upstream)
        rule, name, count = TableJoinRule(t.key_fn, t.fn, t.how), t.name, self.task_counter()

        def latest(items: Iterator) -> Iterator:
            values: dict = {}
            updates, deletes = apply_changes(values, items)
            count("table_updates", updates)
            count("table_deletes", deletes)
            return iter(values.items())
        table_kv = table.items(self.counters).mapPartitions(latest)
        if self.export_state and not t.broadcast:
            table_kv = table_kv.persist()  # joined and handed off: built once
        if t.broadcast:
            values = dict(table_kv.collect())
            shared = self.sc.broadcast(values)

            def join(chunk: list) -> list:
                out, hits, misses = rule.join(chunk, shared.value.get)
                count("table_hits", hits)
                count("table_misses", misses)
                return out
            if self.export_state:
                self.driver_state.extend((name, *TableEntries.entry(k, v, True))
                                         for k, v in values.items())
            return StageOut(_plain_chunks(stream, self.counters).map(
                join, preservesPartitioning=True), unbounded=stream.unbounded)
        key_fn = t.key_fn

        def join_groups(groups: Iterator) -> Iterator[list]:
            out: list = []
            hits = misses = 0
            for _, (items, found) in groups:
                value = next(iter(found), None)
                r, h, m = rule.join(items, lambda _: value)
                out.extend(r)
                hits += h
                misses += m
            count("table_hits", hits)
            count("table_misses", misses)
            return chunked(out)
        grouped = stream.items(self.counters).map(lambda x: (key_fn(x), x)) \
            .cogroup(table_kv, numPartitions=self.partitions)
        if self.export_state:
            self.state_rdds.append(table_kv.map(
                lambda kv: (name, *TableEntries.entry(kv[0], kv[1], False))))
        return StageOut(grouped.mapPartitions(join_groups), unbounded=stream.unbounded)

    # --- keyed and aggregating ---------------------------------------------------------------

    def rolling_aggregate(self, t: RollingAggregateTransform) -> StageOut:
        up = self.outs[id(t.upstream[0])]
        op, key_fn, name, export, timed = t.op, t.key_fn, t.name, self.export_state, up.timed
        rows = self.by_key_sorted(up, key_fn)
        tagged = rows.mapPartitions(lambda it: keyed.rolling(it, op, key_fn, name, export,
                                                             timed))
        return StageOut(self.split(name, tagged), timed=timed, timestamped=up.timestamped,
                        unbounded=up.unbounded, cut=up.cut, last_watermark=up.last_watermark)

    def interval_join(self, t: IntervalJoinTransform) -> StageOut:
        """``join_interval``: both inputs by join key, the member's join per partition."""
        return joins.interval_join(self, t)

    def asof_join(self, t: AsofJoinTransform) -> StageOut:
        """``join_asof``: both inputs by join key, the member's join per partition."""
        return joins.asof_join(self, t)

    def map_stateful(self, t: MapStatefulTransform) -> StageOut:
        up = self.outs[id(t.upstream[0])]
        counters, timed = self.counters, up.timed
        args = (t.create_fn, t.map_fn, t.key_fn, up.timestamped, t.ttl, t.on_evict, t.name,
                not up.unbounded, up.cut, self.export_state, up.last_watermark)

        def late(n: int) -> None:
            counters.add({"late_events": n})
        rows = self.by_key_sorted(up, t.key_fn)
        tagged = rows.mapPartitions(lambda it: keyed.map_stateful(it, *args, late=late,
                                                                  timed=timed))
        out = self.split(t.name, tagged)
        if self.export_state and up.unbounded and up.cut is None:
            self.driver_state.append((t.name, *MapStatefulEntries.watermark(NO_WATERMARK)))
        return StageOut(out, timed=timed, timestamped=up.timestamped, unbounded=up.unbounded,
                        cut=up.cut, last_watermark=up.last_watermark)

    def map_using_service(self, t: Any) -> StageOut:
        """``map_using_service`` and its async form, a service per task (``services.py``)."""
        from jetwake.engine.backfill import services
        return services.map_using_service(self, t)




def _plain_chunks(up: StageOut, counters: Any) -> Any:
    """``up``'s chunks as items (times and watermarks taken off)."""
    rdd = up.chunks(counters)
    return rdd.map(_untimed, preservesPartitioning=True) if up.timed else rdd


def _watermark_unknown(chunk: list) -> list:
    """Timed elements without the watermark they met. Where several timestamped inputs are
    merged, the member's watermark is the lowest of theirs, and what that was when an event
    arrived depends on how the inputs interleaved, which a backfill cannot know: as for Kafka
    partitions, no event is judged late (a co-aggregating window does not read them instead:
    ``frame_partials(judge_late=False)``)."""
    return [(t, None, x) for t, _, x in chunk]


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


def _first(k: tuple) -> int:
    return k[0]


