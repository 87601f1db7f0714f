"""The logical plan: one Transform per pipeline stage, linked to its upstream transforms.

Stages build transforms; at submission each transform plans itself into the DAG
(:meth:`Transform.add_to_dag`, called by ``planner.py`` in pipeline order). A transform's name
is unique in its pipeline and names its vertices, so saved state can be matched to stages.

Every Transform subclass defines its own ``add_to_dag`` and its own ``add_to_spark``, its form
on the Spark backfill (``jetwake.engine.backfill``: the method calls the backfill's builder for
its kind of stage), or says ``add_to_spark = NotOnSpark(reason)``; a class that does not fails
when it is defined (at import), so a new kind of stage cannot be left without a plan on either
runtime.
"""

from __future__ import annotations

from math import gcd
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from jetwake.engine.core.errors import PipelineError
from jetwake.engine.core.dag import Edge, Vertex
from jetwake.engine.operations.aggregate import AggregateOperation
from jetwake.engine.pipeline.connector import Sink, Source
from jetwake.engine.pipeline.event_time import key_on_item, with_event_time_in_source
from jetwake.engine.pipeline.fusion import (
    changelog_step, internal_step, stateless_function, stateless_step, unwrap_step,
)
from jetwake.engine.pipeline.planner import ItemForm, Output, Planner, Routing
from jetwake.engine.pipeline.spark_form import NotOnSpark
from jetwake.engine.processors.aggregation import (
    AccumulateProcessor, AggregateProcessor, CombineProcessor,
)
from jetwake.engine.processors.distinct import DistinctProcessor
from jetwake.engine.processors.hash_join import HashJoinProcessor
from jetwake.engine.processors.asof_join import AsofJoinProcessor
from jetwake.engine.processors.interval_join import IntervalJoinProcessor
from jetwake.engine.processors.insert_watermarks import InsertWatermarksProcessor
from jetwake.engine.processors.map_stateful import MapStatefulProcessor
from jetwake.engine.processors.pass_through import PassThroughProcessor
from jetwake.engine.processors.rolling_aggregate import RollingAggregateProcessor
from jetwake.engine.processors.session_window import SessionWindowProcessor
from jetwake.engine.processors.sliding_window import (
    FrameAccumulateProcessor, SlidingWindowProcessor, WindowCombineProcessor, composite_operation,
)
from jetwake.engine.processors.source_event_time import EventTimeSpec
from jetwake.engine.processors.sort import MergeSortedProcessor, SortProcessor
from jetwake.engine.processors.stateless_stage import StatelessStageProcessor
from jetwake.engine.processors.map_lookup import MapLookupProcessor
from jetwake.engine.processors.table_join import TableJoinProcessor, table_route_key
from jetwake.engine.core.functions import identity

if TYPE_CHECKING:  # the backfill runs transforms; they only name its types
    from jetwake.engine.backfill.stage_output import StageOut
    from jetwake.engine.backfill.translate import Translator

__all__ = [
    "Transform", "SourceTransform", "StatelessTransform", "AggregateTransform",
    "DistinctTransform", "SortTransform", "RebalanceTransform", "MergeTransform",
    "HashJoinTransform", "CustomTransform", "SinkTransform", "TimestampTransform",
    "WindowAggregateTransform", "RollingAggregateTransform", "MapStatefulTransform",
    "SideSinkTransform", "MapUsingMapTransform", "JoinTableTransform",
    "IntervalJoinTransform", "AsofJoinTransform",
]

_first = itemgetter(0)
_PLAIN, _TIMESTAMPED = ItemForm.PLAIN, ItemForm.TIMESTAMPED


