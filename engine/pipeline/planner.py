"""Compiles a pipeline's transforms to a DAG.

Each transform plans itself, in pipeline order (``Transform.add_to_dag(planner)``, Jet's
``addToDag``): it adds its vertices and connects them to the outputs of its upstream
transforms through the :class:`Planner`, then records its own :class:`Output`. The planner
owns what every transform shares: naming and numbering edges, the items' form on each output
(plain, timestamped, a source's native pairs) and the step that takes timestamps off for a
consumer of plain items, the routing a rebalance leaves for the next stage, and the fusion of
stateless stages.

Stateless stages create no vertex: they accumulate as a chain on their upstream's output and
become the fused ``transform`` of each edge that leaves it (see ``fusion.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Iterable

from jetwake.engine.core.dag import DAG, Edge, Vertex
from jetwake.engine.core.errors import PipelineError
from jetwake.engine.pipeline.event_time import key_on_item
from jetwake.engine.pipeline.fusion import FusedChain, FusedStep, changelog_step, unwrap_step
from jetwake.engine.processors.pass_through import PassThroughProcessor

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.pipeline.transforms import Transform

__all__ = ["Planner", "Output", "ItemForm", "Routing"]


class ItemForm(Enum):
    """What the items on a stage's output are."""
    PLAIN = "plain"                # the user's items
    TIMESTAMPED = "timestamped"    # Timestamped(ts, item) values (after with_timestamps)
    NATIVE_PAIRS = "native pairs"  # (ts, item) tuples of a source with native timestamps
    TABLE_CHANGELOG = "table changelog"  # (ts, (key, value)) pairs and TableReady markers


@dataclass(frozen=True)
class Routing:
    """How the next stage's inbound edge routes items, decided by a rebalance: to every
    processor in the cluster, round-robin (no ``key_fn``) or by the partition of the key."""
    key_fn: Callable[[Any], Any] | None

    def configure(self, edge: Edge, form: ItemForm) -> Edge:
        """Sets the routing of ``edge``, whose items have ``form``."""
        edge.distributed()
        if self.key_fn is None:
            return edge.unicast()
        key_fn = self.key_fn if form is ItemForm.PLAIN else key_on_item(self.key_fn)
        return edge.partitioned(key_fn)


@dataclass(frozen=True)
class Output:
    """Where a stage's items come from: a vertex, the stateless stages not yet applied to its
    items, their form, and the routing the next stage's inbound edge must use."""
    vertex: Vertex
    chain: tuple[FusedStep, ...] = ()
    form: ItemForm = ItemForm.PLAIN
    routing: Routing | None = None


def _same(edge: Edge) -> Edge:
    return edge


class Planner:
    """Builds the DAG of a list of transforms (see the module docstring)."""

    def __init__(self, transforms: Iterable["Transform"], default_parallelism: int) -> None:
        self.transforms: list[Transform] = list(transforms)
        self.default_parallelism = default_parallelism
        self.dag = DAG()
        self._outputs: dict[Transform, Output] = {}
        self._next_out_ordinal: dict[str, int] = {}
        self._next_in_ordinal: dict[str, int] = {}
        # fused user stages already counted on an edge (a stage feeding two consumers runs on
        # both edges and is counted on the first), and the vertex each one runs in
        self._reported: set[FusedStep] = set()
        self._fused_stages: dict[str, str] = {}

    def build(self) -> DAG:
        for t in self.transforms:
            t.add_to_dag(self)
        vertices = {v.name for v in self.dag.vertices}
        for stage, vertex in self._fused_stages.items():
            if stage in vertices:
                raise PipelineError(
                    f"stage {stage!r} (fused into vertex {vertex!r}) has the name of a vertex "
                    "of another stage, so the job's metrics could not tell them apart; rename "
                    "one of them with set_name()")
        return self.dag

    # --- outputs ------------------------------------------------------------------------------

    def output(self, t: "Transform") -> Output:
        """The output of ``t``, planned before (transforms are planned in pipeline order)."""
        return self._outputs[t]

    def set_output(self, t: "Transform", output: Output) -> None:
        self._outputs[t] = output

    # --- vertices and edges ---------------------------------------------------------------

    def vertex(self, name: str, processor: Any, t: "Transform",
               parallelism: int = -1) -> Vertex:
        """A new vertex of ``t``; ``parallelism`` -1 takes ``t``'s explicit parallelism, if
        the user set one."""
        if parallelism == -1 and t.explicit_parallelism:
            parallelism = t.local_parallelism
        v = self.dag.new_vertex(name, processor, parallelism)
        role = name[len(t.name) + 1:] if name.startswith(f"{t.name}-") else ""
        v.kind = f"{t.kind}/{role}" if role else t.kind
        v.shape = t.state_shape() or None
        return v

    def resolved_parallelism(self, v: Vertex) -> int:
        """The local parallelism ``v`` will run with."""
        n = v.local_parallelism
        if n < 1:
            n = v.meta_supplier.preferred_local_parallelism()
        return n if n >= 1 else self.default_parallelism

    def connect(self, t: "Transform", upstream: "Transform", dest: Vertex,
                configure: Callable[[Edge], Edge] = _same, priority: int = 0,
                takes: ItemForm | None = ItemForm.PLAIN) -> Edge:
        """Connects ``upstream``'s output to ``dest``, a vertex of ``t``, applying the
        stateless stages pending on that output. ``takes``: the form of items ``dest``
        works on (timestamps are taken off on the edge for a consumer of plain items); None
        for whatever form they have."""
        out = self._outputs[upstream]
        chain = out.chain
        form = out.form
        if takes is not None and form is not takes:
            if takes is not ItemForm.PLAIN:
                raise PipelineError(f"stage {t.name!r}: its input {upstream.name!r} has no "
                                    "timestamps; call with_timestamps() before it")
            chain += (unwrap_step(upstream.name) if form is not ItemForm.TABLE_CHANGELOG
                      else changelog_step(upstream.name),)
            form = ItemForm.PLAIN
        src = out.vertex
        if any(e.source is src and e.destination is dest for e in self.dag.edges):
            # a second edge between the same pair (a self-merge or self-join) is not allowed:
            # route this one through a pass-through vertex
            hop = self.dag.new_vertex(f"{t.name}-via-{src.name}", PassThroughProcessor)
            self.edge(src, hop, chain)
            src, chain = hop, ()
        if out.routing is not None:
            routing, own = out.routing, configure
            # the stage's own routing (applied last) wins over the rebalance's
            configure = lambda e: own(routing.configure(e, form))  # noqa: E731
        edge = self.edge(src, dest, chain, configure)
        edge.priority(priority)
        return edge

    def edge(self, src: Vertex, dest: Vertex, chain: tuple[FusedStep, ...] = (),
             configure: Callable[[Edge], Edge] = _same) -> Edge:
        """A new edge from ``src`` to ``dest`` on the next free ordinals of each, running the
        fused ``chain``."""
        so = self._next_out_ordinal.get(src.name, 0)
        do = self._next_in_ordinal.get(dest.name, 0)
        self._next_out_ordinal[src.name] = so + 1
        self._next_in_ordinal[dest.name] = do + 1
        edge = configure(Edge(src, so, dest, do))
        if chain:
            reported = []
            for step in chain:
                first = step.user_stage and step not in self._reported
                if first:
                    self._reported.add(step)
                    self._fused_stages[step.stage] = src.name
                reported.append(first)
            edge.transform = FusedChain(chain, src.name, reported)
        self.dag.edge(edge)
        return edge
