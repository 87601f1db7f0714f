"""What a member service does for each request of an authenticated client.

:class:`RequestHandlers` has one method per request kind, listed in one dispatch table
(``operations``); :meth:`RequestHandlers.respond` decodes a request frame, calls its method
and encodes the response (see :mod:`jetwake.engine.server.protocol`). Every error goes back to
the client as ``[TYPE, MESSAGE]``; only a frame that is not a request closes the connection.

Submitting a job answers once the job is registered: the member starts it on a thread of its
own (building and initializing its processors may take as long as a connector's start-up
timeout), and the client asks ``job_start`` until the start has ended, so a waiting client
hears of a failed start as soon as the member knows it, whatever its request timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable

import cloudpickle

from jetwake.engine.core.errors import JobNotFoundError, JobStateError
from jetwake.engine.core.serialization import dumps, loads
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.jobs.state_view import query_state
from jetwake.engine.net.framing import ProtocolError
from jetwake.engine.server.dashboard.requests import DashboardRequests
from jetwake.engine.server.protocol import error_pair, version

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.server.member import Member

__all__ = ["RequestHandlers", "MAX_WAIT_S"]

log = logging.getLogger("jetwake.service")

#: the longest a request may wait on the member for a job's state to change: a client polls
#: again rather than hold one request open (its request timeout stays meaningful)
MAX_WAIT_S = 10.0
#: how long ``cluster`` waits for a coordinator while one is being elected (members joining or
#: leaving) before it answers that the election is in progress
ELECTION_WAIT_S = 5.0
#: what ``cluster`` names as the coordinator when the election took longer than that
ELECTION_IN_PROGRESS = "election in progress"


def _wait_seconds(wait: Any) -> float:
    return max(0.0, min(float(wait), MAX_WAIT_S))


def _iso(t: float | None) -> str | None:
    return datetime.fromtimestamp(t).isoformat(timespec="seconds") if t else None


def record_dict(rec: Any) -> dict | None:
    """A snapshot's commit record as the map a response carries."""
    if rec is None:
        return None
    d = asdict(rec)
    d["entry_count"] = rec.entry_count
    d["size_bytes"] = rec.size_bytes
    return d