class Transform:
    kind = "transform"

    def __init__(self, upstream: list["Transform"]) -> None:
        self.upstream = upstream
        self.name = ""
        self.local_parallelism = -1
        self.explicit_parallelism = False
        #: where the events this stage cannot use go (late ones, ones without a readable
        #: timestamp); None: they are counted and dropped. Only some stages offer one.
        self.side_sink: Sink | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "add_to_dag" not in cls.__dict__:
            raise TypeError(f"{cls.__qualname__} must define add_to_dag(planner): how the "
                            "stage becomes vertices and edges")
        if "add_to_spark" not in cls.__dict__:
            raise TypeError(f"{cls.__qualname__} must define add_to_spark(backfill): how the "
                            "Spark backfill runs the stage (or add_to_spark = "
                            "NotOnSpark(reason) when it cannot)")

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        """Adds this stage's Spark form to ``backfill`` (jetwake.engine.backfill): calls the
        backfill's method for this kind of stage, which builds its RDDs from the outputs of
        the upstream stages; returns the stage's output (None for a sink, written later)."""
        raise NotImplementedError(f"{type(self).__qualname__}.add_to_spark")

    def add_to_dag(self, planner: Planner) -> None:
        """Adds this stage's vertices and edges to ``planner.dag``, connected to the outputs
        of its upstream transforms, and records this stage's output."""
        raise NotImplementedError(f"{type(self).__qualname__}.add_to_dag")

    def state_shape(self) -> str:
        """What the form of this stage's saved state depends on besides its kind: "keyed" or
        "keyless" for a stage that may be either; "" when nothing (a job started from a
        snapshot takes over a vertex's state only when kind and shape are the same)."""
        if not hasattr(self, "key_fn"):
            return ""
        return "keyed" if getattr(self, "key_fn") is not None else "keyless"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class SourceTransform(Transform):
    kind = "source"

    def __init__(self, source: Source) -> None:
        super().__init__([])
        self.source = source

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.source(self)

    def add_to_dag(self, planner: Planner) -> None:
        v = planner.vertex(self.name, self.source.meta_supplier, self)
        planner.set_output(self, Output(v, form=ItemForm.TABLE_CHANGELOG
                                        if self.source.table_changelog else
                                        ItemForm.NATIVE_PAIRS
                                        if self.source.emits_pairs else _PLAIN))


class StatelessTransform(Transform):
    def __init__(self, upstream: Transform, op: str, fn: Callable[[Any], Any]) -> None:
        super().__init__([upstream])
        self.kind = op
        self.op = op
        self.fn = fn

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.stateless(self)

    def add_to_dag(self, planner: Planner) -> None:
        up = self.upstream[0]
        out = planner.output(up)
        form = _TIMESTAMPED if out.form is _TIMESTAMPED else _PLAIN
        if self.explicit_parallelism or out.routing is not None:
            # a vertex of its own: the user set its parallelism, or a rebalance decides how
            # items reach it (its routing applies to the stage's items as they were before it)
            fn = stateless_function(self.op, self.fn, form is _TIMESTAMPED)
            v = planner.vertex(self.name, lambda: StatelessStageProcessor(fn), self)
            planner.connect(self, up, v, takes=form)
            planner.set_output(self, Output(v, form=form))
            return
        chain = out.chain
        if out.form is ItemForm.NATIVE_PAIRS:
            chain += (unwrap_step(up.name),)  # the stage sees the items
        elif out.form is ItemForm.TABLE_CHANGELOG:
            chain += (changelog_step(up.name),)
        step = stateless_step(self.name, self.op, self.fn, form is _TIMESTAMPED)
        planner.set_output(self, Output(out.vertex, chain + (step,), form))


class AggregateTransform(Transform):
    kind = "aggregate"

    def __init__(self, upstream: Transform, op: AggregateOperation,
                 key_fn: Callable[[Any], Any] | None) -> None:
        super().__init__([upstream])
        self.op = op
        self.key_fn = key_fn

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.aggregate(self)

    def add_to_dag(self, planner: Planner) -> None:
        """Keyed: accumulate and combine vertices joined by a distributed partitioned edge;
        keyless: joined by an all-to-one edge; an operation without ``combine`` runs in one
        vertex after the partitioned (or all-to-one) edge."""
        op, key_fn = self.op, self.key_fn
        up = self.upstream[0]
        if not op.can_combine:
            v = planner.vertex(self.name, lambda: AggregateProcessor(op, key_fn), self,
                               -1 if key_fn is not None else 1)
            if key_fn is None:
                planner.connect(self, up, v, lambda e: e.distributed().all_to_one())
            else:
                planner.connect(self, up, v, lambda e: e.distributed().partitioned(key_fn))
            planner.set_output(self, Output(v))
            return
        acc = planner.vertex(f"{self.name}-accumulate",
                             lambda: AccumulateProcessor(op, key_fn), self)
        planner.connect(self, up, acc)
        if key_fn is None:
            comb = planner.vertex(self.name, lambda: CombineProcessor(op, False), self, 1)
            planner.edge(acc, comb, (), lambda e: e.distributed().all_to_one())
        else:
            comb = planner.vertex(self.name, lambda: CombineProcessor(op, True), self)
            planner.edge(acc, comb, (), lambda e: e.distributed().partitioned(_first))
        planner.set_output(self, Output(comb))


