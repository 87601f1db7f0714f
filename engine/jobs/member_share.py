"""A member's share of an execution, made ready to run: built, initialized, weighed against
the fallback rule and restored, in this order, on one member or on each member of a cluster.

One function for every path, so the steps cannot drift apart: a fallback past a damaged
snapshot is refused after the processors are initialized and before any state is restored
into them; whatever fails on the way closes every processor initialized so far.
"""

from __future__ import annotations

import logging
from typing import Any

from jetwake.engine.core.dag import DAG
from jetwake.engine.execution.plan import PlanContext, build_tasklets
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.restore_plan import check_fallback
from jetwake.engine.jobs.upgrade_plan import plan_upgrade
from jetwake.snapshot.protocol.restore import restore_state

__all__ = ["prepare_share", "close_quietly"]

log = logging.getLogger("jetwake.job")


def prepare_share(dag: DAG, ctx: PlanContext, config: JobConfig, reader: Any, restore_desc: str,
                  skipped_damaged: list[str], accept_fallback: bool) -> list:
    """This member's processors of ``dag``, initialized and restored from ``reader`` (None:
    no state). Raises FallbackRefusedError (see restore_plan.check_fallback) and whatever a
    processor's init or the restore raised (SnapshotDamagedError for damaged data), with
    every processor closed."""
    tasklets = build_tasklets(dag, ctx)
    initialized: list = []
    try:
        for t in tasklets:
            initialized.append(t)
            t.init()
        check_fallback(tasklets, config, ctx.job_name, skipped_damaged, restore_desc,
                       accept_fallback)
        if reader is not None:
            # the state a job started with allow_state_drop drops (it was refused otherwise
            # at submission): no vertex of its name, or one of another kind
            drop = plan_upgrade(dag, reader.record).dropped if config.allow_state_drop else ()
            restore_state(tasklets, reader, restore_desc, skip=frozenset(drop))
    except BaseException:
        close_quietly(initialized)
        raise
    return tasklets


def close_quietly(tasklets: list) -> None:
    """Closes processors after a failed start; a failing close is logged, never raised (the
    first error is the one to report)."""
    for t in tasklets:
        try:
            t.close()
        except Exception:  # noqa: BLE001 - the first error is the one to report
            log.exception("closing %s after a failed start", t.name)
