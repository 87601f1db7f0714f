"""``job.state(stage)``: a view of a stateful stage's state while the job runs.

The view asks its job for each answer (:func:`query_state` on the job's coordinator, in
process for a :class:`~jetwake.engine.jobs.job.Job` and through the member's service for a
``RemoteJob``), so only the entries asked for travel. Two consistencies:

- ``"snapshot"`` (the default) answers from the job's last committed snapshot: a consistent
  cut across every key and member. The stage's entries of that snapshot are decoded once
  (engine/jobs/state_reading.py) and kept until a newer snapshot commits.
- ``"latest"`` answers from the live processors: a key's read goes to the member owning its
  partition, whose processor serves it on its own thread between two of its steps; a scan
  asks every member. Processing pauses only for the copy of the entries read.
"""

from __future__ import annotations

import time
from itertools import islice
from typing import Any, Callable, Iterator

from jetwake.engine.core.partitioning import partition_of
from jetwake.snapshot.store.snapshot_store import SnapshotStoreError
from jetwake.engine.jobs.execution_messages import ReadState, StateEntries
from jetwake.engine.jobs.state_reading import (
    LIVE_READ_TIMEOUT_S, SavedEntry, StatefulStage, StateQueryError, StateUnavailableError,
    count_local_state, decode_stage, entries_of, filter_items, read_local_state,
    stage_summaries, find_stage, key_type_problem, snapshot_entries,
)

__all__ = ["StateView", "query_state", "CONSISTENCIES", "state_summary"]

CONSISTENCIES = ("snapshot", "latest")
_NOT_ASKED: Any = object()
_READS = ("check", "get", "items", "count")