class _Start:
    """The start of a submitted job, run on its own thread; ``error`` is the ``[TYPE,
    MESSAGE]`` of a start that failed (the exception itself is not kept: its traceback holds
    the processors it was building)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: list[str] | None = None

    def state(self) -> dict:
        done = self.done.is_set()
        return {"done": done, "error": self.error if done else None}


# job actions that change the job's state (the reply is the job's info) and those that export
# a snapshot (the reply is its commit record)
_STATE_ACTIONS: dict[str, Callable[[Any], Any]] = {
    "cancel": lambda c: c.cancel(),
    "suspend": lambda c: c.suspend(),
    "resume": lambda c: c.resume(),
    "restart": lambda c: c.restart(),
}
_SNAPSHOT_ACTIONS: dict[str, Callable[[Any, str | None], Any]] = {
    "take_snapshot": lambda c, name: c.take_snapshot(),
    "export_snapshot": lambda c, name: c.export_snapshot(name),
    "cancel_and_export_snapshot": lambda c, name: c.export_snapshot(name, cancel=True),
}
# the state a job must be in for an action run in the background (checked before answering)
_BACKGROUND_NEEDS = {"suspend": JobStatus.RUNNING, "restart": JobStatus.RUNNING,
                     "resume": JobStatus.SUSPENDED}


# the target of a request the cluster's coordinator must answer, whichever member it is now
_COORDINATOR = "<coordinator>"


class RequestHandlers:
    """The requests a member service serves, for one :class:`Member`.

    ``member_info()`` describes the member and its service (``ping``), ``serving()`` says
    whether the service accepts clients (``cluster``), and ``starts(job_id)`` counts the
    executions of a job started so far."""

    MAP_METHODS = {"get", "contains", "len", "items", "keys", "values", "put", "put_all",
                   "remove", "clear", "put_if_absent"}
    LIST_METHODS = {"len", "getitem", "slice", "all", "clear", "commit"}
    #: what a member of a cluster that does not coordinate it hands to the coordinator, so
    #: that every member gives the same answers about the cluster's jobs
    FORWARDED = {"submit", "job_start", "get_job", "job_info", "jobs", "job_action", "job_join",
                 "job_wait", "job_metrics", "snapshots", "delete_snapshot", "job_state",
                 "snapshot_inspect"} \
        | DashboardRequests.FORWARDED

    def __init__(self, member: "Member", member_info: Callable[[], dict],
                 serving: Callable[[], bool], starts: Callable[[str], int]) -> None:
        self.member = member
        self.member_info = member_info
        self.serving = serving
        self.starts = starts
        self._job_starts: dict[str, _Start] = {}  # job id -> its start (jobs submitted here)
        self._job_starts_lock = threading.Lock()
        #: request name -> its handler, called as ``handler(peer=..., **args)``
        self.operations: dict[str, Callable[..., Any]] = {
            "ping": self.ping,
            "cluster": self.cluster,
            "submit": self.submit,
            "job_start": self.job_start,
            "get_job": self.get_job,
            "job_info": self.job_info,
            "jobs": self.jobs,
            "job_action": self.job_action,
            "job_join": self.job_join,
            "job_wait": self.job_wait,
            "job_metrics": self.job_metrics,
            "job_state": self.job_state,
            "snapshots": self.snapshots,
            "delete_snapshot": self.delete_snapshot,
            "write_snapshot": self.write_snapshot,
            "snapshot_inspect": self.snapshot_inspect,
            "map": self.map_operation,
            "list": self.list_operation,
        }
        # the web dashboard's requests (read-only: job detail, overview, a member's share)
        self.operations.update(DashboardRequests(self).operations)

    # --- one request ---------------------------------------------------------------------

    def respond(self, data: bytes, peer: str, route: bool = True) -> bytes:
        """The encoded response to one request frame. Raises :class:`ProtocolError` for a
        frame that is not a request (the connection is closed then). ``route``: whether a
        request another member must answer is handed to it (False for a request another
        member handed here)."""
        try:
            req = loads(data)
            if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                raise ProtocolError("a request must be a map with an 'op'")
            op = req["op"]
            target = self._route(op, req.get("args")) if route else None
            if target is None and op in self.FORWARDED:
                # a member that has just become the coordinator answers about the cluster's
                # jobs once it has read their records
                self.member.await_coordination()
            if target is not None:
                return self.member.forward_request(
                    data, peer, self._forward_timeout(req),
                    None if target is _COORDINATOR else target)
            handler = self.operations.get(op)
            if handler is None:
                raise ValueError(f"unknown operation '{op}'")
            args = req.get("args") or {}
            if not isinstance(args, dict):
                raise TypeError("request args must be a map")
            result = handler(peer=peer, **args)
            try:
                return dumps({"ok": True, "result": result})
            except TypeError as e:
                raise TypeError(f"the result of '{op}' cannot be sent to the client: {e}; "
                                "register its type with jetwake.register_type") from None
        except ProtocolError:
            raise
        except Exception as e:  # noqa: BLE001 - every error goes back to the client
            if not isinstance(e, (KeyError, ValueError, TypeError, JobStateError)):
                log.debug("request failed", exc_info=True)
            return dumps({"ok": False, "error": error_pair(e)})

    def _route(self, op: str, args: Any) -> str | None:
        """The member that must answer this request, when it is not this one: a light job's
        coordinator for requests about it, the cluster's coordinator for other job requests;
        None to answer here."""
        if not self.member.in_cluster or op not in self.FORWARDED:
            return None
        args = args if isinstance(args, dict) else {}
        if op == "jobs" and args.get("local"):
            return None
        if op == "submit" and args.get("light"):
            return None  # this member coordinates the light jobs submitted to it
        ref = args.get("id", args.get("ref"))
        if isinstance(ref, str):
            owner = self.member.light_job_owner(ref)
            if owner is not None:
                return None if owner == self.member.member_id else owner
        return None if self.member.is_coordinator else _COORDINATOR

    def _forward_timeout(self, req: dict) -> float:
        args = req.get("args") or {}
        wait = args.get("wait", 0) if isinstance(args, dict) else 0
        return (_wait_seconds(wait) if isinstance(wait, (int, float)) else 0.0) + 60.0

    # --- information -----------------------------------------------------------------------

    def _coordinator(self, job_id: str) -> Any:
        c = self.member.find_coordinator(job_id)
        if c is None:
            raise JobNotFoundError(f"no job with name or id '{job_id}' on this member")
        return c

    def _job_info(self, c: Any) -> dict:
        cfg = dict(vars(c.config))
        return {"id": c.job_id, "name": c.name, "status": c.status.value,
                "submission_time": c.submission_time, "submitted": _iso(c.submission_time),
                "completion_time": c.completion_time, "failure": c.failure_text,
                "config": cfg, "last_snapshot": record_dict(c.last_snapshot),
                "light": c.light,
                "snapshot_count": c.snapshot_count, "restart_count": c.restart_count,
                "starts": self.starts(c.job_id), "done": c.is_done()}

    def ping(self, peer: str) -> dict:
        return self.member_info()

    def cluster(self, peer: str) -> dict:
        """The cluster: name, coordinator, quorum and every member (a member that is not part
        of a cluster describes itself as a cluster of one)."""
        state = "ACTIVE" if self.serving() else "PASSIVE"
        if self.member.in_cluster:
            # while members join or leave, Kafka's group has no coordinator for a moment
            deadline = time.monotonic() + ELECTION_WAIT_S
            info = self.member.cluster_info()
            while info["coordinator"] is None and time.monotonic() < deadline:
                time.sleep(0.1)
                info = self.member.cluster_info()
            electing = info["coordinator"] is None
            return {**info, "coordinator": ELECTION_IN_PROGRESS if electing
                    else info["coordinator"], "election_in_progress": electing,
                    "version": version(), "state": state}
        info = self.member_info()
        coords = self.member.coordinators()
        active = sum(1 for c in coords if not c.status.is_terminal)
        me = {**info, "id": info["address"], "state": state, "jobs": active,
              "job_statuses": info["jobs"], "coordinator": True}
        return {"name": None, "coordinator": me["id"], "election_in_progress": False,
                "quorum": 1, "size": 1,
                "version": version(), "state": state, "members": [me], "jobs": len(coords),
                "active_jobs": active}

    # --- jobs ------------------------------------------------------------------------------

    def submit(self, peer: str, pipeline: bytes, config: dict, wait: float = 0.0,
               light: bool = False) -> dict:
        """Registers the job (a refused submission raises here and leaves nothing behind),
        starts it on its own thread and answers after at most ``wait`` seconds: the job's info
        and ``start`` (``{"done", "error"}``); ``job_start`` tells the rest."""
        if not isinstance(pipeline, (bytes, bytearray)):
            raise TypeError("submit: the pipeline must be cloudpickle bytes")
        if not isinstance(config, dict):
            raise TypeError("submit: the config must be a map of JobConfig fields")
        try:
            definition = cloudpickle.loads(pipeline)  # authenticated connection only
        except Exception as e:  # noqa: BLE001
            raise ValueError(
                f"the member cannot load the submitted pipeline: {type(e).__name__}: {e}. "
                "Modules the pipeline imports by name must be installed on the member") from e
        if config.get("dry_run") and not light:  # the upgrade plan; nothing is submitted
            plan = self.member.plan_upgrade(definition, JobConfig(**config))
            return {"dry_run": True, "plan": plan.to_dict()}
        if light:
            c = self.member.add_light_job(definition, JobConfig(**config))
        else:
            c = self.member.add_job(definition, JobConfig(**config))
        log.info("%sjob '%s' (%s) submitted by %s: guarantee %s", "light " if light else "",
                 c.name, c.job_id, peer, c.config.processing_guarantee)
        start = _Start()
        with self._job_starts_lock:
            self._job_starts[c.job_id] = start

        def run() -> None:
            try:
                c.start(restore="none" if light else "initial", persist_definition=False)
            except BaseException as e:  # noqa: BLE001 - the job's status and failure say it
                start.error = error_pair(e)
            finally:
                start.done.set()
        threading.Thread(target=run, daemon=True, name=f"jetwake-start-{c.name}").start()
        start.done.wait(_wait_seconds(wait))
        return {**self._job_info(c), "start": start.state()}

    def job_start(self, peer: str, id: str, wait: float = 1.0) -> dict:  # noqa: A002
        """The job's info and how its start went (``start``: ``{"done", "error"}``), after
        waiting at most ``wait`` seconds for a start in progress to end. A job not submitted
        through this service started when its member did: ``done`` and no error."""
        c = self._coordinator(id)
        with self._job_starts_lock:
            start = self._job_starts.get(c.job_id)
        if start is None:
            return {**self._job_info(c), "start": {"done": True, "error": None}}
        start.done.wait(_wait_seconds(wait))
        return {**self._job_info(c), "start": start.state()}

    def get_job(self, peer: str, ref: str) -> dict | None:
        c = self.member.find_coordinator(ref)
        return self._job_info(c) if c is not None else None

    def job_info(self, peer: str, id: str) -> dict:  # noqa: A002
        return self._job_info(self._coordinator(id))

    def jobs(self, peer: str, local: bool = False) -> list[dict]:
        """Every job; in a cluster the coordinator's jobs and every member's light jobs
        (``local``: this member's own only)."""
        out = [self._job_info(c) for c in self.member.coordinators()]
        if local or not self.member.in_cluster:
            return out
        request = dumps({"op": "jobs", "args": {"local": True}})
        for reply in self.member.ask_other_members(request, peer):
            if reply.get("ok"):
                out.extend(j for j in reply["result"] if j["id"] not in {o["id"] for o in out})
        return sorted(out, key=lambda j: j["submission_time"])

    def job_action(self, peer: str, id: str, action: str,  # noqa: A002
                   name: str | None = None, background: bool = False) -> Any:
        c = self._coordinator(id)
        if action not in _STATE_ACTIONS and action not in _SNAPSHOT_ACTIONS:
            raise ValueError(f"unknown job action '{action}'")
        log.debug("client %s: %s job %s", peer, action, c.name)
        if background:  # check the state now, run the (maybe slow) action on its own thread
            need = _BACKGROUND_NEEDS.get(action)
            if need is not None:
                c.require(need, action)
            elif c.status.is_terminal:
                raise JobStateError(f"job '{c.name}' is already {c.status.value}")

            def run() -> None:
                try:
                    self.job_action(peer, id, action, name)
                except Exception as e:  # noqa: BLE001 - nobody waits for the answer
                    log.warning("job '%s' (%s): %s requested by %s failed: %s: %s", c.name,
                                c.job_id, action, peer, type(e).__name__, e)
            threading.Thread(target=run, daemon=True, name=f"jetwake-{action}").start()
            return self._job_info(c)
        if action in _SNAPSHOT_ACTIONS:
            return record_dict(_SNAPSHOT_ACTIONS[action](c, name))
        _STATE_ACTIONS[action](c)
        return self._job_info(c)

    def job_join(self, peer: str, id: str, wait: float = 1.0) -> dict:  # noqa: A002
        c = self._coordinator(id)
        done = c.wait_ended(_wait_seconds(wait))
        err = c.error if done else None
        return {"done": done, "status": c.status.value,
                "error": error_pair(err) if err is not None else None}

    def job_wait(self, peer: str, id: str, statuses: list,  # noqa: A002
                 wait: float = 1.0) -> dict:
        c = self._coordinator(id)
        want = {JobStatus(s) for s in statuses}
        c.wait_for_status(want, _wait_seconds(wait))
        return self._job_info(c)

    def job_metrics(self, peer: str, id: str) -> dict:  # noqa: A002
        return self._coordinator(id).metrics()

    def job_state(self, peer: str, id: str, stage: str, read: str,  # noqa: A002
                  consistency: str = "snapshot", keys: list | None = None,
                  limit: int | None = None, prefix: Any = None) -> dict:
        """One read of ``job.state(stage)`` (engine/jobs/state_view.py)."""
        return query_state(self._coordinator(id), stage, read, consistency, keys, limit, prefix)

    # --- snapshots -------------------------------------------------------------------------

    def snapshots(self, peer: str) -> list[dict]:
        # record_dict returns None only for None, and the member lists records
        return [record_dict(r) for r in self.member.snapshots()]  # type: ignore[misc]

    def delete_snapshot(self, peer: str, name: str) -> None:
        self.member.delete_snapshot(name)
        log.info("snapshot '%s' deleted by %s", name, peer)

    def write_snapshot(self, peer: str, name: str, job_name: str, entries: list) -> dict:
        """Writes ``[vertex, key, value]`` entries a client sends as a committed snapshot
        exported as ``name`` (a Spark backfill's hand-off, docs/backfill.md), which
        ``JobConfig(initial_snapshot_name=name)`` restores; a name that is taken fails."""
        from jetwake.engine.core.errors import SnapshotError
        store = self.member.snapshot_store
        if store.get_export(name) is not None:
            raise SnapshotError(f"a snapshot named {name!r} exists already on the member; "
                                f"delete it (jetwake delete-snapshot {name}) or choose another")
        exported = store.write_export(name, job_name, entries)
        log.info("snapshot '%s' written by %s (%d entries)", name, peer, len(entries))
        return record_dict(exported)  # type: ignore[return-value]

    def snapshot_inspect(self, peer: str, ref: str, sample: int = 5) -> dict:
        """What an exported snapshot, or a job's last committed one, holds
        (engine/server/snapshot_inspection.py)."""
        return self.member.inspect_snapshot(ref, sample)

    # --- maps and lists --------------------------------------------------------------------

    def map_operation(self, peer: str, name: str, method: str,
                      args: list | None = None) -> Any:
        if method not in self.MAP_METHODS:
            raise ValueError(f"unknown map operation '{method}'")
        m = self.member.get_map(name)
        a = list(args or ())
        if method == "get":
            return [a[0] in m, m.get(a[0])]
        if method == "contains":
            return a[0] in m
        if method == "len":
            return len(m)
        if method == "items":
            return [(k, v) for k, v in m.items()]
        if method == "keys":
            return list(m.keys())
        if method == "values":
            return list(m.values())
        if method == "put_all":
            m.put_all([tuple(e) for e in a[0]])
            return None
        if method == "clear":
            m.clear()
            return None
        return getattr(m, method)(*a)

    def list_operation(self, peer: str, name: str, method: str,
                       args: list | None = None) -> Any:
        if method not in self.LIST_METHODS:
            raise ValueError(f"unknown list operation '{method}'")
        lst = self.member.get_list(name)
        a = list(args or ())
        if method == "len":
            return len(lst)
        if method == "getitem":
            return lst[a[0]]
        if method == "slice":
            return list(lst)[slice(*a)]
        if method == "all":
            return list(lst)
        if method == "commit":  # items, writer, sequence: applied once, even when resent
            return lst.commit(list(a[0]), a[1], a[2])
        lst.clear()
        return None
