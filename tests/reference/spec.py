"""Pipeline specs and their inputs: small plain-data descriptions of a job.

A spec is a dict, printable in a failing example and free of callables::

    {"sources": [{"name": "a", "lag": 50}],
     "stages": [{"id": "a1", "kind": "stateless", "inputs": ["a"], "fn": "echo_odd"},
                {"id": "w", "kind": "window", "inputs": ["a1"], "window": ["sliding", 200, 100],
                 "keyed": True, "ops": ["count"], "late_sink": True}]}

Every source is read, then ``with_timestamps(event_time, lag)`` right away (so event time is
tracked per partition, inside the source). Stages name their inputs by id (a source's name or
an earlier stage's id) and are listed upstream first. Every source and stage is written to a
sink of its own, so a run shows what each one emitted. Stage kinds and their keys:

- ``stateless``: ``fn``, a name in ``functions.STATELESS`` (map, filter or flat_map).
- ``merge``: two inputs.
- ``window``: ``window`` (``["tumbling", size]``, ``["sliding", size, slide]`` or
  ``["session", gap]``), ``keyed``, ``ops`` (one per input: two inputs co-aggregate, as
  ``aggregate2``), ``late_sink`` (route late events to a sink); or, with ``"join": True``, two
  keyed inputs joined in each window and key (``.join``: a result per pair) and no ``ops``.
- ``rolling``: ``op``, ``keyed``.
- ``map_stateful``: ``ttl`` (ms or None), ``on_evict`` (bool); keyed by the record's key.
- ``aggregate`` (batch): ``op``, ``keyed``.
- ``distinct``: ``keyed`` (the first record of each key) or not (each distinct record).
- ``hash_join``: ``outer``; the build side is ``inputs["build"]``, ``(key, value)`` pairs.
- ``interval_join``: two inputs (left, right), ``lower`` and ``upper`` (ms, ``lower <=
  upper``): ``join_interval`` by the record's key, its pairs end the branch.
- ``asof_join``: two inputs (left, right), ``tolerance`` (ms or None), ``how`` ("left" or
  "inner"): ``join_asof`` by the record's key, its results end the branch.

Inputs are ``{"partitions": {source: [partition 0's records, ...]}, "build": [...]}``;
records are ``(ts, key, value, seq)`` (see ``functions.py``).
"""

from __future__ import annotations

from math import gcd
from typing import Any

__all__ = ["Spec", "Inputs", "OPS", "ORDER_FREE_OPS", "COMBINING_OPS", "SpecError",
           "stage_by_id", "source_names", "upstream_sources", "downstream_of", "watermark_step",
           "check_spec", "node_ids"]

Spec = dict[str, Any]
Inputs = dict[str, Any]

OPS = ("count", "sum", "count_sum", "avg", "max", "set", "sorted", "list")
"""Aggregate operations a spec may name (see ``model.aggregate``)."""
ORDER_FREE_OPS = ("count", "sum", "count_sum", "avg", "max", "set", "sorted")
"""Operations whose result does not depend on the order of their items."""
COMBINING_OPS = ("count", "sum", "count_sum", "avg", "max", "set", "list")
"""Operations with a combine (``sorted`` has none: it runs in one stage)."""


class SpecError(ValueError):
    """A spec the pipeline API would refuse, or one outside what the model covers."""


def source_names(spec: Spec) -> list[str]:
    return [s["name"] for s in spec["sources"]]


def node_ids(spec: Spec) -> list[str]:
    """Every source and stage id, upstream first."""
    return source_names(spec) + [s["id"] for s in spec["stages"]]


def stage_by_id(spec: Spec, node: str) -> dict | None:
    """The stage ``node``, or None for a source."""
    for s in spec["stages"]:
        if s["id"] == node:
            return s
    return None


def upstream_sources(spec: Spec, node: str) -> set[str]:
    """The sources whose records can reach ``node``."""
    if node in source_names(spec):
        return {node}
    out: set[str] = set()
    for up in stage_by_id(spec, node)["inputs"]:  # type: ignore[index]
        out |= upstream_sources(spec, up)
    return out


def downstream_of(spec: Spec, node: str) -> list[dict]:
    """The stages ``node`` feeds, directly or not."""
    reached = {node}
    out = []
    for s in spec["stages"]:
        if any(i in reached for i in s["inputs"]):
            reached.add(s["id"])
            out.append(s)
    return out


def watermark_step(spec: Spec, source: str) -> int:
    """The step the watermarks of ``source`` are rounded down to: the gcd of the slides (or
    session gaps) of the windows downstream; 0 when there is none (a watermark per chunk)."""
    step = 0
    for s in downstream_of(spec, source):
        if s["kind"] == "window":
            w = s["window"]
            step = gcd(step, w[1] if w[0] in ("tumbling", "session") else w[2])
    return step


