"""Turns a validated DAG into this member's tasklets: processors, queues and their wiring.

Every vertex runs ``local_parallelism`` processors on each member; processor ``i`` of member
``m`` has the global index ``m * local_parallelism + i``. Each edge becomes one queue per pair of
connected processors (Jet's conveyors), and a partitioned edge routes by the destination
vertex's partition table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jetwake.engine.core.dag import DAG, DagValidationError, Edge, RoutingPolicy, Vertex
from jetwake.engine.core.edge_transform import for_processor
from jetwake.engine.core.meta_supplier import MetaSupplierContext, SupplierContext
from jetwake.engine.core.partitioning import (
    partition_of, partitions_of_processor, processor_partition_table,
)
from jetwake.engine.core.processor import ProcessorContext
from jetwake.engine.execution.conveyor import ChunkQueue
from jetwake.engine.execution.inbound import InboundEdgeStream
from jetwake.engine.execution.outbound import OutboundEdgeStream
from jetwake.engine.execution.tasklet import ProcessorTasklet
from jetwake.engine.execution.watermark_coalescer import WatermarkCoalescer

__all__ = ["PlanContext", "build_tasklets", "resolve_parallelism"]


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
    snapshot: Any = None
    state_factory: Any = None
    state_backend: str = "memory"
    snapshot_interval_ms: int = 0


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
    processors = {v.name: _create_processors(v, par[v.name], ctx) for v in dag}
    queues = {id(e): _create_queues(e, par) for e in dag.edges}
    align = ctx.processing_guarantee == "exactly_once"
    tasklets = []
    for v in dag.topological_order():
        inbound_edges = dag.inbound_edges(v)
        outbound_edges = dag.outbound_edges(v)
        n = par[v.name]
        for i, proc in enumerate(processors[v.name]):
            queue_lists = [_inbound_queues(e, i, par, queues[id(e)]) for e in inbound_edges]
            coalescer = WatermarkCoalescer(sum(len(q) for q in queue_lists))
            inbound = []
            offset = 0
            for e, qs in zip(inbound_edges, queue_lists):
                inbound.append(InboundEdgeStream(e.dest_ordinal, e.edge_priority, qs, coalescer,
                                                 offset, align))
                offset += len(qs)
            outbound = [_outbound_stream(e, i, par, queues[id(e)]) for e in outbound_edges]
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


def _create_processors(v: Vertex, count: int, ctx: PlanContext) -> list:
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
        member=ctx.member))
    procs = list(supplier.get(count))
    if len(procs) != count:
        raise ValueError(f"vertex '{v.name}': its supplier returned {len(procs)} processors, "
                         f"expected {count}")
    return procs


def _create_queues(e: Edge, par: dict[str, int]) -> dict[tuple[int, int], ChunkQueue]:
    pu, pd = par[e.source.name], par[e.destination.name]
    name = f"{e.source.name}->{e.destination.name}"
    if e.routing is RoutingPolicy.ISOLATED:
        return {(i, i): ChunkQueue(e.queue_size, f"{name}[{i}]") for i in range(pu)}
    return {(u, d): ChunkQueue(e.queue_size, f"{name}[{u}->{d}]")
            for u in range(pu) for d in range(pd)}


def _inbound_queues(e: Edge, d: int, par: dict[str, int],
                    queues: dict[tuple[int, int], ChunkQueue]) -> list[ChunkQueue]:
    if e.routing is RoutingPolicy.ISOLATED:
        return [queues[(d, d)]]
    return [queues[(u, d)] for u in range(par[e.source.name])]


def _outbound_stream(e: Edge, u: int, par: dict[str, int],
                     queues: dict[tuple[int, int], ChunkQueue]) -> OutboundEdgeStream:
    pd = par[e.destination.name]
    if e.routing is RoutingPolicy.ISOLATED:
        return OutboundEdgeStream(e.source_ordinal, [queues[(u, u)]], e.routing,
                                  transform=for_processor(e.transform))
    targets = [queues[(u, d)] for d in range(pd)]
    table = None
    if e.routing is RoutingPolicy.PARTITIONED:
        table = processor_partition_table(1, pd)
    elif e.routing is RoutingPolicy.ALL_TO_ONE:
        table = (processor_partition_table(1, pd)[partition_of(e.destination.name)],)
    # each processor applies its own instance of the edge's function (its own counters)
    return OutboundEdgeStream(e.source_ordinal, targets, e.routing, e.key_fn, table,
                              for_processor(e.transform))