class DistinctTransform(Transform):
    kind = "distinct"

    def __init__(self, upstream: Transform, key_fn: Callable[[Any], Any] | None) -> None:
        super().__init__([upstream])
        self.key_fn = key_fn

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.distinct(self)

    def add_to_dag(self, planner: Planner) -> None:
        key_fn = self.key_fn
        v = planner.vertex(self.name, lambda: DistinctProcessor(key_fn), self)
        planner.connect(self, self.upstream[0], v,
                        lambda e: e.distributed().partitioned(key_fn or identity))
        planner.set_output(self, Output(v))


class SortTransform(Transform):
    kind = "sort"

    def __init__(self, upstream: Transform, key: Callable[[Any], Any] | None,
                 reverse: bool) -> None:
        super().__init__([upstream])
        self.key = key
        self.reverse = reverse

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.sort(self)

    def add_to_dag(self, planner: Planner) -> None:
        key, reverse = self.key, self.reverse
        local = planner.vertex(f"{self.name}-local", lambda: SortProcessor(key, reverse), self)
        planner.connect(self, self.upstream[0], local)
        merge = planner.dag.new_vertex(self.name, lambda: MergeSortedProcessor(key, reverse), 1)
        planner.edge(local, merge, (), lambda e: e.distributed().all_to_one())
        planner.set_output(self, Output(merge))


class RebalanceTransform(Transform):
    kind = "rebalance"

    def __init__(self, upstream: Transform, key_fn: Callable[[Any], Any] | None) -> None:
        super().__init__([upstream])
        self.key_fn = key_fn

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.rebalance(self)

    def add_to_dag(self, planner: Planner) -> None:
        # no vertex: the next stage's inbound edge becomes distributed (and partitioned)
        out = planner.output(self.upstream[0])
        planner.set_output(self, Output(out.vertex, out.chain, out.form, Routing(self.key_fn)))


class MergeTransform(Transform):
    kind = "merge"

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.merge(self)

    def add_to_dag(self, planner: Planner) -> None:
        v = planner.vertex(self.name, PassThroughProcessor, self)
        forms = {planner.output(up).form for up in self.upstream}
        # items keep their form when every input has it, else they all become plain
        form = forms.pop() if len(forms) == 1 else _PLAIN
        for up in self.upstream:
            planner.connect(self, up, v, takes=form)
        planner.set_output(self, Output(v, form=form))


class HashJoinTransform(Transform):
    kind = "hash-join"

    def __init__(self, stream: Transform, build: Transform, key_fn: Callable[[Any], Any],
                 build_key_fn: Callable[[Any], Any], build_value_fn: Callable[[Any], Any],
                 join_fn: Callable[[Any, Any], Any], outer: bool) -> None:
        super().__init__([stream, build])
        self.key_fn = key_fn
        self.build_key_fn = build_key_fn
        self.build_value_fn = build_value_fn
        self.join_fn = join_fn
        self.outer = outer

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.hash_join(self)

    def add_to_dag(self, planner: Planner) -> None:
        args = (self.key_fn, self.build_key_fn, self.build_value_fn, self.join_fn, self.outer)
        v = planner.vertex(self.name, lambda: HashJoinProcessor(*args), self)
        planner.connect(self, self.upstream[0], v)
        # the build side is sent to every processor and consumed before the stream
        planner.connect(self, self.upstream[1], v, lambda e: e.distributed().broadcast(),
                        priority=-1)
        planner.set_output(self, Output(v))


