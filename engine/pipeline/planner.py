"""Compiles a Pipeline to a DAG.

Stateless stages create no vertex: they accumulate as a chain on their upstream's output and
become the fused ``transform`` of the edge that leaves it (see ``fusion.py``). A keyed
aggregation becomes two vertices, accumulate and combine, joined by a distributed partitioned
edge (Jet's two-stage aggregation); a keyless one joins them with an all-to-one edge; an operation without
``combine`` runs in one stage after the partitioned edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from operator import itemgetter
from typing import Any, Callable

from jetwake.engine.core.dag import DAG, Edge, Vertex
from jetwake.engine.processors.aggregation import (
    AccumulateProcessor, AggregateProcessor, CombineProcessor,
)
from jetwake.engine.processors.distinct import DistinctProcessor
from jetwake.engine.processors.hash_join import HashJoinProcessor
from jetwake.engine.processors.insert_watermarks import InsertWatermarksProcessor
from jetwake.engine.processors.map_stateful import MapStatefulProcessor
from jetwake.engine.processors.pass_through import PassThroughProcessor
from jetwake.engine.processors.rolling_aggregate import RollingAggregateProcessor
from jetwake.engine.processors.session_window import SessionWindowProcessor
from jetwake.engine.processors.sliding_window import (
    FrameAccumulateProcessor, SlidingWindowProcessor, WindowCombineProcessor, composite_operation,
)
from jetwake.engine.processors.sort import MergeSortedProcessor, SortProcessor
from jetwake.engine.pipeline.event_time import native_pair_timestamp, unwrap, wrapped_step
from jetwake.engine.pipeline.fusion import StatelessOp, compile_chain
from jetwake.engine.pipeline.pipeline import Pipeline, PipelineError
from jetwake.engine.pipeline.transforms import (
    AggregateTransform, CustomTransform, DistinctTransform, HashJoinTransform,
    MapStatefulTransform, MergeTransform, RebalanceTransform, RollingAggregateTransform,
    SideSinkTransform, SinkTransform, SortTransform, SourceTransform, StatelessTransform,
    TimestampTransform, Transform, WindowAggregateTransform,
)

__all__ = ["Planner"]

_first = itemgetter(0)


@dataclass(frozen=True)
class _Output:
    """Where a stage's items come from: a vertex, plus stateless stages not yet applied."""
    vertex: Vertex
    chain: tuple[StatelessOp, ...] = ()
    # routing the next stage's inbound edge must use (set by rebalance)
    routing: Callable[[Edge], Edge] | None = None


