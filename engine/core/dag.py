"""The DAG model: vertices running processors, edges routing items between them (as in Jet)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Iterator

from jetwake.engine.core.meta_supplier import ProcessorMetaSupplier, as_meta_supplier

__all__ = ["DAG", "Vertex", "Edge", "RoutingPolicy", "DagValidationError"]


class DagValidationError(ValueError):
    """The DAG cannot run; the message names the vertex or edge at fault."""


class RoutingPolicy(Enum):
    UNICAST = "unicast"          # any one downstream processor, whichever has room
    PARTITIONED = "partitioned"  # the processor owning the item key's partition
    BROADCAST = "broadcast"      # every downstream processor
    ALL_TO_ONE = "all_to_one"    # one processor, the same for every upstream processor
    ISOLATED = "isolated"        # upstream processor i to downstream processor i only


class Vertex:
    """A step of the computation, run by ``local_parallelism`` processors on every member."""

    def __init__(self, name: str, processor: Any, local_parallelism: int = -1) -> None:
        if not isinstance(name, str) or not name:
            raise DagValidationError(f"a vertex name must be a non-empty string, got {name!r}")
        self.name = name
        self.meta_supplier: ProcessorMetaSupplier = as_meta_supplier(
            processor, f"vertex '{name}'")
        self.local_parallelism = -1
        self.set_local_parallelism(local_parallelism)
        #: the kind of pipeline stage this vertex belongs to ("map-stateful", "source", ...;
        #: a part of a stage of several vertices adds its role: "aggregate/accumulate"); None
        #: for a vertex of the core API. Saved in each snapshot's commit record, so that a
        #: job started from a snapshot can tell whose state it takes over.
        self.kind: str | None = None
        #: what the form of its saved state depends on besides its kind ("keyed", "keyless",
        #: a window's definition); None when nothing: saved state fits a vertex of the same
        #: kind only when their shapes are the same
        self.shape: str | None = None

    def set_local_parallelism(self, n: int) -> "Vertex":
        if not isinstance(n, int) or isinstance(n, bool) or (n < 1 and n != -1):
            raise DagValidationError(
                f"vertex '{self.name}': local_parallelism must be a positive int or -1 "
                f"(the default), got {n!r}")
        self.local_parallelism = n
        return self

    def __repr__(self) -> str:
        return f"Vertex({self.name!r}, local_parallelism={self.local_parallelism})"


class Edge:
    """Connects an output ordinal of one vertex to an input ordinal of another.

    Local and unicast by default; ``distributed()``, ``partitioned(key_fn)``, ``broadcast()``,
    ``all_to_one()`` and ``isolated()`` change that, and ``priority(n)`` orders consumption:
    a processor drains every edge of a lower priority number before a higher one.
    """

    def __init__(self, source: Vertex, source_ordinal: int, destination: Vertex | None,
                 dest_ordinal: int) -> None:
        self.source = source
        self.source_ordinal = source_ordinal
        # None only between from_() and to(): DAG.edge() refuses an edge without a destination
        self._destination = destination
        self.dest_ordinal = dest_ordinal
        self.routing = RoutingPolicy.UNICAST
        self.key_fn: Callable[[Any], Any] | None = None
        self.is_distributed = False
        self.edge_priority = 0
        self.queue_size = 64  # in chunks
        # fused stateless stages (list -> list), applied to each chunk before routing; an
        # EdgeTransform (engine/core/edge_transform.py) gets one instance per processor
        self.transform: Callable[[list[Any]], list[Any]] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        # an edge pickled before its destination became a property (a DAG in the job record
        # of an older version) keeps it under its old name
        if "destination" in state:
            state["_destination"] = state.pop("destination")
        self.__dict__.update(state)

    @classmethod
    def between(cls, source: Vertex, destination: Vertex) -> "Edge":
        return cls(source, 0, destination, 0)

    @classmethod
    def from_(cls, source: Vertex, ordinal: int = 0) -> "Edge":
        return cls(source, ordinal, None, 0)

    @property
    def destination(self) -> Vertex:
        """The vertex this edge feeds (an edge made by ``from_()`` has one after ``to()``)."""
        if self._destination is None:
            raise DagValidationError(f"{self}: the edge has no destination vertex; call to()")
        return self._destination

    def to(self, destination: Vertex, ordinal: int = 0) -> "Edge":
        self._destination = destination
        self.dest_ordinal = ordinal
        return self

    def distributed(self) -> "Edge":
        self.is_distributed = True
        return self

    def local(self) -> "Edge":
        self.is_distributed = False
        return self

    def partitioned(self, key_fn: Callable[[Any], Any]) -> "Edge":
        if not callable(key_fn):
            raise TypeError(f"{self}: partitioned() needs a callable key function, "
                            f"got {type(key_fn).__qualname__}")
        self.routing = RoutingPolicy.PARTITIONED
        self.key_fn = key_fn
        return self

    def broadcast(self) -> "Edge":
        self.routing = RoutingPolicy.BROADCAST
        return self

    def all_to_one(self) -> "Edge":
        self.routing = RoutingPolicy.ALL_TO_ONE
        return self

    def isolated(self) -> "Edge":
        self.routing = RoutingPolicy.ISOLATED
        return self

    def unicast(self) -> "Edge":
        self.routing = RoutingPolicy.UNICAST
        return self

    def priority(self, priority: int) -> "Edge":
        self.edge_priority = int(priority)
        return self

    def __repr__(self) -> str:
        dest = self._destination.name if self._destination is not None else "?"
        return (f"Edge({self.source.name}[{self.source_ordinal}] -> "
                f"{dest}[{self.dest_ordinal}])")


class DAG:
    """Vertices and the edges between them; validated when a job is submitted."""

    def __init__(self) -> None:
        self._vertices: dict[str, Vertex] = {}
        self._edges: list[Edge] = []

    def new_vertex(self, name: str, processor: Any, local_parallelism: int = -1) -> Vertex:
        return self.vertex(Vertex(name, processor, local_parallelism))

    def vertex(self, vertex: Vertex) -> Vertex:
        if vertex.name in self._vertices:
            raise DagValidationError(f"duplicate vertex name '{vertex.name}': names must be "
                                     "unique within a DAG")
        self._vertices[vertex.name] = vertex
        return vertex

    def edge(self, edge: Edge) -> "DAG":
        for end, v in (("source", edge.source), ("destination", edge._destination)):
            if v is None:
                raise DagValidationError(f"{edge}: the edge has no {end} vertex")
            if self._vertices.get(v.name) is not v:
                raise DagValidationError(
                    f"{edge}: {end} vertex '{v.name}' is not in this DAG; add it with "
                    "dag.vertex() or dag.new_vertex() first")
        self._edges.append(edge)
        return self

    @property
    def vertices(self) -> list[Vertex]:
        return list(self._vertices.values())

    @property
    def edges(self) -> list[Edge]:
        return list(self._edges)

    def get_vertex(self, name: str) -> Vertex:
        return self._vertices[name]

    def inbound_edges(self, vertex: Vertex) -> list[Edge]:
        return sorted((e for e in self._edges if e.destination is vertex),
                      key=lambda e: e.dest_ordinal)

    def outbound_edges(self, vertex: Vertex) -> list[Edge]:
        return sorted((e for e in self._edges if e.source is vertex),
                      key=lambda e: e.source_ordinal)

    def validate(self) -> None:
        """Raises :class:`DagValidationError` for the first problem found."""
        if not self._vertices:
            raise DagValidationError("the DAG has no vertices")
        seen_pairs: set[tuple[str, str]] = set()
        for e in self._edges:
            pair = (e.source.name, e.destination.name)
            if e.source is e.destination:
                raise DagValidationError(f"{e}: an edge from a vertex to itself is a cycle")
            if pair in seen_pairs:
                raise DagValidationError(
                    f"{e}: there is already an edge from '{pair[0]}' to '{pair[1]}'; at most "
                    "one edge may join two vertices (use ordinals on one edge, or a merge)")
            seen_pairs.add(pair)
        for v in self._vertices.values():
            for kind, edges, attr in (("input", self.inbound_edges(v), "dest_ordinal"),
                                      ("output", self.outbound_edges(v), "source_ordinal")):
                ordinals = sorted(getattr(e, attr) for e in edges)
                if ordinals != list(range(len(ordinals))):
                    raise DagValidationError(
                        f"vertex '{v.name}': {kind} ordinals must be 0..{len(ordinals) - 1} "
                        f"without gaps or repeats, got {ordinals}")
            if len(self._vertices) > 1 and not self.inbound_edges(v) \
                    and not self.outbound_edges(v):
                raise DagValidationError(
                    f"vertex '{v.name}' is not connected to any other vertex: connect it with "
                    "an edge or remove it")
        for e in self._edges:
            if e.routing is RoutingPolicy.ISOLATED and \
                    e.source.local_parallelism != e.destination.local_parallelism:
                raise DagValidationError(
                    f"{e}: an isolated edge needs equal local parallelism on both ends "
                    f"({e.source.local_parallelism} vs {e.destination.local_parallelism})")
        self.topological_order()

    def topological_order(self) -> list[Vertex]:
        """Vertices with every upstream vertex first; raises on a cycle."""
        indegree = {name: 0 for name in self._vertices}
        for e in self._edges:
            indegree[e.destination.name] += 1
        ready = [v for v in self._vertices.values() if indegree[v.name] == 0]
        order: list[Vertex] = []
        while ready:
            v = ready.pop(0)
            order.append(v)
            for e in self.outbound_edges(v):
                indegree[e.destination.name] -= 1
                if indegree[e.destination.name] == 0:
                    ready.append(e.destination)
        if len(order) != len(self._vertices):
            stuck = sorted(n for n, d in indegree.items() if d > 0)
            raise DagValidationError(f"the DAG has a cycle through vertices {stuck}")
        return order

    def __iter__(self) -> Iterator[Vertex]:
        return iter(self._vertices.values())

    def __repr__(self) -> str:
        lines = ["DAG:"]
        for v in self._vertices.values():
            lines.append(f"  {v!r}")
        for e in self._edges:
            lines.append(f"  {e!r} {e.routing.value}{' distributed' if e.is_distributed else ''}"
                         f"{f' priority={e.edge_priority}' if e.edge_priority else ''}")
        return "\n".join(lines)
