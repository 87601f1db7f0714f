"""Compiles a Pipeline to a DAG.

Stateless stages create no vertex: they accumulate as a chain on their upstream's output and
become the fused ``transform`` of the edge that leaves it (see ``fusion.py``). A keyed
aggregation becomes two vertices, accumulate and combine, joined by a distributed partitioned
edge (seed 003); a keyless one joins them with an all-to-one edge; an operation without
``combine`` runs in one stage after the partitioned edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable

from ..dag import DAG, Edge, Vertex
from ..processors.aggregation import AccumulateProcessor, AggregateProcessor, CombineProcessor
from ..processors.distinct import DistinctProcessor
from ..processors.hash_join import HashJoinProcessor
from ..processors.pass_through import PassThroughProcessor
from ..processors.sort import MergeSortedProcessor, SortProcessor
from .fusion import StatelessOp, compile_chain
from .pipeline import Pipeline, PipelineError
from .transforms import (
    AggregateTransform, CustomTransform, DistinctTransform, HashJoinTransform, MergeTransform,
    RebalanceTransform, SinkTransform, SortTransform, SourceTransform, StatelessTransform,
    Transform,
)

__all__ = ["Planner"]

_first = itemgetter(0)


@dataclass(frozen=True)
class _Output:
    """Where a stage's items come from: a vertex, plus stateless stages not yet applied."""
    vertex: Vertex
    chain: tuple[StatelessOp, ...] = ()


class Planner:
    def __init__(self, pipeline: Pipeline, default_parallelism: int) -> None:
        self.pipeline = pipeline
        self.default_parallelism = default_parallelism
        self.dag = DAG()
        self.outputs: dict[int, _Output] = {}
        self._next_out_ordinal: dict[str, int] = {}
        self._next_in_ordinal: dict[str, int] = {}

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
                 configure: Callable[[Edge], Edge] = lambda e: e, priority: int = 0) -> Edge:
        out = self.outputs[id(upstream)]
        src = out.vertex
        if any(e.source is src and e.destination is dest for e in self.dag.edges):
            # a second edge between the same pair (a self-merge or self-join) is not allowed:
            # route this one through a pass-through vertex
            hop = self.dag.new_vertex(f"{t.name}-via-{src.name}", PassThroughProcessor)
            self._edge(src, hop, out.chain, lambda e: e)
            src, chain = hop, ()
        else:
            chain = out.chain
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

    def _plan_StatelessTransform(self, t: StatelessTransform) -> None:
        out = self.outputs[id(t.upstream[0])]
        chain = out.chain + ((t.op, t.fn),)
        if t.explicit_parallelism:
            # the user asked for this stage's own parallelism: give it its own vertex
            v = self._vertex(t.name, PassThroughProcessor, t)
            self._connect(t, t.upstream[0], v)
            self.outputs[id(t)] = _Output(v, ((t.op, t.fn),))
            return
        self.outputs[id(t)] = _Output(out.vertex, chain)

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
        key_fn = t.key_fn
        v = self._vertex(t.name, PassThroughProcessor, t)
        if key_fn is None:
            self._connect(t, t.upstream[0], v, lambda e: e.distributed())
        else:
            self._connect(t, t.upstream[0], v, lambda e: e.distributed().partitioned(key_fn))
        self._set(t, v)

    def _plan_MergeTransform(self, t: MergeTransform) -> None:
        v = self._vertex(t.name, PassThroughProcessor, t)
        for up in t.upstream:
            self._connect(t, up, v)
        self._set(t, v)

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


def _identity(x: Any) -> Any:
    return x