class MapUsingMapTransform(Transform):
    """``map_using_map``: each item looked up in a named map (engine/processors/map_lookup.py)."""

    kind = "map-using-map"

    def __init__(self, upstream: Transform, map_name: str, key_fn: Callable[[Any], Any],
                 fn: Callable[[Any, Any], Any],
                 partition_fn: Callable[[Any], Any] | None = None) -> None:
        super().__init__([upstream])
        self.map_name = map_name
        self.key_fn = key_fn
        self.fn = fn
        self.partition_fn = partition_fn  # after group_by: items routed by their grouping key

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.map_using_map(self)

    def add_to_dag(self, planner: Planner) -> None:
        name, map_name, key_fn, fn = self.name, self.map_name, self.key_fn, self.fn
        v = planner.vertex(name, lambda: MapLookupProcessor(name, map_name, key_fn, fn), self)
        partition_fn = self.partition_fn
        if partition_fn is not None:
            planner.connect(self, self.upstream[0], v,
                            lambda e: e.distributed().partitioned(partition_fn))
        else:
            planner.connect(self, self.upstream[0], v)
        planner.set_output(self, Output(v))


class JoinTableTransform(Transform):
    """``join_table``: a stream joined to a table's current value (engine/processors/
    table_join.py). Ordinal 0 is the stream, ordinal 1 the table's changelog with its markers.
    Partitioned: both edges by key; broadcast: the table to every processor, the stream where
    it is."""

    kind = "join-table"

    def __init__(self, stream: Transform, table: Transform, key_fn: Callable[[Any], Any],
                 fn: Callable[[Any, Any], Any], how: str, broadcast: bool,
                 bootstrap: bool) -> None:
        super().__init__([stream, table])
        self.key_fn = key_fn
        self.fn = fn
        self.how = how
        self.broadcast = broadcast
        self.bootstrap = bootstrap

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.join_table(self)

    def add_to_dag(self, planner: Planner) -> None:
        name, key_fn, fn, how, broadcast, bootstrap = (
            self.name, self.key_fn, self.fn, self.how, self.broadcast, self.bootstrap)
        v = planner.vertex(name, lambda: TableJoinProcessor(name, key_fn, fn, how, broadcast,
                                                            bootstrap), self)
        stream, table = self.upstream
        if broadcast:
            planner.connect(self, stream, v)
            planner.connect(self, table, v, lambda e: e.distributed().broadcast(),
                            takes=ItemForm.TABLE_CHANGELOG)
        else:
            planner.connect(self, stream, v, lambda e: e.distributed().partitioned(key_fn))
            planner.connect(self, table, v,
                            lambda e: e.distributed().partitioned(table_route_key),
                            takes=ItemForm.TABLE_CHANGELOG)
        planner.set_output(self, Output(v))

class MapUsingServiceTransform(Transform):
    """``map_using_service`` and ``map_using_service_async`` (``is_async``), keyless or after
    ``group_by`` (``key_fn``): one vertex, after a partitioned edge when keyed so that each
    key's items reach one processor in order; timestamped items stay timestamped through it,
    and a call that fails for good goes to the ``errors_to`` sink (``side_sink``)."""

    kind = "map-using-service"

    def __init__(self, upstream: Transform, factory: Any, fn: Callable[..., Any],
                 key_fn: Callable[[Any], Any] | None, is_async: bool, max_concurrent: int = 1,
                 preserve_order: bool = True, timeout_ms: int | None = None,
                 retrying: Any = None) -> None:
        super().__init__([upstream])
        self.factory = factory
        self.fn = fn
        self.key_fn = key_fn
        self.is_async = is_async
        self.max_concurrent = max_concurrent
        self.preserve_order = preserve_order
        self.timeout_ms = timeout_ms
        self.retrying = retrying

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.map_using_service(self)

    def add_to_dag(self, planner: Planner) -> None:
        from jetwake.engine.processors.map_using_service import (
            MapUsingServiceAsyncProcessor, MapUsingServiceProcessor,
        )
        timestamped = planner.output(self.upstream[0]).form is _TIMESTAMPED
        form = _TIMESTAMPED if timestamped else _PLAIN
        name, factory, fn, key_fn = self.name, self.factory, self.fn, self.key_fn
        side = self.side_sink is not None
        if self.is_async:
            args = (self.max_concurrent, self.preserve_order, self.timeout_ms, self.retrying)
            v = planner.vertex(name, lambda: MapUsingServiceAsyncProcessor(
                name, factory, fn, key_fn, timestamped, side, *args), self)
        else:
            v = planner.vertex(name, lambda: MapUsingServiceProcessor(
                name, factory, fn, key_fn, timestamped, side), self)
        if side:
            _plan_side_sink(planner, self, v)
        if key_fn is None:
            planner.connect(self, self.upstream[0], v, takes=form)
        else:
            kf = key_on_item(key_fn) if timestamped else key_fn
            planner.connect(self, self.upstream[0], v,
                            lambda e: e.distributed().partitioned(kf), takes=form)
        planner.set_output(self, Output(v, form=form))


