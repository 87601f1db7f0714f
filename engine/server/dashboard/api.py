"""The dashboard's JSON API: each call is a request of the member service.

Answering through :meth:`RequestHandlers.respond` (rather than reading the member directly)
gives the API the service's rules for free: in a cluster, a job request goes to the member
that coordinates the job, so every member's dashboard shows the same jobs; the actions are the
service's own ``job_action`` and ``delete_snapshot``, with the same state checks. There is no
call that submits a job.

A failed call raises :class:`ApiError` with the HTTP status its error type maps to (an unknown
job is 404, an action the job's state does not allow 409, bad input 400).
"""

from __future__ import annotations

import concurrent.futures
import re
from typing import TYPE_CHECKING, Any

from jetwake.engine.core.serialization import dumps, loads
from jetwake.engine.jobs.state_reading import json_ready, key_from_text

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.server.member import Member

__all__ = ["ApiError", "DashboardApi", "STATE_ACTIONS", "EXPORT_ACTION"]

#: actions that change a job's state; each runs on the member in the background and the page
#: follows the job's status
STATE_ACTIONS = ("suspend", "resume", "restart", "cancel")
#: the action that exports a snapshot of the job under a name (answered when it is written)
EXPORT_ACTION = "export-snapshot"

# error type (as the service names it) -> HTTP status
_STATUS = {"JobNotFoundError": 404, "SnapshotNotFoundError": 404, "KeyError": 404,
           "JobStateError": 409, "FallbackRefusedError": 409,
           "ValueError": 400, "TypeError": 400, "PipelineError": 400,
           "StateQueryError": 400, "StateUnavailableError": 503}
_SNAPSHOT_NAME = re.compile(r"^[\w][\w.-]{0,127}$")
_USAGE_TIMEOUT_S = 3.0
#: keys the job page's state lookup lists when no key is given
STATE_LIST_LIMIT = 20


class ApiError(Exception):
    """A call that failed: ``status`` (HTTP), ``kind`` (the error's type) and the message."""

    def __init__(self, status: int, message: str, kind: str = "Error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message

    def body(self) -> dict:
        """The error as the API answers it: JSON with the message."""
        return {"error": self.message, "message": self.message, "type": self.kind,
                "status": self.status}


def _short_snapshot(rec: dict) -> dict:
    return {"name": rec.get("name"), "job_id": rec.get("job_id"),
            "job_name": rec.get("job_name"), "snapshot_id": rec.get("snapshot_id"),
            "created": rec.get("created"), "size_bytes": rec.get("size_bytes"),
            "entries": rec.get("entry_count"), "terminal": rec.get("terminal"),
            "duration_ms": rec.get("duration_ms")}


class DashboardApi:
    """The API over one member's request handlers; ``peer`` names the HTTP client in the
    member's log (``dashboard 127.0.0.1:40112``)."""

    def __init__(self, member: "Member", handlers: Any) -> None:
        self.member = member
        self.handlers = handlers

    def call(self, op: str, args: dict | None, peer: str) -> Any:
        """One request of the member service; raises :class:`ApiError` when it fails."""
        reply = loads(self.handlers.respond(dumps({"op": op, "args": args or {}}), peer))
        if reply.get("ok"):
            return reply.get("result")
        kind, message = reply.get("error") or ["Error", "the request failed"]
        raise ApiError(_STATUS.get(kind, 500), message, kind)

    # --- reading ---------------------------------------------------------------------------

    def cluster(self, peer: str) -> dict:
        """The cluster with each member's process usage (memory, CPU), asked of the member
        itself; a member that does not answer in time shows none."""
        info = self.call("cluster", None, peer)
        members = info.get("members", [])
        if not self.member.in_cluster:
            usage: dict = self.call("member_usage", None, peer)
            for m in members:
                m.update(usage)
            return info
        frame = dumps({"op": "member_usage", "args": {}})
        with concurrent.futures.ThreadPoolExecutor(max(1, len(members))) as pool:
            futures = {}
            for m in members:
                if m.get("id") == self.member.member_id:
                    futures[m["id"]] = pool.submit(self.handlers.respond, frame, peer, False)
                elif m.get("state") != "UNREACHABLE":
                    futures[m["id"]] = pool.submit(self.member.forward_request, frame, peer,
                                                   _USAGE_TIMEOUT_S, m["id"])
            for m in members:
                f = futures.get(m.get("id"))
                usage = {"rss_bytes": None, "cpu_percent": None}
                if f is not None:
                    try:
                        reply = loads(f.result(_USAGE_TIMEOUT_S + 2))
                        if reply.get("ok"):
                            usage = reply["result"]
                    except Exception:  # noqa: BLE001 - shown without its usage
                        pass
                m.update({k: v for k, v in usage.items() if k != "pid" or "pid" not in m})
        return info

    def jobs(self, peer: str) -> list[dict]:
        return self.call("jobs_overview", None, peer)

    def job(self, job_id: str, peer: str) -> dict:
        return self.call("job_detail", {"id": job_id}, peer)

    def job_state(self, job_id: str, stage: str, consistency: str, key_text: str | None,
                  peer: str) -> dict:
        """A stateful stage's value of one key (typed as ``jetwake state`` takes it: JSON when
        it parses), or its first keys: the job page's state lookup."""
        args: dict[str, Any] = {"id": job_id, "stage": stage, "consistency": consistency}
        if key_text is None:
            args.update(read="items", limit=STATE_LIST_LIMIT)
        else:
            args.update(read="get", keys=[key_from_text(key_text)])
        r = self.call("job_state", args, peer)
        return {"stage": stage, "consistency": consistency, "key": key_text,
                "snapshot_id": r.get("snapshot_id"), "count": r.get("count"),
                "entries": [{"key": json_ready(k), "value": json_ready(v),
                             "text": f"{k!r}: {v!r}"} for k, v in r.get("entries", [])]}

    def job_exists(self, job_id: str, peer: str) -> bool:
        return self.call("get_job", {"ref": job_id}, peer) is not None

    def snapshots(self, peer: str) -> list[dict]:
        recs = self.call("snapshots", None, peer) or []
        return sorted((_short_snapshot(r) for r in recs), key=lambda r: r["created"] or 0,
                      reverse=True)

    # --- actions (the caller has checked the token) ----------------------------------------

    def job_action(self, job_id: str, action: str, body: dict, peer: str) -> dict:
        """Runs ``action`` on the job: a state action answers the job's info at once (the
        action goes on on the member); an export answers the exported snapshot."""
        if action in STATE_ACTIONS:
            return self.call("job_action", {"id": job_id, "action": action,
                                            "background": True}, peer)
        if action == EXPORT_ACTION:
            name = body.get("name")
            if not isinstance(name, str) or not _SNAPSHOT_NAME.match(name):
                raise ApiError(400, "export-snapshot needs a 'name' for the snapshot: letters, "
                                    "digits, '_', '.' or '-', starting with a letter or digit "
                                    f"(got {name!r})", "ValueError")
            rec = self.call("job_action", {"id": job_id, "action": "export_snapshot",
                                           "name": name}, peer)
            return _short_snapshot(rec)
        raise ApiError(404, f"no job action '{action}': use one of "
                            f"{', '.join(STATE_ACTIONS + (EXPORT_ACTION,))}", "ValueError")

    def delete_snapshot(self, name: str, peer: str) -> dict:
        self.call("delete_snapshot", {"name": name}, peer)
        return {"deleted": name}
