"""Hypothesis strategies for pipeline specs and their inputs, and the jetwake pipeline of a spec.

:func:`scenarios` draws a spec and inputs together: one or two sources of 1 to 6 partitions,
partitions skewed in event time (seconds apart, as after downtime), disorder within the lag,
disorder beyond it, quiet gaps, hot keys; and a chain of stages. Each record's key chooses its
partition, as a Kafka key does, and every keyed stage is keyed by it, so a key's items keep
one partition's order (see ``model.py``). Inputs whose outcome depends on timing no test
controls are repaired (the event moved within its partition's lag, or the key split where its
state's eviction is in doubt) and, if that fails, rejected with ``assume``.

:func:`build_pipeline` turns a spec into a jetwake ``Pipeline`` for given source and sink
factories, so that every runtime builds the same job.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from hypothesis import assume, note, strategies as st
from hypothesis.errors import InvalidArgument

from .functions import (
    STATELESS, count_and_sum, event_time, evicted_state, key_of, new_state, rank_of, value_of,
)
from .model import ModelResult, is_determinate, record_times, run_model
from .spec import COMBINING_OPS, ORDER_FREE_OPS, Inputs, Spec, check_spec

__all__ = ["scenarios", "specs", "inputs_for", "repair", "build_pipeline", "engine_op",
           "skewed_partitions", "joined_backlogs",
           "model_of", "out_label", "late_label", "SourceFactory", "SinkFactory"]

def skewed_partitions(partitions: int, per_partition: int, newest: int,
                      apart: int) -> list[list[tuple]]:
    """Records ``(ts, key, value, seq)`` of ``partitions`` partitions after downtime: partition
    ``p`` starts ``p * apart`` ms behind ``newest``, 20 ms a record, each up to 59 ms out of
    order (within a lag of 60), keyed by its partition (as a keyed topic's)."""
    return [[(newest - p * apart + 20 * i - (7 * i) % 60, f"k{p}", i % 10, 100 * p + i)
             for i in range(per_partition)] for p in range(partitions)]


def joined_backlogs() -> tuple[Spec, Inputs]:
    """Two sources of three partitions each after downtime (:func:`skewed_partitions`, 10 s
    apart, disorder within the lag), the second 15 ms later than the first, joined by key in
    an interval join (``[-30, 30]``) and an as-of join (tolerance 100): every record has
    partners, and under one watermark over all partitions the records of the partitions
    behind would all be late."""
    a = skewed_partitions(3, 40, 50_000, 10_000)
    b = [[(t + 15, k, v, 10_000 + s) for t, k, v, s in part] for part in a]
    spec = {"sources": [{"name": "a", "lag": 60}, {"name": "b", "lag": 60}],
            "stages": [{"id": "ij", "kind": "interval_join", "inputs": ["a", "b"],
                        "lower": -30, "upper": 30},
                       {"id": "aj", "kind": "asof_join", "inputs": ["a", "b"],
                        "tolerance": 100, "how": "left"}]}
    return spec, {"partitions": {"a": a, "b": b}, "build": []}


SourceFactory = Callable[[str, list], Any]
"""``(source name, its partitions' records) -> jetwake Source``."""
SinkFactory = Callable[[str], Any]
"""``label -> jetwake Sink``; :func:`out_label` and :func:`late_label` name the labels."""

WINDOW_OPS = list(ORDER_FREE_OPS)
COMBINING_WINDOW_OPS = [op for op in ORDER_FREE_OPS if op in COMBINING_OPS]
ROLLING_OPS = ["count", "sum", "count_sum", "avg", "max", "set", "sorted", "list"]


# --- specs ---------------------------------------------------------------------------------------

class _Ids:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


@st.composite
def _window(draw: Any, ids: _Ids, inputs: list[str]) -> dict:
    two = len(inputs) == 2
    kind = draw(st.sampled_from(["tumbling", "sliding"] + ([] if two else ["session"])))
    if kind == "tumbling":
        w = ["tumbling", draw(st.sampled_from([50, 100, 300, 1000]))]
    elif kind == "sliding":
        slide = draw(st.sampled_from([25, 50, 100, 250]))
        w = ["sliding", slide * draw(st.sampled_from([2, 3, 4])), slide]
    else:
        w = ["session", draw(st.sampled_from([20, 60, 200, 1000]))]
    ops = COMBINING_WINDOW_OPS if kind == "session" or two else WINDOW_OPS
    if two and kind != "session" and draw(st.integers(0, 2)) == 0:
        return {"id": ids("w"), "kind": "window", "inputs": inputs, "window": w, "keyed": True,
                "ops": [], "join": True, "late_sink": draw(st.booleans())}
    return {"id": ids("w"), "kind": "window", "inputs": inputs, "window": w,
            "keyed": draw(st.booleans()), "ops": [draw(st.sampled_from(ops)) for _ in inputs],
            "late_sink": draw(st.booleans())}


def _stateless_chain(draw: Any, ids: _Ids, node: str, stages: list, most: int) -> str:
    for _ in range(draw(st.integers(0, most))):
        sid = ids("f")
        stages.append({"id": sid, "kind": "stateless", "inputs": [node],
                       "fn": draw(st.sampled_from(sorted(STATELESS)))})
        node = sid
    return node


@st.composite
def _tail(draw: Any, ids: _Ids, node: str, ordered: bool, stages: list,
          streaming: bool = False) -> None:
    """One branch off ``node``; ``ordered``: a key's items arrive in partition order there;
    ``streaming``: no batch ``aggregate`` (it emits at the end of a stream: never)."""
    kinds = ["window", "window", "aggregate", "distinct", "hash_join", "rolling"]
    if streaming:
        kinds.remove("aggregate")
    if ordered:
        kinds += ["rolling", "map_stateful", "map_stateful"]
    kind = draw(st.sampled_from(kinds))
    if kind == "window":
        stages.append(draw(_window(ids, [node])))
    elif kind == "aggregate":
        stages.append({"id": ids("g"), "kind": "aggregate", "inputs": [node],
                       "op": draw(st.sampled_from(list(ORDER_FREE_OPS))),
                       "keyed": draw(st.booleans())})
    elif kind == "hash_join":
        stages.append({"id": ids("j"), "kind": "hash_join", "inputs": [node],
                       "outer": draw(st.booleans())})
    elif kind == "rolling":
        # a key's running results depend on its items' order, fixed in one partition; a
        # running count (1..n) does not
        keyed = draw(st.booleans())
        op = draw(st.sampled_from(ROLLING_OPS)) if keyed and ordered else "count"
        stages.append({"id": ids("r"), "kind": "rolling", "inputs": [node], "op": op,
                       "keyed": keyed})
    elif kind == "distinct":
        keyed = ordered and draw(st.booleans())
        sid = ids("d")
        stages.append({"id": sid, "kind": "distinct", "inputs": [node], "keyed": keyed})
        if not streaming and draw(st.booleans()):
            stages.append({"id": ids("g"), "kind": "aggregate", "inputs": [sid],
                           "op": draw(st.sampled_from(list(ORDER_FREE_OPS))),
                           "keyed": draw(st.booleans())})
    else:
        draw(_map_stateful(ids, node, stages, False))


@st.composite
def _map_stateful(draw: Any, ids: _Ids, node: str, stages: list, with_window: bool) -> None:
    """A map_stateful branch, and maybe a window after it or beside it: either rounds the
    watermarks to a step, the one case where a single partition fixes when a ttl expires
    (``with_window``: a ttl and a window, always)."""
    ttls = [30, 100, 200, 1000] + ([] if with_window else [None, 5000])
    ttl = draw(st.sampled_from(ttls))
    on_evict = ttl is not None and draw(st.booleans())
    sid = ids("ms")
    stages.append({"id": sid, "kind": "map_stateful", "inputs": [node], "ttl": ttl,
                   "on_evict": on_evict})
    follows = ["beside"] + ([] if on_evict else ["after"]) + ([] if with_window else ["none"])
    follow = draw(st.sampled_from(follows))
    if follow != "none":
        stages.append(draw(_window(ids, [sid if follow == "after" else node])))


@st.composite
def _stream_join(draw: Any, ids: _Ids, inputs: list[str]) -> dict:
    """A join of two streams in event time: an interval join (bounds around the left time,
    before it, after it, or one instant) or an as-of join (with or without a tolerance)."""
    if draw(st.booleans()):
        lower, upper = draw(st.sampled_from([(-50, 50), (0, 100), (-200, 0), (10, 30),
                                             (0, 0), (-20, -5)]))
        return {"id": ids("ij"), "kind": "interval_join", "inputs": inputs, "lower": lower,
                "upper": upper}
    return {"id": ids("aj"), "kind": "asof_join", "inputs": inputs,
            "tolerance": draw(st.sampled_from([None, None, 0, 50, 300])),
            "how": draw(st.sampled_from(["left", "inner"]))}


@st.composite
def specs(draw: Any, streaming: bool = False) -> Spec:
    """A pipeline spec: one source and a chain with one to three branches (or windows of
    several slides, or a ttl stage with a window), or two sources merged, co-aggregated in
    windows or joined in event time (``interval_join``, ``asof_join``). ``streaming``: for a
    streaming job (or a backfill over Kafka), without the batch ``aggregate``, which emits at
    the end of a stream (``model.py``, "Streaming")."""
    ids = _Ids()
    lags = st.sampled_from([0, 5, 20, 50, 200])
    shape = draw(st.sampled_from(["single", "single", "windows", "ttl", "merge", "cogroup",
                                  "join"]))
    names = ["a", "b"] if shape in ("merge", "cogroup", "join") else ["a"]
    sources = [{"name": n, "lag": draw(lags)} for n in names]
    stages: list[dict] = []
    heads = [_stateless_chain(draw, ids, n, stages, 2) for n in names]
    if shape == "windows":  # windows of several slides: watermarks step by their gcd
        for _ in range(draw(st.integers(2, 3))):
            stages.append(draw(_window(ids, [heads[0]])))
        trunk, ordered = None, True
    elif shape == "ttl":  # a ttl with a window beside it or after it
        draw(_map_stateful(ids, heads[0], stages, True))
        trunk, ordered = None, True
    elif shape == "single":
        trunk, ordered = heads[0], True
    elif shape == "merge":
        m = ids("m")
        stages.append({"id": m, "kind": "merge", "inputs": heads})
        trunk, ordered = _stateless_chain(draw, ids, m, stages, 1), False
    elif shape == "join":
        stages.append(draw(_stream_join(ids, heads)))
        trunk, ordered = None, True
    else:
        stages.append(draw(_window(ids, heads)))
        trunk, ordered = None, True
    if trunk is not None:
        for _ in range(draw(st.integers(1, 3))):
            draw(_tail(ids, trunk, ordered, stages, streaming))
    elif shape in ("cogroup", "join") and draw(st.booleans()):
        draw(_tail(ids, heads[draw(st.integers(0, 1))], True, stages, streaming))
    spec = {"sources": sources, "stages": stages}
    check_spec(spec)
    return spec


# --- inputs --------------------------------------------------------------------------------------

@st.composite
def _partitions(draw: Any, source_index: int, lag: int, beyond_lag: bool,
                one_partition: bool, max_records: int) -> list[list[tuple]]:
    """One source's partitions. The knobs are drawn (so they shrink); the records follow from
    them and a drawn seed."""
    n = 1 if one_partition else draw(st.sampled_from([1, 1, 2, 3, 4, 6]))
    n_keys = n + draw(st.integers(0, 4))
    counts = draw(st.lists(st.integers(1, max_records), min_size=n, max_size=n))
    skew = draw(st.sampled_from([0, 0, 700, 3_000, 20_000]))
    offsets = draw(st.permutations(range(n)))
    spacing = draw(st.sampled_from([1, 5, 20, 60]))
    p_disorder = draw(st.sampled_from([0.0, 0.2, 0.5]))
    p_beyond = draw(st.sampled_from([0.0, 0.05, 0.2, 0.4])) if beyond_lag else 0.0
    beyond = draw(st.sampled_from([30, 300, 3_000]))
    p_gap = draw(st.sampled_from([0.0, 0.03, 0.1]))
    gap = draw(st.sampled_from([500, 5_000, 30_000]))
    hot = draw(st.booleans())
    # timestamps on a coarse grain meet window, step and ttl boundaries exactly
    grain = draw(st.sampled_from([1, 1, 10, 50]))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    # each key chooses its partition, as a Kafka key does; every partition has one at least
    home = {f"k{j}": j if j < n else rng.randrange(n) for j in range(n_keys)}
    seq = source_index * 1_000_000
    parts = []
    for p in range(n):
        keys = sorted(k for k, q in home.items() if q == p)
        weights = [5 if hot and i == 0 else 1 for i in range(len(keys))]
        nominal = 1_000 + offsets[p] * skew
        records = []
        for _ in range(counts[p]):
            nominal += rng.randint(0, spacing)
            if rng.random() < p_gap:
                nominal += gap  # a quiet spell in event time
            ts = nominal // grain * grain
            if rng.random() < p_beyond:
                ts = max(ts - lag - rng.randint(1, beyond), 0) // grain * grain
            elif rng.random() < p_disorder:
                ts -= rng.randint(0, lag) // grain * grain
            records.append((ts, rng.choices(keys, weights)[0], rng.randint(0, 99), seq))
            seq += 1
        parts.append(records)
    return parts


@st.composite
def inputs_for(draw: Any, spec: Spec, beyond_lag: bool = True, one_partition: bool = False,
               max_records: int = 40) -> Inputs:
    """Inputs for ``spec``: each source's partitions and a build side for hash joins.
    ``beyond_lag=False``: every event within its partition's lag; ``one_partition``: each
    source has one; ``max_records``: the most records in a partition."""
    parts = {src["name"]: draw(_partitions(i, src["lag"], beyond_lag, one_partition,
                                           max_records))
             for i, src in enumerate(spec["sources"])}
    keys = sorted({r[1] for ps in parts.values() for records in ps for r in records})
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    build = [(k, f"{k}:{v}") for k in keys for v in range(rng.choice([0, 1, 1, 2]))]
    return {"partitions": parts, "build": build}


def repair(spec: Spec, inputs: Inputs, rounds: int = 200) -> Inputs:
    """``inputs`` changed so that the model leaves nothing undetermined where it can: an event
    whose lateness is in doubt moves to the edge of its partition's lag (which changes no
    partition's highest timestamp), and where a key's state may or may not have expired, the
    key's later records in that partition take a new key. Order doubts are left (the
    generator does not make them)."""
    parts = {s: [list(records) for records in ps] for s, ps in inputs["partitions"].items()}
    lags = {s["name"]: s["lag"] for s in spec["sources"]}
    for _ in range(rounds):
        current = {"partitions": parts, "build": inputs.get("build", [])}
        model = run_model(spec, current)
        doubts = model.indeterminate
        if not doubts or any(d.what == "order" for d in doubts):
            return current
        late = {d.position for d in doubts if d.what == "late"}
        if late:  # moving one event changes no other event's fate: all at once
            times = record_times(spec, current)
            for source, p, i in late:
                r = parts[source][p][i]
                parts[source][p][i] = (times[(source, p, i)].top_before - lags[source],) + \
                    tuple(r[1:])
            continue
        source, p, i = doubts[0].position  # a split changes the key's later fates: one a round
        key = parts[source][p][i][1]
        parts[source][p][i:] = [(x[0], f"{key}.{i}") + tuple(x[2:]) if x[1] == key else x
                                for x in parts[source][p][i:]]
    return {"partitions": parts, "build": inputs.get("build", [])}


def model_of(spec: Spec, inputs: Inputs) -> ModelResult:
    """The model's result, noted for a failing example."""
    m = run_model(spec, inputs)
    try:
        note(f"model: late {m.late_counts}, beyond their partition's lag "
             f"{len(m.beyond_lag)}, undetermined {m.indeterminate[:3]}")
    except InvalidArgument:
        pass  # not inside a hypothesis test: nothing to note
    return m


@st.composite
def scenarios(draw: Any, beyond_lag: bool = True, one_partition: bool = False,
              max_records: int = 40, streaming: bool = False,
              excluding: Callable[[Spec, Inputs], bool] | None = None
              ) -> tuple[Spec, Inputs]:
    """A spec and inputs whose outcome the input fixes (``model.is_determinate``); the
    options as in :func:`inputs_for`; ``streaming``: a spec for a streaming job
    (:func:`specs`), to compare with ``run_model(..., bounded=False)``; ``excluding``: a
    predicate naming a case a runtime cannot match by design (such scenarios are not drawn).
    Every partition has a record, so none holds a streaming job's watermark back."""
    spec = draw(specs(streaming=streaming))
    inputs = repair(spec, draw(inputs_for(spec, beyond_lag, one_partition, max_records)))
    assume(is_determinate(spec, inputs))
    if excluding is not None:
        assume(not excluding(spec, inputs))
    return spec, inputs


# --- the jetwake pipeline of a spec --------------------------------------------------------------

def out_label(node: str) -> str:
    """The sink label of what ``node`` emits."""
    return f"out-{node}"


def late_label(node: str) -> str:
    """The sink label of the late events of window stage ``node``."""
    return f"late-{node}"


def _append(acc: list, x: Any) -> list:
    acc.append(x)
    return acc


def engine_op(name: str) -> Any:
    """The jetwake aggregate operation a spec's operation name stands for."""
    from jetwake import AggregateOperation, AggregateOperations as ops
    if name == "count":
        return ops.counting()
    if name == "sum":
        return ops.summing(value_of)
    if name == "count_sum":
        return ops.all_of(ops.counting(), ops.summing(value_of))
    if name == "avg":
        return ops.averaging(value_of)
    if name == "max":
        return ops.max_by(rank_of)
    if name == "set":
        return ops.to_set()
    if name == "sorted":  # no combine: a single-stage path
        return AggregateOperation(list, _append, export=sorted)
    if name == "list":
        return ops.to_list()
    raise ValueError(f"unknown operation {name!r}")


def _window_definition(w: list) -> Any:
    from jetwake import WindowDefinition
    if w[0] == "tumbling":
        return WindowDefinition.tumbling(w[1])
    if w[0] == "sliding":
        return WindowDefinition.sliding(w[1], w[2])
    return WindowDefinition.session(w[1])


def build_pipeline(spec: Spec, inputs: Inputs, source_for: SourceFactory,
                   sink_for: SinkFactory) -> Any:
    """The jetwake ``Pipeline`` of ``spec``: each source from ``source_for(name, partitions)``
    with ``with_timestamps`` right after it, each stage named by its id, and every source and
    stage written to ``sink_for(out_label(id))`` (late events to ``sink_for(late_label(id))``).

    A source of one partition runs on one processor: a spare processor with no partition
    would hold the watermark back until it finished, which no test controls. Idleness is
    turned off (``idle_timeout=0``): the model does not cover it.
    """
    from jetwake import Pipeline, Sources
    check_spec(spec)
    p = Pipeline()
    stage: dict[str, Any] = {}
    for src in spec["sources"]:
        name = src["name"]
        parts = inputs["partitions"][name]
        read = p.read_from(source_for(name, parts)).set_name(name)
        if len(parts) == 1:
            read.set_local_parallelism(1)
        stage[name] = read.with_timestamps(event_time, src["lag"], idle_timeout=0)
        stage[name].write_to(sink_for(out_label(name)))
    for s in spec["stages"]:
        sid, kind = s["id"], s["kind"]
        up = stage[s["inputs"][0]]
        if kind == "stateless":
            how, fn = STATELESS[s["fn"]]
            out = getattr(up, how)(fn)
        elif kind == "merge":
            out = up.merge(stage[s["inputs"][1]])
        elif kind == "window":
            w = up.window(_window_definition(s["window"]))
            if s["late_sink"]:
                w = w.late_events_to(sink_for(late_label(sid)))
            ops = [engine_op(op) for op in s["ops"]]
            if s.get("join"):
                out = w.group_by(key_of).join(stage[s["inputs"][1]].group_by(key_of))
            elif len(ops) == 2:
                other = stage[s["inputs"][1]]
                out = (w.group_by(key_of).aggregate2(other.group_by(key_of), *ops)
                       if s["keyed"] else w.aggregate2(other, *ops))
            else:
                out = w.group_by(key_of).aggregate(ops[0]) if s["keyed"] else w.aggregate(ops[0])
        elif kind == "rolling":
            op = engine_op(s["op"])
            out = up.group_by(key_of).rolling_aggregate(op) if s["keyed"] else \
                up.rolling_aggregate(op)
        elif kind == "map_stateful":
            out = up.group_by(key_of).map_stateful(
                new_state, count_and_sum, ttl=s["ttl"],
                on_evict=evicted_state if s["on_evict"] else None)
        elif kind == "aggregate":
            op = engine_op(s["op"])
            out = up.group_by(key_of).aggregate(op) if s["keyed"] else up.aggregate(op)
        elif kind == "distinct":
            out = up.group_by(key_of).distinct() if s["keyed"] else up.distinct()
        elif kind == "interval_join":
            out = up.join_interval(stage[s["inputs"][1]], key_of, key_of, s["lower"],
                                   s["upper"])
        elif kind == "asof_join":
            out = up.join_asof(stage[s["inputs"][1]], key_of, key_of,
                               tolerance_ms=s["tolerance"], how=s["how"])
        elif kind == "hash_join":
            build = p.read_from(Sources.items(list(inputs.get("build", [])))) \
                .set_name(f"{sid}-build")
            out = up.hash_join(build, key_of, outer=s["outer"])
        else:
            raise ValueError(f"unknown stage kind {kind!r}")
        stage[sid] = out.set_name(sid)
        stage[sid].write_to(sink_for(out_label(sid)))
    return p