class CustomTransform(Transform):
    kind = "custom"

    def __init__(self, upstream: Transform, processor_supplier: Any) -> None:
        super().__init__([upstream])
        self.processor_supplier = processor_supplier

    add_to_spark = NotOnSpark(
        "a custom_transform: its processors run only on a jetwake member, Spark cannot run "
        "them; express it with map/flat_map/map_stateful or run the pipeline on a member")

    def add_to_dag(self, planner: Planner) -> None:
        v = planner.vertex(self.name, self.processor_supplier, self)
        planner.connect(self, self.upstream[0], v)
        planner.set_output(self, Output(v))


class SinkTransform(Transform):
    kind = "sink"

    def __init__(self, upstream: Transform, sink: Sink) -> None:
        super().__init__([upstream])
        self.sink = sink

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        backfill.sink(self)
        return None

    def add_to_dag(self, planner: Planner) -> None:
        v = planner.vertex(self.name, self.sink.meta_supplier, self)
        key_fn = self.sink.partition_key_fn
        if key_fn is None:
            planner.connect(self, self.upstream[0], v)
        else:
            planner.connect(self, self.upstream[0], v,
                            lambda e: e.distributed().partitioned(key_fn))
        planner.set_output(self, Output(v))


class SideSinkTransform(SinkTransform):
    """A sink fed by a side output of ``owner`` (late events, unreadable timestamps); the
    owner wires it while planning itself (:func:`_plan_side_sink`)."""

    kind = "side-sink"

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        backfill.sink(self)
        return None

    def add_to_dag(self, planner: Planner) -> None:
        pass  # planned by the transform that owns the side output


def _plan_side_sink(planner: Planner, owner: Transform, v: Vertex) -> None:
    """Wires ``owner``'s side-output sink to output ordinal 0 of ``v`` (call this before any
    other outbound edge of ``v`` is made)."""
    sink_t = next(x for x in planner.transforms
                  if isinstance(x, SideSinkTransform) and x.upstream[0] is owner)
    sv = planner.vertex(sink_t.name, sink_t.sink.meta_supplier, sink_t)
    key_fn = sink_t.sink.partition_key_fn
    planner.edge(v, sv, (), (lambda e: e.distributed().partitioned(key_fn))
                 if key_fn is not None else (lambda e: e))
    planner.set_output(sink_t, Output(sv))


# --- event time ------------------------------------------------------------------------------