class Planner:
    def __init__(self, pipeline: Pipeline, default_parallelism: int) -> None:
        self.pipeline = pipeline
        self.default_parallelism = default_parallelism
        self.dag = DAG()
        self.outputs: dict[int, _Output] = {}
        self._next_out_ordinal: dict[str, int] = {}
        self._next_in_ordinal: dict[str, int] = {}
        # transforms whose output items are (timestamp, item) pairs
        self.wrapped: set[int] = set()

    def build(self) -> DAG:
        transforms = self.pipeline.transforms
        if not transforms:
            raise PipelineError("the pipeline is empty: start it with read_from(source)")
        if not self.pipeline.sinks():
            raise PipelineError("the pipeline has no sink: end it with write_to(sink)")
        for t in transforms:
            handler = getattr(self, f"_plan_{type(t).__name__}")
            handler(t)
        return self.dag

    # --- helpers -------------------------------------------------------------------------

    def _vertex(self, name: str, processor: Any, t: Transform, parallelism: int = -1) -> Vertex:
        if parallelism == -1 and t.explicit_parallelism:
            parallelism = t.local_parallelism
        return self.dag.new_vertex(name, processor, parallelism)

    def _connect(self, t: Transform, upstream: Transform, dest: Vertex,
                 configure: Callable[[Edge], Edge] = lambda e: e, priority: int = 0,
                 wrapped_input: bool = False) -> Edge:
        """Connects ``upstream``'s output to ``dest``. ``wrapped_input``: ``dest`` takes the
        (timestamp, item) pairs of a stage with timestamps; otherwise pairs are unwrapped on
        the edge."""
        out = self.outputs[id(upstream)]
        pairs = id(upstream) in self.wrapped
        if pairs and not wrapped_input:
            out = _Output(out.vertex, out.chain + (("chunk", unwrap),), out.routing)
        src = out.vertex
        if any(e.source is src and e.destination is dest for e in self.dag.edges):
            # a second edge between the same pair (a self-merge or self-join) is not allowed:
            # route this one through a pass-through vertex
            hop = self.dag.new_vertex(f"{t.name}-via-{src.name}", PassThroughProcessor)
            self._edge(src, hop, out.chain, lambda e: e)
            src, chain = hop, ()
        else:
            chain = out.chain
        if out.routing is not None:
            routing, inner = out.routing, configure
            if pairs and wrapped_input:  # the items stay (timestamp, item) pairs on this edge
                routing = getattr(routing, "on_pairs", routing)
            configure = lambda e: inner(routing(e))  # noqa: E731 - the stage's own routing wins
        edge = self._edge(src, dest, chain, configure)
        edge.priority(priority)
        return edge

    def _edge(self, src: Vertex, dest: Vertex, chain: tuple, configure) -> Edge:
        so = self._next_out_ordinal.get(src.name, 0)
        do = self._next_in_ordinal.get(dest.name, 0)
        self._next_out_ordinal[src.name] = so + 1
        self._next_in_ordinal[dest.name] = do + 1
        edge = configure(Edge(src, so, dest, do))
        edge.transform = compile_chain(chain)
        self.dag.edge(edge)
        return edge

    def _set(self, t: Transform, vertex: Vertex, chain: tuple = ()) -> None:
        self.outputs[id(t)] = _Output(vertex, chain)

    # --- one method per transform type ---------------------------------------------------

    def _plan_SourceTransform(self, t: SourceTransform) -> None:
        v = self.dag.new_vertex(t.name, t.source.meta_supplier,
                                t.local_parallelism if t.explicit_parallelism else -1)
        self._set(t, v)
        if t.source.timestamp_fn is native_pair_timestamp:
            self.wrapped.add(id(t))

    def _plan_StatelessTransform(self, t: StatelessTransform) -> None:
        up = t.upstream[0]
        out = self.outputs[id(up)]
        wrapped = id(up) in self.wrapped
        op: StatelessOp = ("chunk", wrapped_step(t.op, t.fn)) if wrapped else (t.op, t.fn)
        if wrapped:
            self.wrapped.add(id(t))
        if t.explicit_parallelism:
            # the user asked for this stage's own parallelism: give it its own vertex
            v = self._vertex(t.name, PassThroughProcessor, t)
            self._connect(t, up, v, wrapped_input=wrapped)
            self.outputs[id(t)] = _Output(v, (op,))
            return
        self.outputs[id(t)] = _Output(out.vertex, out.chain + (op,))

    def _plan_AggregateTransform(self, t: AggregateTransform) -> None:
        op, key_fn = t.op, t.key_fn
        up = t.upstream[0]
        if not op.can_combine:
            v = self._vertex(t.name, lambda: AggregateProcessor(op, key_fn), t,
                             -1 if key_fn is not None else 1)
            if key_fn is None:
                self._connect(t, up, v, lambda e: e.distributed().all_to_one())
            else:
                self._connect(t, up, v, lambda e: e.distributed().partitioned(key_fn))
            self._set(t, v)
            return
        acc = self._vertex(f"{t.name}-accumulate", lambda: AccumulateProcessor(op, key_fn), t)
        self._connect(t, up, acc)
        if key_fn is None:
            comb = self._vertex(t.name, lambda: CombineProcessor(op, False), t, 1)
            self._edge(acc, comb, (), lambda e: e.distributed().all_to_one())
        else:
            comb = self._vertex(t.name, lambda: CombineProcessor(op, True), t)
            self._edge(acc, comb, (), lambda e: e.distributed().partitioned(_first))
        self._set(t, comb)

    def _plan_DistinctTransform(self, t: DistinctTransform) -> None:
        key_fn = t.key_fn
        v = self._vertex(t.name, lambda: DistinctProcessor(key_fn), t)
        self._connect(t, t.upstream[0], v,
                      lambda e: e.distributed().partitioned(key_fn or _identity))
        self._set(t, v)

    def _plan_SortTransform(self, t: SortTransform) -> None:
        key, reverse = t.key, t.reverse
        local = self._vertex(f"{t.name}-local", lambda: SortProcessor(key, reverse), t)
        self._connect(t, t.upstream[0], local)
        merge = self.dag.new_vertex(t.name, lambda: MergeSortedProcessor(key, reverse), 1)
        self._edge(local, merge, (), lambda e: e.distributed().all_to_one())
        self._set(t, merge)

    def _plan_RebalanceTransform(self, t: RebalanceTransform) -> None:
        # no vertex: the next stage's inbound edge becomes distributed (and partitioned)
        out = self.outputs[id(t.upstream[0])]
        key_fn = t.key_fn
        if key_fn is None:
            routing = lambda e: e.distributed().unicast()  # noqa: E731
        else:
            routing = lambda e: e.distributed().partitioned(key_fn)  # noqa: E731
            pair_key = _on_item(key_fn)
            routing.on_pairs = lambda e: e.distributed().partitioned(pair_key)  # type: ignore
        self.outputs[id(t)] = _Output(out.vertex, out.chain, routing)
        if id(t.upstream[0]) in self.wrapped:
            self.wrapped.add(id(t))

    def _plan_MergeTransform(self, t: MergeTransform) -> None:
        v = self._vertex(t.name, PassThroughProcessor, t)
        wrapped = all(id(up) in self.wrapped for up in t.upstream)
        for up in t.upstream:
            self._connect(t, up, v, wrapped_input=wrapped)
        self._set(t, v)
        if wrapped:
            self.wrapped.add(id(t))

    def _plan_HashJoinTransform(self, t: HashJoinTransform) -> None:
        args = (t.key_fn, t.build_key_fn, t.build_value_fn, t.join_fn, t.outer)
        v = self._vertex(t.name, lambda: HashJoinProcessor(*args), t)
        self._connect(t, t.upstream[0], v)
        # the build side is sent to every processor and consumed before the stream
        self._connect(t, t.upstream[1], v, lambda e: e.distributed().broadcast(), priority=-1)
        self._set(t, v)

    def _plan_CustomTransform(self, t: CustomTransform) -> None:
        v = self._vertex(t.name, t.processor_supplier, t)
        self._connect(t, t.upstream[0], v)
        self._set(t, v)

    def _plan_SinkTransform(self, t: SinkTransform) -> None:
        v = self._vertex(t.name, t.sink.meta_supplier, t)
        key_fn = t.sink.partition_key_fn
        if key_fn is None:
            self._connect(t, t.upstream[0], v)
        else:
            self._connect(t, t.upstream[0], v, lambda e: e.distributed().partitioned(key_fn))
        self._set(t, v)


    # --- event time ----------------------------------------------------------------------

    def _resolved_parallelism(self, v: Vertex) -> int:
        n = v.local_parallelism
        if n < 1:
            n = v.meta_supplier.preferred_local_parallelism()
        return n if n >= 1 else self.default_parallelism

    def _side_sink(self, owner: Transform, v: Vertex) -> None:
        """Wires ``owner``'s side-output sink to output ordinal 0 of ``v`` (call this before
        any other outbound edge of ``v`` is made)."""
        sink_t = next(x for x in self.pipeline.transforms
                      if isinstance(x, SideSinkTransform) and x.upstream[0] is owner)
        sv = self._vertex(sink_t.name, sink_t.sink.meta_supplier, sink_t)
        key_fn = sink_t.sink.partition_key_fn
        self._edge(v, sv, (), (lambda e: e.distributed().partitioned(key_fn))
                   if key_fn is not None else (lambda e: e))
        self._set(sink_t, sv)

    def _watermark_step(self, t: TimestampTransform) -> int:
        """The throttling step of ``t``'s watermarks: the gcd of the frame sizes (or session
        gaps) of the windows downstream; 0 when none (a watermark per chunk of items)."""
        downstream: dict[int, list[Transform]] = {}
        for x in self.pipeline.transforms:
            for up in x.upstream:
                downstream.setdefault(id(up), []).append(x)
        step = 0
        seen: set[int] = set()
        todo = [t]
        while todo:
            x = todo.pop()
            for d in downstream.get(id(x), ()):
                if id(d) in seen or isinstance(d, TimestampTransform):
                    continue
                seen.add(id(d))
                if isinstance(d, WindowAggregateTransform):
                    w = d.wdef
                    step = gcd(step, w.gap if w.is_session else w.slide)
                todo.append(d)
        return step

    def _plan_TimestampTransform(self, t: TimestampTransform) -> None:
        up = t.upstream[0]
        up_vertex = self.outputs[id(up)].vertex
        n = self._resolved_parallelism(up_vertex)
        if up_vertex.local_parallelism < 1:
            up_vertex.set_local_parallelism(n)  # the value it resolves to anyway
        ts_fn, factory, idle, step = t.timestamp_fn, t.policy_factory, t.idle_timeout, \
            self._watermark_step(t)
        side = t.side_sink is not None
        name = t.name
        follow = t.upstream_watermarks
        v = self.dag.new_vertex(name, lambda: InsertWatermarksProcessor(
            name, ts_fn, factory, step, idle, side, follow), n)
        if side:
            self._side_sink(t, v)
        # one watermark inserter per upstream processor, so each sees one ordered stream
        self._connect(t, up, v, lambda e: e.isolated(), wrapped_input=ts_fn is None)
        self._set(t, v)
        self.wrapped.add(id(t))

    def _plan_SideSinkTransform(self, t: SideSinkTransform) -> None:
        pass  # wired by the transform that owns the side output

    def _plan_WindowAggregateTransform(self, t: WindowAggregateTransform) -> None:
        for up in t.upstream:
            if id(up) not in self.wrapped:
                raise PipelineError(f"stage {t.name!r}: its input {up.name!r} has no "
                                    "timestamps; call with_timestamps() before windowing")
        wdef, ops, key_fns, name = t.wdef, t.ops, t.key_fns, t.name
        keyed = key_fns is not None
        side = t.side_sink is not None
        chain: tuple = (("flat_map", t.post),) if t.post is not None else ()
        # early results need the open frames in one place: they run in one stage, as in Jet
        if not wdef.is_session and all(op.can_combine for op in ops) \
                and (not wdef.early_results_period or len(ops) > 1):
            kfs = list(key_fns) if keyed else [None] * len(ops)
            acc = self._vertex(f"{name}-accumulate", lambda: FrameAccumulateProcessor(
                name, wdef, ops, kfs, side), t)
            if side:
                self._side_sink(t, acc)
            for up in t.upstream:
                self._connect(t, up, acc, wrapped_input=True)
            op = ops[0] if len(ops) == 1 else composite_operation(ops)
            comb = self._vertex(name, lambda: WindowCombineProcessor(name, wdef, op, keyed), t,
                                -1 if keyed else 1)
            if keyed:
                self._edge(acc, comb, (), lambda e: e.distributed().partitioned(_first))
            else:
                self._edge(acc, comb, (), lambda e: e.distributed().all_to_one())
            self._set(t, comb, chain)
            return
        if len(ops) != 1:
            raise PipelineError(f"stage {name!r}: co-aggregation of session windows is not "
                                "supported; use sliding or tumbling windows")
        op = ops[0]
        key_fn = key_fns[0] if keyed else None
        cls = SessionWindowProcessor if wdef.is_session else SlidingWindowProcessor
        v = self._vertex(name, lambda: cls(name, wdef, op, key_fn, side), t,
                         -1 if keyed else 1)
        if side:
            self._side_sink(t, v)
        if keyed:
            kf = _on_item(key_fn)
            self._connect(t, t.upstream[0], v, lambda e: e.distributed().partitioned(kf),
                          wrapped_input=True)
        else:
            self._connect(t, t.upstream[0], v, lambda e: e.distributed().all_to_one(),
                          wrapped_input=True)
        self._set(t, v, chain)

    def _keyed_vertex(self, t: Transform, key_fn: Any, factory: Any) -> None:
        wrapped = id(t.upstream[0]) in self.wrapped
        if key_fn is None:
            v = self._vertex(t.name, factory, t, 1)
            self._connect(t, t.upstream[0], v, lambda e: e.distributed().all_to_one(),
                          wrapped_input=wrapped)
        else:
            v = self._vertex(t.name, factory, t)
            kf = _on_item(key_fn) if wrapped else key_fn
            self._connect(t, t.upstream[0], v, lambda e: e.distributed().partitioned(kf),
                          wrapped_input=wrapped)
        self._set(t, v)
        if wrapped:
            self.wrapped.add(id(t))

    def _plan_RollingAggregateTransform(self, t: RollingAggregateTransform) -> None:
        wrapped = id(t.upstream[0]) in self.wrapped
        name, op, key_fn = t.name, t.op, t.key_fn
        self._keyed_vertex(t, key_fn,
                           lambda: RollingAggregateProcessor(name, op, key_fn, wrapped))

    def _plan_MapStatefulTransform(self, t: MapStatefulTransform) -> None:
        wrapped = id(t.upstream[0]) in self.wrapped
        if t.ttl is not None and not wrapped:
            raise PipelineError(f"stage {t.name!r}: a ttl needs timestamps on its input")
        name, create_fn, map_fn, key_fn, ttl, on_evict = (
            t.name, t.create_fn, t.map_fn, t.key_fn, t.ttl, t.on_evict)
        self._keyed_vertex(t, key_fn, lambda: MapStatefulProcessor(
            name, create_fn, map_fn, key_fn, wrapped, ttl, on_evict))


def _on_item(key_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A key function over (timestamp, item) pairs."""
    return lambda pair: key_fn(pair[1])


def _identity(x: Any) -> Any:
    return x
