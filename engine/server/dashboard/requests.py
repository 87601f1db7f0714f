"""The member-service requests the dashboard adds: a job's detail, the jobs overview, and a
member's share and process usage.

They are requests of the member service like the others (:mod:`jetwake.engine.server.
request_handlers` registers them), so a member that does not coordinate a job hands
``job_detail`` and ``jobs_overview`` to the one that does, and every member's dashboard shows
the same jobs. The coordinator asks every other member for its share of the running jobs
(``dashboard_share``: each member reads its own processors) and adds them up; the counts of a
job on a cluster are the sum over its members.

None of them changes anything: the actions are the service's ``job_action`` and
``delete_snapshot``, and no request here can start a job.
"""

from __future__ import annotations

import time
import traceback
from typing import TYPE_CHECKING, Any, Callable

from jetwake.engine.jobs.state_view import state_summary
from jetwake.engine.core.serialization import dumps
from jetwake.engine.execution.plan import resolve_parallelism
from jetwake.engine.execution.execution_metrics import readable_counters
from jetwake.engine.server.dashboard.readings import (
    member_share, merge_shares, process_usage,
)

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.server.member import Member

__all__ = ["DashboardRequests"]

#: how long the coordinator waits for another member's share (a slow member shows less)
SHARE_TIMEOUT_S = 3.0
_SPARK_POINTS = 120


def _plain(value: Any) -> Any:
    """A value as JSON can carry it (a config may hold anything the user passed)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    return repr(value)


def _short_record(rec: dict | None) -> dict | None:
    """A snapshot record without its per-file table (big, and of no use on a page)."""
    if rec is None:
        return None
    return {k: v for k, v in rec.items() if k not in ("files", "data_refs", "completed",
                                                       "parallelism")}


def _error(c: Any) -> dict | None:
    """The job's error with its traceback (a job failed on a member that has restarted since
    keeps only its failure text)."""
    err = c.error
    if err is None:
        return None if c.failure_text is None else {
            "type": None, "message": c.failure_text, "traceback": None}
    return {"type": type(err).__name__, "message": str(err),
            "traceback": "".join(traceback.format_exception(type(err), err,
                                                            err.__traceback__))}


def _ends(dag: Any) -> tuple[set[str], set[str]]:
    """The DAG's sources (no inbound edge) and sinks (no outbound edge), by vertex name."""
    has_in = {e.destination.name for e in dag.edges}
    has_out = {e.source.name for e in dag.edges}
    names = {v.name for v in dag.vertices}
    return names - has_in, names - has_out


def _job_rates(vertices: dict, history: list, ends: tuple[set[str], set[str]] | None) -> dict:
    """Items per second into the job (what its sources emit) and out of it (what its sinks
    take), now and over the history. Without the DAG (a light job another member
    coordinates), a vertex that took no item is a source and one that gave none a sink."""
    if ends is None:
        sources = {n for n, v in vertices.items() if v["items_in"] == 0}
        sinks = {n for n, v in vertices.items() if v["items_out"] == 0}
    else:
        sources, sinks = ends
    points = [[t, round(sum(step.get(v, [0, 0])[1] for v in sources), 1),
               round(sum(step.get(v, [0, 0])[0] for v in sinks), 1)]
              for t, step in history[-_SPARK_POINTS:]]
    # a job none of whose processors runs now moves nothing, whatever its last reading said
    current = points[-1] if points and vertices else [None, 0.0, 0.0]
    return {"in_per_s": current[1], "out_per_s": current[2], "history": points}