class TimestampTransform(Transform):
    """Assigns event timestamps and inserts watermarks (``with_timestamps``)."""

    kind = "timestamps"

    def __init__(self, upstream: Transform, timestamp_fn: Callable[[Any], int] | None,
                 policy_factory: Any, idle_timeout: int, native: bool,
                 upstream_watermarks: bool = False) -> None:
        super().__init__([upstream])
        self.timestamp_fn = timestamp_fn  # None: the source emits (ts, item) pairs
        self.policy_factory = policy_factory
        self.idle_timeout = idle_timeout
        self.native = native
        # the source emits its own watermarks (per partition): follow them
        self.upstream_watermarks = upstream_watermarks
        self.side_sink = None  # events without a readable timestamp

    def downstream(self, transforms: Sequence[Transform]) -> Iterator[Transform]:
        """The stages of a pipeline of ``transforms`` that see this stage's timestamps: those
        it feeds, directly or not, up to the next ``with_timestamps``."""
        seen: set[int] = set()
        todo: list[Transform] = [self]
        while todo:
            x = todo.pop()
            for d in transforms:
                if id(d) in seen or isinstance(d, TimestampTransform) or \
                        not any(up is x for up in d.upstream):
                    continue
                seen.add(id(d))
                yield d
                todo.append(d)

    def watermark_step(self, transforms: Sequence[Transform]) -> int:
        """The throttling step of this stage's watermarks in a pipeline of ``transforms``: the
        gcd of the frame sizes (or session gaps) of the windows downstream; 0 when none (a
        watermark per chunk)."""
        step = 0
        for d in self.downstream(transforms):
            if isinstance(d, WindowAggregateTransform):
                w = d.wdef
                step = gcd(step, w.gap if w.is_session else w.slide)
        return step

    def runs_in_source(self, transforms: Sequence[Transform]) -> bool:
        """Whether this stage runs inside its source, per partition: it directly follows a
        partitioned source that feeds nothing else, with a policy on event time (a wall-clock
        policy has nothing to track per partition)."""
        up = self.upstream[0]
        return (isinstance(up, SourceTransform) and up.source.partitioned
                and not self.policy_factory().is_real_time
                and sum(any(u is up for u in t.upstream) for t in transforms) == 1)

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.timestamps(self)

    def add_to_dag(self, planner: Planner) -> None:
        up = self.upstream[0]
        ts_fn, factory, idle = self.timestamp_fn, self.policy_factory, self.idle_timeout
        step = self.watermark_step(planner.transforms)
        side = self.side_sink is not None
        name = self.name
        if self.runs_in_source(planner.transforms):
            v = planner.output(up).vertex
            spec = EventTimeSpec(name, ts_fn, factory, step, idle, side)
            v.meta_supplier = with_event_time_in_source(v.meta_supplier, spec, up.name)
            if side:
                _plan_side_sink(planner, self, v)
            planner.set_output(self, Output(v, form=_TIMESTAMPED))
            return
        up_vertex = planner.output(up).vertex
        n = planner.resolved_parallelism(up_vertex)
        if up_vertex.local_parallelism < 1:
            up_vertex.set_local_parallelism(n)  # the value it resolves to anyway
        follow = self.upstream_watermarks
        v = planner.dag.new_vertex(name, lambda: InsertWatermarksProcessor(
            name, ts_fn, factory, step, idle, side, follow), n)
        if side:
            _plan_side_sink(planner, self, v)
        # one watermark inserter per upstream processor, so each sees one ordered stream; a
        # source with native timestamps hands it its (timestamp, item) pairs
        planner.connect(self, up, v, lambda e: e.isolated(),
                        takes=ItemForm.NATIVE_PAIRS if ts_fn is None else _PLAIN)
        planner.set_output(self, Output(v, form=_TIMESTAMPED))


