"""Turns a validated DAG into this member's tasklets: processors, queues and their wiring.

Every vertex runs ``local_parallelism`` processors on each member; processor ``i`` of member
``m`` has the global index ``m * local_parallelism + i``. Each edge becomes one queue per pair of
connected processors (Jet's conveyors), and a partitioned edge routes by the destination
vertex's partition table.

In a cluster (``member_count > 1``) a *distributed* edge also connects each processor with the
processors of the other members: the plan asks ``PlanContext.remote`` for the sending end of
each such pair (a queue-like object that ships entries over the network) and for the receiving
end (a local queue the network fills). A downstream processor therefore sees one inbound queue
per upstream processor of the whole cluster, so barrier alignment and the end of a stream work
exactly as inside one member. Edges that are not distributed stay inside the member.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from jetwake.engine.core.dag import DAG, DagValidationError, Edge, RoutingPolicy, Vertex
from jetwake.engine.core.edge_transform import for_processor
from jetwake.engine.core.meta_supplier import MetaSupplierContext, SupplierContext
from jetwake.engine.core.partitioning import (
    partition_of, partitions_of_processor, processor_partition_table,
)
from jetwake.engine.core.processor import Processor, ProcessorContext
from jetwake.engine.execution.conveyor import ChunkQueue
from jetwake.engine.execution.inbound import InboundEdgeStream
from jetwake.engine.execution.outbound import OutboundEdgeStream, QueueEnd
from jetwake.engine.execution.tasklet import ProcessorTasklet
from jetwake.engine.execution.watermark_coalescer import WatermarkCoalescer
from jetwake.snapshot.protocol.snapshot_context import SnapshotContext
from jetwake.snapshot.state.keyed_state import KeyedStateBackend

__all__ = ["PlanContext", "RemoteEdges", "build_tasklets", "resolve_parallelism",
           "local_partition_table"]


class RemoteEdges(Protocol):
    """The ends of distributed edges that cross to another member (one per processor pair).

    ``edge_index`` is the edge's position in ``DAG.edges``, the same on every member."""

    def outbound(self, edge_index: int, src: int, dst: int, dst_member: int) -> QueueEnd:
        """The sending end towards processor ``dst`` (global index) on ``dst_member``."""

    def inbound(self, edge_index: int, src: int, dst: int, src_member: int) -> ChunkQueue:
        """The receiving end from processor ``src`` (global index) on ``src_member``."""


@dataclass
class PlanContext:
    job_id: str
    job_name: str
    processing_guarantee: str
    default_parallelism: int
    member: Any = None
    member_index: int = 0
    member_count: int = 1
    outbox_capacity: int = 4096
    snapshot: SnapshotContext | None = None
    state_factory: Callable[[str, int, str], KeyedStateBackend] | None = None
    state_backend: str = "memory"
    snapshot_interval_ms: int = 0
    remote: RemoteEdges | None = None
    execution_key: str = ""


def resolve_parallelism(dag: DAG, default: int) -> dict[str, int]:
    result = {}
    for v in dag:
        n = v.local_parallelism
        if n < 1:
            n = v.meta_supplier.preferred_local_parallelism()
        if n < 1:
            n = default
        result[v.name] = n
    return result


def build_tasklets(dag: DAG, ctx: PlanContext) -> list[ProcessorTasklet]:
    """Creates and wires this member's processors; processors are not yet ``init()``-ed."""
    par = resolve_parallelism(dag, ctx.default_parallelism)
    for e in dag.edges:
        if e.routing is RoutingPolicy.ISOLATED and par[e.source.name] != par[e.destination.name]:
            raise DagValidationError(
                f"{e}: an isolated edge needs equal parallelism on both ends, got "
                f"{par[e.source.name]} and {par[e.destination.name]}; set the same "
                "local_parallelism on both vertices")
    if ctx.member_count > 1 and ctx.remote is None:
        raise ValueError("a plan for several members needs PlanContext.remote")
    processors = {v.name: _create_processors(v, par[v.name], ctx) for v in dag}
    wiring = [_EdgeWiring(i, e, par, ctx) for i, e in enumerate(dag.edges)]
    by_edge = {id(w.edge): w for w in wiring}
    align = ctx.processing_guarantee == "exactly_once"
    tasklets = []
    for v in dag.topological_order():
        inbound_edges = dag.inbound_edges(v)
        outbound_edges = dag.outbound_edges(v)
        n = par[v.name]
        for i, proc in enumerate(processors[v.name]):
            queue_lists = [by_edge[id(e)].inbound_queues(i) for e in inbound_edges]
            coalescer = WatermarkCoalescer(sum(len(q) for q in queue_lists))
            inbound = []
            offset = 0
            for e, qs in zip(inbound_edges, queue_lists):
                inbound.append(InboundEdgeStream(e.dest_ordinal, e.edge_priority, qs, coalescer,
                                                 offset, align))
                offset += len(qs)
            outbound = [by_edge[id(e)].outbound_stream(i) for e in outbound_edges]
            global_index = ctx.member_index * n + i
            pctx = ProcessorContext(
                job_id=ctx.job_id, job_name=ctx.job_name, vertex_name=v.name,
                global_processor_index=global_index, local_processor_index=i,
                local_parallelism=n, total_parallelism=n * ctx.member_count,
                member_index=ctx.member_index, member_count=ctx.member_count,
                processing_guarantee=ctx.processing_guarantee,
                owned_partitions=tuple(partitions_of_processor(
                    ctx.member_index, ctx.member_count, i, n)),
                member=ctx.member, snapshot=ctx.snapshot, state_factory=ctx.state_factory,
                state_backend=ctx.state_backend, snapshot_interval_ms=ctx.snapshot_interval_ms)
            tasklets.append(ProcessorTasklet(proc, pctx, inbound, outbound, coalescer,
                                             ctx.outbox_capacity, ctx.snapshot))
    return tasklets


