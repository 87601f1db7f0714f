"""A test's hold on a sink's processors: one made the way a job makes it (meta-supplier,
supplier, init), for tests that drive the processor contract by hand (process,
save_to_snapshot, the two commit phases, a "crash" by dropping the processor); or, in a real
job, the processors of one class replaced by a subclass that, say, kills its process at a
chosen protocol point."""

from __future__ import annotations

from typing import Any

from jetwake.engine.core.meta_supplier import MetaSupplierContext, SupplierContext
from jetwake.engine.core.processor import Outbox, ProcessorContext
from jetwake.snapshot.protocol.snapshot_context import SnapshotContext


def sink_processor(sink: Any, job_id: str, vertex: str, *, restored_id: int = -1,
                   guarantee: str = "exactly_once", index: int = 0,
                   total: int = 1) -> tuple[Any, SnapshotContext]:
    """Processor ``index`` of ``total`` of ``sink`` in job ``job_id``, initialised as a member
    would (restoring snapshot ``restored_id``, -1 for none), with its snapshot context."""
    meta = sink.meta_supplier
    meta.init(MetaSupplierContext(job_id, "job", vertex, total, total, 1, guarantee))
    supplier = meta.get([0])(0)
    supplier.init(SupplierContext(job_id, "job", vertex, total, total, 0, 1, guarantee))
    proc = supplier.get(total)[index]
    proc.outbox = Outbox(0)
    snap = SnapshotContext(restored_id)
    proc.init(ProcessorContext(
        job_id=job_id, job_name="job", vertex_name=vertex, global_processor_index=index,
        local_processor_index=index, local_parallelism=total, total_parallelism=total,
        member_index=0, member_count=1, processing_guarantee=guarantee, snapshot=snap))
    return proc, snap


def replace_processor_class(sink: Any, cls: type, replacement: type) -> None:
    """Makes the processors of class ``cls`` that ``sink`` creates instances of
    ``replacement`` (a subclass) instead. The sink's supplier picks the processor class when
    the job starts (by its guarantee), so the swap wraps that choice."""
    supplier = sink.meta_supplier.supplier
    inner_choose = supplier.choose

    def choose(ctx: Any) -> Any:
        factory = inner_choose(ctx)

        def make() -> Any:
            proc = factory()
            if type(proc) is cls:
                proc.__class__ = replacement
            return proc
        return make
    supplier.choose = choose