class WindowAggregateTransform(Transform):
    """A windowed aggregation of one or more inputs (``aggregate`` / ``aggregate2``)."""

    kind = "window-aggregate"

    def __init__(self, upstream: list[Transform], wdef: Any, ops: list[AggregateOperation],
                 key_fns: list[Callable[[Any], Any]] | None,
                 post: Callable[[Any], Any] | None = None) -> None:
        super().__init__(upstream)
        self.wdef = wdef
        self.ops = ops
        self.key_fns = key_fns  # None: keyless
        self.post = post        # a flat-map over the window results (the windowed join)
        self.side_sink = None  # late events

    @property
    def two_stage(self) -> bool:
        """Whether the windows run in two stages: frames accumulated where the events are,
        then combined by key into windows (sliding and tumbling windows of operations that
        combine); otherwise one stage after the shuffle (sessions, operations without combine,
        early results of one operation, which need the open frames in one place, as in Jet).
        A member's planner and the Spark backfill both plan by this. A session window has one
        input: the pipeline refuses to co-aggregate sessions when it is built."""
        wdef, ops = self.wdef, self.ops
        return not wdef.is_session and all(op.can_combine for op in ops) \
            and (not wdef.early_results_period or len(ops) > 1)

    def state_shape(self) -> str:
        """Keyed or keyless, and the window's definition: frames saved by windows of another
        size or slide do not fit."""
        w = self.wdef
        window = (f"session gap={w.gap}" if w.is_session
                  else f"sliding size={w.size} slide={w.slide}")
        return f"{'keyed' if self.key_fns is not None else 'keyless'}, {window}"

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.window_aggregate(self)

    def add_to_dag(self, planner: Planner) -> None:
        """In two stages (:attr:`two_stage`): a frame-accumulate vertex per upstream processor
        and a combine vertex after a partitioned edge; otherwise one vertex after the
        partitioned edge."""
        for up in self.upstream:
            if planner.output(up).form is not _TIMESTAMPED:
                raise PipelineError(f"stage {self.name!r}: its input {up.name!r} has no "
                                    "timestamps; call with_timestamps() before windowing")
        wdef, ops, key_fns, name = self.wdef, self.ops, self.key_fns, self.name
        keyed = key_fns is not None
        side = self.side_sink is not None
        chain = (internal_step(name, "window join", self.post),) if self.post is not None \
            else ()
        if self.two_stage:
            kfs = list(key_fns) if key_fns is not None else [None] * len(ops)
            acc = planner.vertex(f"{name}-accumulate", lambda: FrameAccumulateProcessor(
                name, wdef, ops, kfs, side), self)
            if side:
                _plan_side_sink(planner, self, acc)
            for up in self.upstream:
                planner.connect(self, up, acc, takes=_TIMESTAMPED)
            op = ops[0] if len(ops) == 1 else composite_operation(ops)
            comb = planner.vertex(name, lambda: WindowCombineProcessor(name, wdef, op, keyed),
                                  self, -1 if keyed else 1)
            if keyed:
                planner.edge(acc, comb, (), lambda e: e.distributed().partitioned(_first))
            else:
                planner.edge(acc, comb, (), lambda e: e.distributed().all_to_one())
            planner.set_output(self, Output(comb, chain))
            return
        op, = ops  # one input: the pipeline co-aggregates in two stages only
        key_fn = key_fns[0] if key_fns is not None else None
        cls = SessionWindowProcessor if wdef.is_session else SlidingWindowProcessor
        v = planner.vertex(name, lambda: cls(name, wdef, op, key_fn, side), self,
                           -1 if keyed else 1)
        if side:
            _plan_side_sink(planner, self, v)
        if key_fn is not None:
            kf = key_on_item(key_fn)
            planner.connect(self, self.upstream[0], v,
                            lambda e: e.distributed().partitioned(kf), takes=_TIMESTAMPED)
        else:
            planner.connect(self, self.upstream[0], v, lambda e: e.distributed().all_to_one(),
                            takes=_TIMESTAMPED)
        planner.set_output(self, Output(v, chain))


def _plan_keyed_vertex(planner: Planner, t: Transform, key_fn: Any, factory: Any,
                       timestamped: bool) -> None:
    """One vertex after a partitioned edge (all-to-one without a key); timestamped items
    stay timestamped through it."""
    form = _TIMESTAMPED if timestamped else _PLAIN
    if key_fn is None:
        v = planner.vertex(t.name, factory, t, 1)
        planner.connect(t, t.upstream[0], v, lambda e: e.distributed().all_to_one(),
                        takes=form)
    else:
        v = planner.vertex(t.name, factory, t)
        kf = key_on_item(key_fn) if timestamped else key_fn
        planner.connect(t, t.upstream[0], v, lambda e: e.distributed().partitioned(kf),
                        takes=form)
    planner.set_output(t, Output(v, form=form))


class RollingAggregateTransform(Transform):
    kind = "rolling-aggregate"

    def __init__(self, upstream: Transform, op: AggregateOperation,
                 key_fn: Callable[[Any], Any] | None,
                 migrate: Callable[[Any], Any] | None = None) -> None:
        super().__init__([upstream])
        self.op = op
        self.key_fn = key_fn
        self.migrate = migrate  # only a restore converts state: the backfill has none to

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.rolling_aggregate(self)

    def add_to_dag(self, planner: Planner) -> None:
        timestamped = planner.output(self.upstream[0]).form is _TIMESTAMPED
        name, op, key_fn, migrate = self.name, self.op, self.key_fn, self.migrate
        _plan_keyed_vertex(planner, self, key_fn, lambda: RollingAggregateProcessor(
            name, op, key_fn, timestamped, migrate), timestamped)