class StateView:
    """The state of one stateful stage of a job (``job.state(stage, consistency=...)``).

    ``get(key)`` the value of a key (None when the stage holds none), ``get_all(keys)`` a
    dict of the keys found, ``items(limit=None, prefix=None)`` an iterator of ``(key,
    value)``, ``count()`` the number of keys. What a value is depends on the stage (see
    docs/state.md, "Reading a running job's state")."""

    def __init__(self, ask: Callable[..., dict], stage: str, consistency: str) -> None:
        if consistency not in CONSISTENCIES:
            raise ValueError(f"consistency must be 'snapshot' or 'latest', got {consistency!r}")
        self._ask = ask
        self.stage = stage
        self.consistency = consistency
        #: the snapshot the last answer came from (None for latest reads)
        self.snapshot_id: int | None = None
        ask(stage=stage, read="check", consistency=consistency)  # a bad stage fails here

    def _query(self, read: str, **args: Any) -> dict:
        r = self._ask(stage=self.stage, read=read, consistency=self.consistency, **args)
        self.snapshot_id = r.get("snapshot_id")
        return r

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``; ``default`` when the stage holds none for it."""
        for k, v in self._query("get", keys=[key])["entries"]:
            return v
        return default

    def get_all(self, keys: Any) -> dict:
        """The values of those of ``keys`` the stage holds, by key."""
        keys = list(keys)
        if not keys:
            return {}
        return {k: v for k, v in self._query("get", keys=keys)["entries"]}

    def items(self, limit: int | None = None, prefix: Any = None) -> Iterator[tuple[Any, Any]]:
        """``(key, value)`` of the stage's keys (sorted when the keys compare), at most
        ``limit``; with ``prefix`` only keys starting with it: a str or bytes key by its
        text, a tuple key by its leading elements (``prefix`` a tuple of them, or one value
        for the first element)."""
        return iter([(k, v) for k, v in
                     self._query("items", limit=limit, prefix=prefix)["entries"]])

    def count(self) -> int:
        """How many keys the stage holds."""
        return int(self._query("count")["count"])

    def __repr__(self) -> str:
        return f"StateView({self.stage!r}, consistency={self.consistency!r})"


# --- the job's side --------------------------------------------------------------------------

def query_state(c: Any, stage: str, read: str, consistency: str = "snapshot",
                keys: list | None = None, limit: int | None = None,
                prefix: Any = None) -> dict:
    """Answers one read of a StateView on the job's coordinator ``c``: ``read`` is "check",
    "get" (``keys``), "items" (``limit``, ``prefix``) or "count"; returns ``{"entries":
    [[key, value], ...], "count": n, "snapshot_id": id or None}``."""
    if consistency not in CONSISTENCIES:
        raise StateQueryError(f"consistency must be 'snapshot' or 'latest', got {consistency!r}")
    if read not in _READS:
        raise StateQueryError(f"unknown state read {read!r}: get, items or count")
    st = find_stage(c.definition, c.name, stage)
    if c.status.is_terminal:
        raise StateQueryError(f"job {c.name!r} has ended ({c.status.value}): its state went "
                              "with it (its snapshots are deleted when it ends); read the "
                              "state of a running job, or export a snapshot before it ends")
    if read == "check":
        return {"entries": [], "count": 0, "snapshot_id": None}
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise StateQueryError(f"limit must be None or an int >= 0, got {limit!r}")
    if consistency == "latest" and read == "count" and _routed_by_key(st):
        return {"entries": [], "count": _live_count(c, st), "snapshot_id": None}
    if consistency == "snapshot":
        sid, state = _snapshot_state(c, st)
    else:
        sid, state = None, _live_state(c, st, keys if read == "get" else None)
    if read == "get":
        found = []
        for k in keys or ():
            try:
                if k in state:
                    found.append([k, state[k]])
                    continue
            except TypeError:  # an unhashable key is no key
                pass
            _check_key_type(c, st, k, state)
        return {"entries": found, "count": len(found), "snapshot_id": sid}
    if read == "count":
        return {"entries": [], "count": len(state), "snapshot_id": sid}
    return {"entries": [[k, v] for k, v in filter_items(_sorted(state), prefix, limit)],
            "count": len(state), "snapshot_id": sid}


def _sorted(state: dict) -> list[tuple[Any, Any]]:
    try:
        return sorted(state.items(), key=lambda kv: kv[0])
    except TypeError:  # keys that do not compare: as read
        return list(state.items())


def _check_key_type(c: Any, st: StatefulStage, key: Any, state: dict) -> None:
    types = {type(k) for k in islice(state, 1000)}
    if not types and st.keyed:
        try:  # a live read of absent keys: the last snapshot's keys say the type
            types = {type(k) for k in islice(_snapshot_state(c, st)[1], 1000)}
        except StateQueryError:
            return
    problem = key_type_problem(st.name, key, types)
    if problem is not None:
        raise StateQueryError(problem)


def _snapshot_state(c: Any, st: StatefulStage) -> tuple[int, dict]:
    """``(snapshot id, key -> value)`` of the stage in the job's last committed snapshot,
    decoded once per snapshot."""
    rec = c.last_snapshot or c.store.latest(c.job_id)
    if rec is None and c.config.initial_snapshot_name:
        # the state the job started from (a backfill's hand-off, an export) until it commits
        # a snapshot of its own
        rec = c.store.get_export(c.config.initial_snapshot_name)
    if rec is None:
        if c.config.processing_guarantee == "none":
            raise StateQueryError(
                f"job {c.name!r} takes no snapshots (processing_guarantee='none'), so its "
                f"stage {st.name!r} has no committed state to read: read it with "
                "consistency='latest', or submit the job with JobConfig(processing_guarantee="
                "'exactly_once' or 'at_least_once')")
        raise StateQueryError(
            f"job {c.name!r} has no committed snapshot yet, so its stage {st.name!r} has no "
            f"committed state to read: wait for the first snapshot (one every "
            f"{c.config.snapshot_interval_ms} ms, JobConfig(snapshot_interval_ms=...)), take "
            "one with job.take_snapshot(), or read with consistency='latest'")
    cache = c.__dict__.setdefault("_state_reads", {})
    ident = (rec.job_id, rec.snapshot_id, rec.name)
    hit = cache.get(st.name)
    if hit is not None and hit[0] == ident:
        return rec.snapshot_id, hit[1]
    try:
        reader = c.store.reader(rec)
        state = decode_stage(st, snapshot_entries(reader, [v for v in st.vertices
                                                            if v in rec.files]))
    except SnapshotStoreError as e:  # pruned or deleted meanwhile: a newer one is there
        raise StateUnavailableError(f"snapshot {rec.snapshot_id} of job {c.name!r} cannot be "
                                    f"read now ({e}); try again") from e
    cache[st.name] = (ident, state)
    return rec.snapshot_id, state


# stages whose key lives on one member: the others hold state of any key (the partial frames
# of a two-stage aggregation, a broadcast table on every member)
def _routed_by_key(st: StatefulStage) -> bool:
    return st.keyed and not st.two_stage and not st.broadcast \
        and not (st.kind == "aggregate" and len(st.vertices) > 1)


def _running(c: Any, st: StatefulStage) -> Any:
    execution = c.running_execution()
    if execution is None:
        raise StateUnavailableError(f"job {c.name!r} is {c.status.value.lower()}: no processor "
                                    f"holds stage {st.name!r}'s live state now; try again "
                                    "when it runs, or read with consistency='snapshot'")
    return execution


def _unavailable(c: Any, st: StatefulStage, member: str, reply: Any) -> StateUnavailableError:
    error = StateUnavailableError(
        f"stage {st.name!r} of job {c.name!r}: member {member} did not answer a state read "
        f"({reply}); it may have left the cluster, and the job restarts without it: try again")
    if isinstance(reply, BaseException):
        error.__cause__ = reply
    return error


def _live_count(c: Any, st: StatefulStage) -> int:
    """How many keys the stage's live processors hold, every member asked (no entry copied:
    a stage whose keys each live on one processor)."""
    execution = _running(c, st)
    members = list(execution.members)
    n = 0
    others = [m for m in members if m != execution.local]
    futures = {m: execution.call(m, ReadState(exec_key=execution.exec_key,
                                              vertices=list(st.vertices), keys=None,
                                              count_only=True), LIVE_READ_TIMEOUT_S)
               for m in others}
    if execution.local in members:
        n += count_local_state(execution.tasklets, st.vertices)
    replies = execution.gather(futures, LIVE_READ_TIMEOUT_S + 5, ReadState.OP) if futures \
        else {}
    for m, r in replies.items():
        if not isinstance(r, StateEntries) or r.count is None:
            raise _unavailable(c, st, m, r)
        n += r.count
    return n


def _live_state(c: Any, st: StatefulStage, keys: list | None) -> dict:
    """``key -> value`` of the stage's live processors: of ``keys`` (each asked of the member
    owning its partition), or all of it (every member asked)."""
    execution = _running(c, st)
    members = list(execution.members)
    asks: dict[str, list | None] = {}
    if keys is not None and _routed_by_key(st):
        for k in keys:
            try:
                owner = members[partition_of(k) % len(members)]
            except TypeError:
                continue  # a key that cannot be partitioned is in no state
            asks.setdefault(owner, []).append(k)  # type: ignore[union-attr]
    elif st.broadcast:
        asks[execution.local if execution.local in members else members[0]] = keys
    else:
        asks = {m: keys for m in members}
    entries: list[SavedEntry] = []
    local = asks.pop(execution.local, _NOT_ASKED) if execution.local in asks else _NOT_ASKED
    futures = {m: execution.call(m, ReadState(exec_key=execution.exec_key,
                                              vertices=list(st.vertices), keys=ks),
                                 LIVE_READ_TIMEOUT_S)
               for m, ks in asks.items()}
    if local is not _NOT_ASKED:  # this member's own processors: asked from this thread
        for part in read_local_state(execution.tasklets, st.vertices, local):
            entries.extend(entries_of(part))
    replies = execution.gather(futures, LIVE_READ_TIMEOUT_S + 5, ReadState.OP) if futures \
        else {}
    for m, r in replies.items():
        if isinstance(r, StateEntries):
            for part in r.parts:
                entries.extend(entries_of(part))
            continue
        raise _unavailable(c, st, m, r)
    return decode_stage(st, entries)


SUMMARY_REFRESH_S = 10.0
"""How often the dashboard's key counts decode a newer snapshot: a page that refreshes every
second must not decode a large state every second."""


def state_summary(c: Any) -> list[dict]:
    """The job's stateful stages with their key counts and bytes in its last committed
    snapshot (the dashboard's job page). A key count decodes the stage's entries as snapshot
    reads do, at most every :data:`SUMMARY_REFRESH_S` seconds: between, a row keeps the count
    (and snapshot id) it had."""
    rec = c.last_snapshot
    counts = c.__dict__.setdefault("_state_counts", {})  # stage -> (snapshot id, keys, time)
    now = time.monotonic()

    def keys(st: StatefulStage) -> tuple[int, int]:
        had = counts.get(st.name)
        if had is not None and (had[0] == rec.snapshot_id or now - had[2] < SUMMARY_REFRESH_S):
            return had[0], had[1]
        sid, state = _snapshot_state(c, st)
        counts[st.name] = (sid, len(state), now)
        return sid, len(state)
    return stage_summaries(c.definition, rec, keys if rec is not None else None)
