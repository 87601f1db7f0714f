"""Restoring saved state into a new execution, whatever its parallelism.

Each saved entry goes to the processor that owns the partition of its key in the new layout;
an entry under a :class:`BroadcastKey` goes to every processor of its vertex. State is matched
to vertices by name, so a changed pipeline restores if its stateful stages keep their names.
A vertex all of whose processors had completed when the snapshot was taken does not run again:
its processors are restored and end at once, so they never emit their results a second time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jetwake.engine.core.errors import SnapshotError
from jetwake.engine.core.partitioning import partition_of, processor_partition_table
from jetwake.engine.core.processor import BroadcastKey, Inbox

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.execution.tasklet import ProcessorTasklet
    from jetwake.snapshot.store.snapshot_store import SnapshotReader

__all__ = ["restore_state"]


def restore_state(tasklets: "list[ProcessorTasklet]", reader: "SnapshotReader",
                  snapshot_desc: str, skip: frozenset[str] = frozenset()) -> None:
    """Streams the saved entries of ``reader``'s snapshot, chunk by chunk, to the processors'
    restore hooks; raises SnapshotError on a mismatch between the snapshot and the job and
    SnapshotDamagedError when saved data does not decode. ``skip``: vertices whose saved
    state the job drops (it was started allowing that: engine/jobs/upgrade_plan.py)."""
    by_vertex: "dict[str, list[ProcessorTasklet]]" = {}
    for t in tasklets:
        if t.context.vertex_name not in skip:
            by_vertex.setdefault(t.context.vertex_name, []).append(t)
    for t in tasklets:
        t.context.restoring_other_job = reader.record.job_id != t.context.job_id
    files = reader.record.files
    unknown = sorted(v for v, procs in files.items()
                     if any(f[0] for f in procs.values()) and v not in by_vertex
                     and v not in skip)
    if unknown:
        raise SnapshotError(
            f"{snapshot_desc} holds state of stage(s) {unknown} that this job does not have "
            f"(its stages: {sorted(by_vertex)}). Keep the names of stateful stages when "
            "changing a job (Stage.set_name), or start it without that snapshot")
    for vertex, procs in by_vertex.items():
        if vertex not in files:
            continue
        procs.sort(key=lambda t: t.context.global_processor_index)
        ctx = procs[0].context
        table = processor_partition_table(ctx.member_count, ctx.local_parallelism)
        first = ctx.member_index * ctx.local_parallelism
        for keys, values in reader.chunks(vertex):
            routed: list[list[Any]] = [[] for _ in procs]
            for key, value in zip(keys, values):
                if type(key) is BroadcastKey:
                    for r in routed:
                        r.append((key, value))
                else:
                    owner = table[partition_of(key)] - first
                    if 0 <= owner < len(procs):
                        routed[owner].append((key, value))
            for t, mine in zip(procs, routed):
                _restore_one(t, mine)
    for t in tasklets:
        if t.context.vertex_name not in skip \
                and reader.record.vertex_completed(t.context.vertex_name):
            t.restore_completed()
    for t in tasklets:
        for _ in range(1_000_000):
            if t.processor.finish_snapshot_restore():
                break
        else:  # pragma: no cover - a processor that never finishes its restore
            raise SnapshotError(f"{t.name}: finish_snapshot_restore() never returned True")


def _restore_one(t: "ProcessorTasklet", entries: list[Any]) -> None:
    if not entries:
        return
    inbox = Inbox(entries)
    while inbox:
        before = len(inbox)
        t.processor.restore_from_snapshot(inbox)
        if len(inbox) == before:
            raise SnapshotError(
                f"{t.name}: restore_from_snapshot() consumed none of {before} entries; it must "
                "remove what it restores from the inbox")