class MapStatefulTransform(Transform):
    kind = "map-stateful"

    def __init__(self, upstream: Transform, create_fn: Callable[[], Any],
                 map_fn: Callable[..., Any], key_fn: Callable[[Any], Any] | None,
                 ttl: int | None, on_evict: Callable[..., Any] | None,
                 migrate: Callable[[Any], Any] | None = None) -> None:
        super().__init__([upstream])
        self.create_fn = create_fn
        self.map_fn = map_fn
        self.key_fn = key_fn
        self.ttl = ttl
        self.on_evict = on_evict
        self.migrate = migrate  # only a restore converts state: the backfill has none to

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.map_stateful(self)

    def add_to_dag(self, planner: Planner) -> None:
        timestamped = planner.output(self.upstream[0]).form is _TIMESTAMPED
        if self.ttl is not None and not timestamped:
            raise PipelineError(f"stage {self.name!r}: a ttl needs timestamps on its input")
        name, create_fn, map_fn, key_fn, ttl, on_evict, migrate = (
            self.name, self.create_fn, self.map_fn, self.key_fn, self.ttl, self.on_evict,
            self.migrate)
        _plan_keyed_vertex(planner, self, key_fn, lambda: MapStatefulProcessor(
            name, create_fn, map_fn, key_fn, timestamped, ttl, on_evict, migrate), timestamped)


# --- joins of two streams in event time ------------------------------------------------------

def _plan_stream_join(planner: Planner, t: Transform, key_fns: tuple[Callable[[Any], Any], ...],
                      factory: Callable[[], Any]) -> None:
    """A join of two timestamped streams: one vertex, the left input on ordinal 0 and the
    right on 1, each partitioned by its join key over the cluster so that equal keys meet in
    one processor; late events to the side sink when there is one; a timestamped output."""
    for up in t.upstream:
        if planner.output(up).form is not _TIMESTAMPED:
            raise PipelineError(f"stage {t.name!r}: its input {up.name!r} has no timestamps; "
                                "call with_timestamps() on it before the join")
    v = planner.vertex(t.name, factory, t)
    if t.side_sink is not None:
        _plan_side_sink(planner, t, v)
    for up, kf in zip(t.upstream, key_fns):
        planner.connect(t, up, v, _partitioned_by(key_on_item(kf)), takes=_TIMESTAMPED)
    planner.set_output(t, Output(v, form=_TIMESTAMPED))


def _partitioned_by(key_fn: Callable[[Any], Any]) -> Callable[[Edge], Edge]:
    """Configures an edge distributed and partitioned by ``key_fn``."""
    return lambda e: e.distributed().partitioned(key_fn)


class IntervalJoinTransform(Transform):
    kind = "interval-join"

    def __init__(self, left: Transform, right: Transform, key_fn: Callable[[Any], Any],
                 other_key_fn: Callable[[Any], Any], lower: int, upper: int,
                 fn: Callable[[Any, Any], Any] | None) -> None:
        super().__init__([left, right])
        self.key_fn = key_fn
        self.other_key_fn = other_key_fn
        self.lower = lower
        self.upper = upper
        self.fn = fn
        self.side_sink = None  # late events

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.interval_join(self)

    def add_to_dag(self, planner: Planner) -> None:
        args = (self.name, self.key_fn, self.other_key_fn, self.lower, self.upper, self.fn,
                self.side_sink is not None)
        _plan_stream_join(planner, self, (self.key_fn, self.other_key_fn),
                          lambda: IntervalJoinProcessor(*args))


class AsofJoinTransform(Transform):
    kind = "asof-join"

    def __init__(self, left: Transform, right: Transform, key_fn: Callable[[Any], Any],
                 other_key_fn: Callable[[Any], Any], tolerance: int | None,
                 fn: Callable[[Any, Any], Any] | None, how: str) -> None:
        super().__init__([left, right])
        self.key_fn = key_fn
        self.other_key_fn = other_key_fn
        self.tolerance = tolerance
        self.fn = fn
        self.how = how
        self.side_sink = None  # late events

    def add_to_spark(self, backfill: Translator) -> StageOut | None:
        return backfill.asof_join(self)

    def add_to_dag(self, planner: Planner) -> None:
        args = (self.name, self.key_fn, self.other_key_fn, self.tolerance, self.fn, self.how,
                self.side_sink is not None)
        _plan_stream_join(planner, self, (self.key_fn, self.other_key_fn),
                          lambda: AsofJoinProcessor(*args))