class DashboardRequests:
    """The dashboard's requests for one :class:`RequestHandlers` (see the module doc)."""

    #: requests the coordinator of the job (or of the cluster's jobs) must answer
    FORWARDED = frozenset({"job_detail", "jobs_overview"})

    def __init__(self, handlers: Any) -> None:
        self.handlers = handlers
        self.member = handlers.member
        self.operations: dict[str, Callable[..., Any]] = {
            "job_detail": self.job_detail,
            "jobs_overview": self.jobs_overview,
            "dashboard_share": self.share,
            "member_usage": self.member_usage,
        }

    # --- one member --------------------------------------------------------------------------

    def share(self, peer: str, id: str | None = None) -> dict:  # noqa: A002
        """This member's share of its running jobs (or of job ``id``)."""
        if id is not None and not isinstance(id, str):
            raise TypeError("dashboard_share: id must be a job id")
        return member_share(self.member, id)

    def member_usage(self, peer: str) -> dict:
        """This member's process: pid, memory, CPU, threads."""
        return process_usage(self.member)

    def _shares(self, peer: str, job_id: str | None = None) -> list[dict]:
        shares = [member_share(self.member, job_id)]
        if self.member.in_cluster:
            args = {"id": job_id} if job_id is not None else {}
            frame = dumps({"op": "dashboard_share", "args": args})
            for reply in self.member.ask_other_members(frame, peer, SHARE_TIMEOUT_S):
                if reply.get("ok") and isinstance(reply.get("result"), dict):
                    shares.append(reply["result"])
        return shares

    # --- the coordinator's -------------------------------------------------------------------

    def jobs_overview(self, peer: str) -> list[dict]:
        """Every job (as the ``jobs`` request lists them) with its rates in and out, now and
        over the last two minutes, and the age of its last snapshot."""
        jobs = self.handlers.jobs(peer)
        shares = self._shares(peer)
        now = time.time()
        out = []
        for info in jobs:
            merged = merge_shares([s[info["id"]] for s in shares if info["id"] in s])
            c = self.member.find_coordinator(info["id"])
            rates = _job_rates(merged["vertices"], merged["history"],
                               _ends(c.dag) if c is not None else None)
            last = info.get("last_snapshot")
            out.append({
                "id": info["id"], "name": info["name"], "status": info["status"],
                "submitted": info["submitted"], "submission_time": info["submission_time"],
                "guarantee": info["config"].get("processing_guarantee"),
                "light": info["light"], "failure": info["failure"],
                "snapshot_count": info["snapshot_count"],
                "restart_count": info["restart_count"],
                "last_snapshot_id": last["snapshot_id"] if last else None,
                "last_snapshot_age_s": round(now - last["created"], 1) if last else None,
                **rates})
        return out

    def job_detail(self, peer: str, id: str) -> dict:  # noqa: A002
        """Everything the job page shows: the job's info, its DAG with each vertex's readings
        (summed over the members), Kafka lag per topic and partition, the snapshot history,
        the error with its traceback and the configuration."""
        c = self.handlers._coordinator(id)
        info = self.handlers._job_info(c)
        merged = merge_shares([s[c.job_id] for s in self._shares(peer, c.job_id)
                               if c.job_id in s])
        readings = merged["vertices"]
        parallelism = resolve_parallelism(c.dag, c.default_parallelism())
        vertices = []
        for v in c.dag.topological_order():
            r = readings.get(v.name)
            # the call latency histogram shown as its percentiles (service stages)
            counters = readable_counters(r["counters"]) if r else {}
            vertices.append({
                "name": v.name,
                "local_parallelism": parallelism[v.name],
                "processors": r["processors"] if r else 0,
                "items_in": r["items_in"] if r else 0,
                "items_out": r["items_out"] if r else 0,
                "in_per_s": r["in_per_s"] if r else 0.0,
                "out_per_s": r["out_per_s"] if r else 0.0,
                "queue_fill": round(r["queue_fill"], 3) if r else 0.0,
                "watermark": r["watermark"] if r else None,
                "watermark_lag_ms": round(r["watermark_lag_ms"], 1)
                if r and r["watermark_lag_ms"] is not None else None,
                "late_events": counters.pop("late_events", 0),
                "dead_letters": counters.pop("dead_letters", 0),
                "counters": counters,
            })
        edges = [{"from": e.source.name, "to": e.destination.name,
                  "from_ordinal": e.source_ordinal, "to_ordinal": e.dest_ordinal,
                  "routing": e.routing.value, "distributed": bool(e.is_distributed),
                  "priority": e.edge_priority} for e in c.dag.edges]
        kafka = sorted(({"vertex": name, **p} for name, r in readings.items()
                        for p in r["kafka"]),
                       key=lambda p: (p["vertex"], p["topic"], p["partition"]))
        last = info["last_snapshot"]
        return {
            "id": info["id"], "name": info["name"], "status": info["status"],
            "submitted": info["submitted"], "submission_time": info["submission_time"],
            "completion_time": info["completion_time"], "light": info["light"],
            "guarantee": c.config.processing_guarantee,
            "restart_count": info["restart_count"], "snapshot_count": info["snapshot_count"],
            "snapshot_failures": c.snapshot_failures,
            "last_snapshot_error": c.last_snapshot_error,
            "last_snapshot": _short_record(last),
            "last_snapshot_age_s": round(time.time() - last["created"], 1) if last else None,
            "failure": info["failure"], "error": _error(c),
            "config": _plain(info["config"]),
            "dag": {"vertices": vertices, "edges": edges},
            "vertices": vertices, "edges": edges,  # the DAG's, also at the top for scripts
            "kafka_lag": kafka,
            "throughput": _job_rates(readings, merged["history"], _ends(c.dag)),
            "snapshots": c.snapshot_history.entries()[::-1],  # newest first
            # the stateful stages, with their keys and bytes in the last committed snapshot
            "state": state_summary(c),
        }
