"""Which snapshot an execution restores, and when falling back past a damaged one is refused.

One rule for every member: the coordinator lists the candidates (:func:`restore_candidates`),
best first; a member that finds the one it was given damaged says so, the coordinator skips
it and names it to the next attempt; each member, after its processors are built and
initialized and before any state is restored into them, refuses the fallback when it could
duplicate output (:func:`check_fallback`).
"""

from __future__ import annotations

import logging
from typing import Any

from jetwake.engine.core.errors import FallbackRefusedError, SnapshotError, SnapshotNotFoundError
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.snapshot.store.snapshot_store import CommitRecord

__all__ = ["restore_candidates", "check_fallback", "damaged_export_error"]

log = logging.getLogger("jetwake.job")


def restore_candidates(store: Any, job_id: str, config: JobConfig,
                       restore: str) -> list[tuple[CommitRecord | None, str]]:
    """The snapshots to try, best first, each with how a log line names it; ends with
    ``(None, "")`` (no state) where starting without state is allowed. ``restore`` is
    "latest" (the newest good snapshot), "initial" (the config's initial_snapshot_name) or
    "none"."""
    if restore == "initial" and config.initial_snapshot_name:
        name = config.initial_snapshot_name
        rec = store.get_export(name)
        if rec is None:
            raise SnapshotNotFoundError(
                f"no exported snapshot named '{name}' (JobConfig.initial_snapshot_name); "
                "list them with `jetwake list-snapshots` or member.snapshots()")
        return [(rec, f"exported snapshot '{name}'")]
    if restore != "latest" or not config.snapshots_enabled:
        return [(None, "")]
    out: list[tuple[CommitRecord | None, str]] = []
    for rec in store.committed(job_id):
        if rec.job_id != job_id:
            raise SnapshotError(
                f"snapshot {rec.snapshot_id} in the directory of job {job_id} was "
                f"written by job {rec.job_id}; the data directory has been tampered with")
        out.append((rec, f"snapshot {rec.snapshot_id}"))
    out.append((None, ""))
    return out


def damaged_export_error(rec: CommitRecord, error: BaseException) -> SnapshotError | None:
    """The error that ends the start when ``rec`` is an export the user asked for (no silent
    fallback past it); None for a regular snapshot, which the next candidate replaces."""
    if rec.name is None:
        return None
    return SnapshotError(f"exported snapshot '{rec.name}' is damaged: {error}")


def check_fallback(tasklets: list, config: JobConfig, job_name: str, skipped_damaged: list[str],
                   desc: str, accept_once: bool) -> None:
    """Refuses to restore ``desc`` past the damaged snapshots ``skipped_damaged`` when that
    can duplicate output: under exactly-once, a transactional sink may already have committed
    the damaged snapshot's phase 2, and restoring an older one would write those records
    again. Runs on each member's built and initialized processors, before any state is
    restored into them."""
    if not skipped_damaged or config.processing_guarantee != "exactly_once" \
            or config.accept_at_least_once_on_fallback:
        return
    sinks = sorted({t.context.vertex_name for t in tasklets
                    if t.processor.transactional_sink})
    if not sinks:
        return
    if accept_once:
        log.warning("job %s: restoring %s past damaged snapshot(s) %s; the transactional "
                    "sink(s) %s may write some records twice (accepted by the user)",
                    job_name, desc or "no state", skipped_damaged, sinks)
        return
    instead = desc or "without any state"
    raise FallbackRefusedError(
        f"job '{job_name}': the newest snapshot is damaged ({'; '.join(skipped_damaged)}) and "
        f"the transactional sink(s) {sinks} may already have committed its output, so starting "
        f"from {instead} could write records twice, breaking exactly-once. The job is "
        "suspended. To accept possible duplicates for this restore, resume it with "
        "job.resume(accept_at_least_once_on_fallback=True); to accept them always, set "
        "JobConfig(accept_at_least_once_on_fallback=True)")