def check_spec(spec: Spec) -> None:
    """Raises SpecError when ``spec`` is malformed or outside what the model covers."""
    from .functions import STATELESS
    names = source_names(spec)
    if not names or len(set(names)) != len(names):
        raise SpecError(f"sources must be one or more, with distinct names: {names}")
    for src in spec["sources"]:
        if not isinstance(src.get("lag"), int) or src["lag"] < 0:
            raise SpecError(f"source {src['name']!r}: lag must be a non-negative int")
    # what each node emits: (shape, timestamped, terminal)
    shape: dict[str, tuple[str, bool, bool]] = {n: ("record", True, False) for n in names}
    for s in spec["stages"]:
        sid, kind, ins = s["id"], s["kind"], s["inputs"]
        if sid in shape:
            raise SpecError(f"duplicate id {sid!r}")
        for i in ins:
            if i not in shape:
                raise SpecError(f"stage {sid!r}: unknown input {i!r} (list stages upstream first)")
            if shape[i][2]:
                raise SpecError(f"stage {sid!r}: its input {i!r} ends a branch")
            if shape[i][0] != "record":
                raise SpecError(f"stage {sid!r}: its input {i!r} does not emit records")
        stamped = all(shape[i][1] for i in ins)
        if kind in ("merge", "interval_join", "asof_join") or (kind == "window"
                                                                 and s.get("join")):
            want = 2
        else:
            want = (len(s.get("ops", ())) or 1) if kind == "window" else 1
        if len(ins) != want or (kind == "window" and len(ins) not in (1, 2)):
            raise SpecError(f"stage {sid!r} ({kind}) takes {want} input(s), got {ins}")
        if kind == "stateless":
            if s["fn"] not in STATELESS:
                raise SpecError(f"stage {sid!r}: unknown function {s['fn']!r}")
            shape[sid] = ("record", stamped, False)
        elif kind == "merge":
            shape[sid] = ("record", stamped, False)
        elif kind == "window":
            if not stamped:
                raise SpecError(f"stage {sid!r}: a window needs timestamped inputs")
            w = s["window"]
            if w[0] not in ("tumbling", "sliding", "session") or any(
                    not isinstance(x, int) or x <= 0 for x in w[1:]) or \
                    (w[0] == "sliding" and (len(w) != 3 or w[1] % w[2])) or \
                    (w[0] != "sliding" and len(w) != 2):
                raise SpecError(f"stage {sid!r}: bad window {w}")
            if s.get("join") and (s["ops"] or not s["keyed"] or w[0] == "session"):
                raise SpecError(f"stage {sid!r}: a window join is keyed, of sliding or "
                                "tumbling windows, without ops")
            for op in s["ops"]:
                if op not in ORDER_FREE_OPS:
                    raise SpecError(f"stage {sid!r}: window op {op!r} depends on arrival order")
                if (w[0] == "session" or len(ins) == 2) and op not in COMBINING_OPS:
                    raise SpecError(f"stage {sid!r}: {op!r} cannot combine (sessions and "
                                    "co-aggregation need combine)")
            if w[0] == "session" and len(ins) == 2:
                raise SpecError(f"stage {sid!r}: sessions of two inputs are not supported")
            shape[sid] = ("window result", False, True)
        elif kind in ("rolling", "aggregate"):
            if s["op"] not in OPS or (kind == "aggregate" and s["op"] not in ORDER_FREE_OPS):
                raise SpecError(f"stage {sid!r}: bad op {s['op']!r}")
            shape[sid] = ("result", False, True)
        elif kind == "map_stateful":
            if s["ttl"] is not None and (not isinstance(s["ttl"], int) or s["ttl"] <= 0):
                raise SpecError(f"stage {sid!r}: ttl must be a positive int or None")
            if s["ttl"] is not None and not stamped:
                raise SpecError(f"stage {sid!r}: a ttl needs timestamps")
            if s["on_evict"] and s["ttl"] is None:
                raise SpecError(f"stage {sid!r}: on_evict needs a ttl")
            # eviction results carry the watermark's time, which no test controls: they end
            # the branch
            shape[sid] = ("record", stamped, bool(s["on_evict"]))
        elif kind == "distinct":
            shape[sid] = ("record", False, False)
        elif kind == "hash_join":
            shape[sid] = ("pair", False, True)
        elif kind in ("interval_join", "asof_join"):
            if not stamped:
                raise SpecError(f"stage {sid!r}: a join in event time needs timestamped inputs")
            if kind == "interval_join" and not (
                    isinstance(s["lower"], int) and isinstance(s["upper"], int)
                    and s["lower"] <= s["upper"]):
                raise SpecError(f"stage {sid!r}: lower and upper must be ints, lower <= upper")
            if kind == "asof_join" and (s["how"] not in ("left", "inner") or (
                    s["tolerance"] is not None and (not isinstance(s["tolerance"], int)
                                                    or s["tolerance"] < 0))):
                raise SpecError(f"stage {sid!r}: how must be 'left' or 'inner', tolerance "
                                "None or an int >= 0")
            shape[sid] = ("pair", True, True)
        else:
            raise SpecError(f"stage {sid!r}: unknown kind {kind!r}")