def local_partition_table(member_index: int, member_count: int,
                          local_parallelism: int) -> tuple[int, ...]:
    """Partition -> local processor index for an edge that stays inside a member.

    A partition the member owns goes to the local processor that owns it in the cluster-wide
    table, so that the processor holding a key's state is the one a restore gives it to; a
    partition owned by another member (its items reached this member by a local edge) is spread
    over the local processors. With one member this is the cluster-wide table."""
    table = processor_partition_table(member_count, local_parallelism)
    first = member_index * local_parallelism
    return tuple(g - first if 0 <= g - first < local_parallelism else p % local_parallelism
                 for p, g in enumerate(table))


class _EdgeWiring:
    """The queues of one edge on this member, between every pair of connected processors.

    Local processors have local indices; a distributed edge in a cluster addresses the
    processors of every member by global index (member ``m``'s processor ``i`` is
    ``m * parallelism + i``)."""

    def __init__(self, index: int, e: Edge, par: dict[str, int], ctx: PlanContext) -> None:
        self.index = index
        self.edge = e
        self.pu, self.pd = par[e.source.name], par[e.destination.name]
        self.ctx = ctx
        # the ends crossing to other members, for a distributed edge in a cluster (a plan for
        # several members has them, build_tasklets checks); None for an edge that stays here
        cluster = e.is_distributed and ctx.member_count > 1 \
            and e.routing is not RoutingPolicy.ISOLATED
        self.remote = ctx.remote if cluster else None
        name = f"{e.source.name}->{e.destination.name}"
        self.name = name
        if e.routing is RoutingPolicy.ISOLATED:
            self.local = {(i, i): ChunkQueue(e.queue_size, f"{name}[{i}]")
                          for i in range(self.pu)}
        else:
            self.local = {(u, d): ChunkQueue(e.queue_size, f"{name}[{u}->{d}]")
                          for u in range(self.pu) for d in range(self.pd)}

    def inbound_queues(self, d: int) -> list[ChunkQueue]:
        e = self.edge
        if e.routing is RoutingPolicy.ISOLATED:
            return [self.local[(d, d)]]
        remote = self.remote
        if remote is None:
            return [self.local[(u, d)] for u in range(self.pu)]
        m, pu = self.ctx.member_index, self.pu
        dst = m * self.pd + d
        out = []
        for member in range(self.ctx.member_count):
            for u in range(pu):
                if member == m:
                    out.append(self.local[(u, d)])
                else:
                    out.append(remote.inbound(
                        self.index, member * pu + u, dst, member))
        return out

    def outbound_stream(self, u: int) -> OutboundEdgeStream:
        e = self.edge
        transform = for_processor(e.transform)  # each processor its own instance (counters)
        if e.routing is RoutingPolicy.ISOLATED:
            return OutboundEdgeStream(e.source_ordinal, [self.local[(u, u)]], e.routing,
                                      transform=transform)
        pd = self.pd
        m, count = self.ctx.member_index, self.ctx.member_count
        remote = self.remote
        targets: list[QueueEnd]
        if remote is not None:
            src = m * self.pu + u
            targets = []
            for member in range(count):
                for d in range(pd):
                    if member == m:
                        targets.append(self.local[(u, d)])
                    else:
                        targets.append(remote.outbound(
                            self.index, src, member * pd + d, member))
            table: Sequence[int] = processor_partition_table(count, pd)
        else:
            targets = [self.local[(u, d)] for d in range(pd)]
            table = local_partition_table(m, count, pd)
        if e.routing is RoutingPolicy.PARTITIONED:
            return OutboundEdgeStream(e.source_ordinal, targets, e.routing, e.key_fn, table,
                                      transform)
        if e.routing is RoutingPolicy.ALL_TO_ONE:
            # the one processor the whole cluster sends to: the owner of the vertex name's
            # partition (on this member only, for an edge that stays local)
            table = (table[partition_of(e.destination.name)],)
            return OutboundEdgeStream(e.source_ordinal, targets, e.routing, None, table,
                                      transform)
        if e.routing is RoutingPolicy.UNICAST and remote is not None:
            # a distributed unicast edge feeds every member's processors, local ones first
            targets = targets[m * pd:(m + 1) * pd] + targets[:m * pd] + targets[(m + 1) * pd:]
        return OutboundEdgeStream(e.source_ordinal, targets, e.routing, e.key_fn, None,
                                  transform)


def _create_processors(v: Vertex, count: int, ctx: PlanContext) -> list[Processor]:
    meta = v.meta_supplier
    meta.init(MetaSupplierContext(
        job_id=ctx.job_id, job_name=ctx.job_name, vertex_name=v.name, local_parallelism=count,
        total_parallelism=count * ctx.member_count, member_count=ctx.member_count,
        processing_guarantee=ctx.processing_guarantee))
    supplier = meta.get(list(range(ctx.member_count)))(ctx.member_index)
    supplier.init(SupplierContext(
        job_id=ctx.job_id, job_name=ctx.job_name, vertex_name=v.name, local_parallelism=count,
        total_parallelism=count * ctx.member_count, member_index=ctx.member_index,
        member_count=ctx.member_count, processing_guarantee=ctx.processing_guarantee,
        member=ctx.member, execution_key=ctx.execution_key))
    procs = list(supplier.get(count))
    if len(procs) != count:
        raise ValueError(f"vertex '{v.name}': its supplier returned {len(procs)} processors, "
                         f"expected {count}")
    return procs
