"""A brute-force model of what a pipeline spec emits, for the conformance tests.

Given a spec (``spec.py``) and, for each source, each partition's records in order, the model
computes what every stage emits, which events each window or ttl stage judges late, and
whether all of that is fixed by the input at all. It is written to be obviously right rather
than fast: every window's result is an aggregate over the list of its events, a rolling
result the aggregate of every item so far. It imports nothing from jetwake: the engine's
semantics are restated here, from the documentation and the processors' stated rules.

Event time
----------
Each source tracks event time per partition, as Jet's EventTimeMapper: partition ``P`` keeps
its highest timestamp so far ``top_P``, its watermark is ``top_P - lag`` rounded down to the
source's *step* (the gcd of the slides, or session gaps, of the windows downstream; without a
window, a watermark per chunk and no rounding), and the source emits the lowest watermark of
its partitions. A stage sees the lowest watermark of its inputs. What an event meets:

- a sliding or tumbling window judges it late when its timestamp is below the stage's
  watermark rounded down to the slide (its frame is closed);
- a session window, when its timestamp is below the watermark;
- ``map_stateful`` with a ttl, when its timestamp is more than the ttl below the watermark;
  and before the event, the key's state was evicted if the watermark had passed the key's
  highest timestamp (since the state was created) plus the ttl (Jet's rule: a state exactly
  the ttl behind the watermark is kept, as an event exactly the ttl behind it is on time).

- a join of two streams (``interval_join``, ``asof_join``), when its timestamp is below the
  watermark (the lowest of its two inputs').

Joins of two streams
--------------------
``interval_join`` emits every pair of an on-time left and an on-time right record of the same
key whose right time lies in ``[left time + lower, left time + upper]`` (both bounds
inclusive), as ``(left, right)``. ``asof_join`` matches each on-time left record with the
latest on-time right record of its key at or before its time (within ``tolerance`` of it when
there is one; among right records of one time, the last in its partition's order, each key's
right records all coming from one partition), as ``(left, right)``, or ``(left, None)``
without one when ``how`` is "left" (nothing when "inner"). A streaming run has emitted the
left records below the join's final watermark only: the others still wait for it to pass
them. A join's inputs come from two sources, so its watermark is never fixed by one
partition: an event beyond its partition's lag is on time determinately only if it is on time
at its own partition's watermark, and never determinately late.

Determinacy
-----------
The watermark ``W`` a stage has seen when an event ``e`` of partition ``P`` arrives depends on
how far the other partitions, the other processors and the stages in between have got, which
no test controls. What is fixed:

- ``W <= wm_P(before e)``: the watermark of ``e``'s own partition from the records before
  ``e`` (``e`` leaves the source before any watermark it advances, and every stage forwards a
  watermark only after the items that preceded it).
- ``W == wm_P(before e)`` when the stage has one partition in all its inputs, reads the source
  directly (stateless stages in between only) and the watermarks are rounded to a step (not one
  per chunk, whose boundaries no test controls); the runtime reads such a source with one
  processor (a processor without partitions would hold ``W`` back until it finished).
- Otherwise ``W`` may be as low as no watermark at all: a partition not read yet holds the
  source's watermark back, and a queue that has not delivered a watermark holds a stage's.

An event within the lag of its own partition (``t >= top_P(before e) - lag``) is never late,
at any stage, and the model asserts so. An event beyond it is late or on time *determinately*
only when the answer is the same for every ``W`` in ``[lowest, wm_P(before e)]``: with several
partitions that means "on time even at ``wm_P(before e)``" (as when rounding to the step or
slide leaves room), and a determinately late event needs a single partition read directly.
The same holds for whether a ttl evicted a key's state before the event. An event beyond the
lag of its own partition whose fate depends on the other partitions' progress is the one case
the conformance suite does not test, by design: Jet and Flink behave the same way there. The
model lists such events in ``ModelResult.indeterminate`` and :func:`is_determinate` says
whether there are none; the generator repairs or rejects such inputs.

``W`` has no fixed upper bound tighter than ``wm_P(before e)``: the watermark of another
partition stops holding it back once that partition's processor has finished reading its
(bounded) input, since an input that ended no longer counts in a stage's minimum.

Keyed order
-----------
Rolling aggregates, ``map_stateful`` and a keyed ``distinct`` see a key's items in arrival
order, which is fixed only when all of the key's items come from one partition (as a Kafka
key's do) and travel one path: every keyed stage on the way is keyed by the same key, and no
merge (whose processors take items from any upstream processor) lies between. The model
requires that of those stages (a rolling count, whose results are 1..n whatever the order,
excepted) and reports an ``order`` indeterminacy otherwise.

A bounded source ends the stream: every window still open is emitted, every session closed,
and every ``map_stateful`` state with a ttl evicted (``on_evict`` called on it).

Streaming (``run_model(..., bounded=False)``)
----------------------------------------------
A Kafka topic does not end: a streaming job over it (and a Spark backfill, which emits what a
streaming job would have emitted by the end of its input, docs/backfill.md) has, once it has
read everything, the *final watermark* of each source, the lowest over its partitions of
``top_P - lag`` rounded down to the step (:func:`final_watermarks`); a stage has the lowest of
its sources'. Only the windows whose end is at or below it are emitted (sliding and tumbling
windows, and sessions, whose end is the last event's time plus the gap), only the ttl states
it has passed (``evicted_by``) are evicted (``on_evict`` called), and there is no end-of-stream
flush: the batch ``aggregate`` emits nothing (the generator leaves it out of streaming specs,
``specs(streaming=True)``). Every partition has a record (``_check_inputs``), so no partition
holds the final watermark back for ever; what events meet on the way, and so which are late,
is the same as in a bounded run. The final watermark is fixed by the input: it does not
depend on how the partitions interleaved.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .functions import (
    STATELESS, count_and_sum, event_time, evicted_state, key_of, new_state, rank_of, value_of,
)
from .result import RunResult, canonical, multiset
from .spec import (
    Inputs, Spec, check_spec, node_ids, source_names, upstream_sources, watermark_step,
)

__all__ = ["NO_WATERMARK", "Position", "RecordTime", "Event", "Indeterminacy", "ModelResult",
           "run_model", "is_determinate", "record_times", "final_watermarks", "aggregate",
           "throttle",
           "window_starts", "late_at_window", "late_at_session", "late_at_ttl", "expected_run"]

NO_WATERMARK = -(2**63)
"""The watermark of an input that has not sent one yet: nothing is late against it."""


# --- event time of the records -------------------------------------------------------------------

Position = tuple  # (source, partition, index): where a record sits in its input


@dataclass(frozen=True)
class RecordTime:
    """A record's timestamp and the event time of its partition before it."""
    ts: int
    top_before: int   # the partition's highest timestamp before it (NO_WATERMARK: none)
    wm_before: int    # the partition's watermark before it, rounded to the source's step
    within_lag: bool  # ts >= top_before - lag: never late anywhere


def throttle(wm: int, step: int) -> int:
    """``wm`` rounded down to a multiple of ``step`` (unchanged for a step of 0 or 1)."""
    if wm == NO_WATERMARK or step <= 1:
        return wm
    return wm - wm % step


def record_times(spec: Spec, inputs: Inputs) -> dict[Position, RecordTime]:
    """The event time of every record, by position."""
    out = {}
    for src in spec["sources"]:
        name, lag = src["name"], src["lag"]
        step = watermark_step(spec, name)
        for p, records in enumerate(inputs["partitions"][name]):
            top = NO_WATERMARK
            for i, r in enumerate(records):
                t = event_time(r)
                wm = NO_WATERMARK if top == NO_WATERMARK else throttle(top - lag, step)
                within = top == NO_WATERMARK or t >= top - lag
                out[(name, p, i)] = RecordTime(t, top, wm, within)
                top = max(top, t)
    return out


def final_watermarks(spec: Spec, inputs: Inputs) -> dict[str, int]:
    """Each source's watermark once every record is read (a streaming run's last): the lowest
    over its partitions of the highest timestamp less the lag, rounded down to the step."""
    out = {}
    for src in spec["sources"]:
        name, lag = src["name"], src["lag"]
        step = watermark_step(spec, name)
        out[name] = min(throttle(max(map(event_time, records)) - lag, step)
                        for records in inputs["partitions"][name])
    return out


# --- lateness rules --------------------------------------------------------------------------

def late_at_window(t: int, wm: int, slide: int) -> bool:
    """Sliding and tumbling windows: late when below the watermark rounded down to a frame."""
    return wm != NO_WATERMARK and t < wm - wm % slide


def late_at_session(t: int, wm: int) -> bool:
    """Session windows: late when below the watermark."""
    return wm != NO_WATERMARK and t < wm


def late_at_ttl(t: int, wm: int, ttl: int) -> bool:
    """map_stateful with a ttl: late when more than the ttl below the watermark."""
    return wm != NO_WATERMARK and t < wm - ttl


def evicted_by(wm: int, last_ts: int, ttl: int) -> bool:
    """Whether watermark ``wm`` evicted a state whose highest timestamp is ``last_ts``: once
    it passes ``last_ts + ttl`` (strictly, so that an on-time event never finds its own key's
    state expired at the watermark it arrived at)."""
    return wm != NO_WATERMARK and wm > last_ts + ttl


# --- aggregate operations ------------------------------------------------------------------------

def aggregate(op: str, items: list) -> Any:
    """The result of operation ``op`` over ``items`` (in their order), computed from scratch."""
    if op == "count":
        return len(items)
    if op == "sum":
        return sum(value_of(x) for x in items)
    if op == "count_sum":
        return (len(items), sum(value_of(x) for x in items))
    if op == "avg":
        return sum(value_of(x) for x in items) / len(items) if items else None
    if op == "max":
        return max(items, key=rank_of) if items else None
    if op == "set":
        return set(items)
    if op == "sorted":
        return sorted(items)
    if op == "list":
        return list(items)
    raise ValueError(f"unknown operation {op!r}")


def window_starts(t: int, size: int, slide: int) -> list[int]:
    """The starts of the sliding windows (``size``, ``slide``, aligned to 0) that hold ``t``."""
    first = (t - size) // slide * slide
    return [s for s in range(first, t + 1, slide) if s <= t < s + size]


# --- the model --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Event:
    """An item between stages: the item, its timestamp (None once a stage dropped it) and
    where it came from, ``(source, partition, index, *j)`` (``j``: its place among a flat_map's
    results), which orders a key's items in one partition."""
    item: Any
    ts: int | None
    origin: tuple

    @property
    def position(self) -> Position:
        return self.origin[:3]


@dataclass(frozen=True)
class Indeterminacy:
    """Something the input does not fix: at ``stage``, the fate of the event at ``position``
    (``what`` is "late", "evicted" or "order")."""
    stage: str
    position: Position
    what: str
    detail: str


@dataclass
class ModelResult:
    """What the model says a spec does with its inputs."""
    outputs: dict[str, list] = field(default_factory=dict)
    """Every source and stage id -> what it emits (the items, canonical)."""
    late: dict[str, list] = field(default_factory=dict)
    """Every window and ttl stage -> the items it judges late (canonical)."""
    late_positions: dict[str, list] = field(default_factory=dict)
    """The same, by the position of the record each late item came from."""
    indeterminate: list[Indeterminacy] = field(default_factory=list)
    evicted_before: dict[str, list] = field(default_factory=dict)
    """Every ttl stage -> the positions of the events that found their key's state expired
    (evicted during the stream, not at its end)."""
    beyond_lag: list[Position] = field(default_factory=list)
    """The records below their own partition's highest timestamp so far minus the lag."""
    late_sinks: tuple[str, ...] = ()
    """The window stages that route late events to a sink."""
    bounded: bool = True
    """Whether the run ended the stream (a batch run) or stopped with everything read (a
    streaming run: windows closed, states evicted only up to the final watermark)."""
    final_watermark: dict[str, int] = field(default_factory=dict)
    """Streaming: every source and stage -> the watermark it has once everything is read."""

    @property
    def late_counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.late.items()}


class _Model:
    def __init__(self, spec: Spec, inputs: Inputs, bounded: bool = True) -> None:
        check_spec(spec)
        _check_inputs(spec, inputs)
        self.spec = spec
        self.inputs = inputs
        self.bounded = bounded
        self.times = record_times(spec, inputs)
        self.steps = {s: watermark_step(spec, s) for s in source_names(spec)}
        self.partitions = {s: len(inputs["partitions"][s]) for s in source_names(spec)}
        self.result = ModelResult(beyond_lag=[p for p, rt in self.times.items()
                                              if not rt.within_lag], bounded=bounded)
        if not bounded:
            finals = final_watermarks(spec, inputs)
            self.result.final_watermark = {
                node: min(finals[s] for s in upstream_sources(spec, node))
                for node in node_ids(spec)}
        self.events: dict[str, list[Event]] = {}
        self.direct: dict[str, bool] = {}   # reaches the source through stateless stages only
        self.ordered: dict[str, bool] = {}  # a key's items keep their partition's order

    def run(self) -> ModelResult:
        for s in source_names(self.spec):
            self.events[s] = [Event(r, event_time(r), (s, p, i))
                              for p, records in enumerate(self.inputs["partitions"][s])
                              for i, r in enumerate(records)]
            self.direct[s] = self.ordered[s] = True
        for stage in self.spec["stages"]:
            sid = stage["id"]
            ins = [self.events[i] for i in stage["inputs"]]
            kind = stage["kind"]
            self.direct[sid] = kind == "stateless" and self.direct[stage["inputs"][0]]
            # merge and an unkeyed distinct spread a key's items over their processors
            keeps_order = kind in ("stateless", "map_stateful") or (
                kind == "distinct" and stage["keyed"])
            self.ordered[sid] = keeps_order and all(self.ordered[i] for i in stage["inputs"])
            self.events[sid] = getattr(self, "_" + kind)(stage, *ins)
        for node, events in self.events.items():
            self.result.outputs[node] = [canonical(e.item) for e in events]
        return self.result

    def closed(self, stage: dict, end: int) -> bool:
        """Whether a window (or session) of ``stage`` ending at ``end`` is emitted: always at
        the end of a bounded stream; streaming, once the final watermark reaches its end."""
        return self.bounded or end <= self.result.final_watermark[stage["id"]]

    # --- what a stage's events meet --------------------------------------------------------

    def watermark_range(self, stage: dict, e: Event) -> tuple[int, int]:
        """The lowest and highest watermark ``stage`` may have seen when ``e`` arrives."""
        sid = stage["id"]
        source = e.origin[0]
        hi = self.times[e.position].wm_before
        exact = (sum(self.partitions[s] for s in upstream_sources(self.spec, sid)) == 1
                 and all(self.direct[i] for i in stage["inputs"])
                 and self.steps[source] > 0)
        return (hi if exact else NO_WATERMARK), hi

    def _judge(self, stage: dict, e: Event, late_fn: Any) -> bool:
        """Whether ``e`` is late at ``stage`` (by ``late_fn(ts, wm)``); records an
        indeterminacy when that depends on the watermark, and checks that an event within its
        partition's lag is never late."""
        lo, hi = self.watermark_range(stage, e)
        late_lo, late_hi = late_fn(e.ts, lo), late_fn(e.ts, hi)
        if late_hi and self.times[e.position].within_lag:
            raise AssertionError(f"model: {e} is within its partition's lag but late at "
                                 f"{stage['id']!r} (watermark {hi})")
        if late_lo != late_hi:
            self._indeterminate(stage, e, "late", f"ts {e.ts}: on time at watermark {lo}, "
                                f"late at {hi}")
        return late_hi

    def _indeterminate(self, stage: dict, e: Event, what: str, detail: str) -> None:
        self.result.indeterminate.append(Indeterminacy(stage["id"], e.position, what, detail))

    def _late(self, stage: dict, e: Event) -> None:
        self.result.late.setdefault(stage["id"], []).append(canonical(e.item))
        self.result.late_positions.setdefault(stage["id"], []).append(e.position)

    def _in_key_order(self, stage: dict, events: list[Event], key_fn: Any,
                      order_free: Any = False) -> dict[Any, list[Event]]:
        """``events`` by key, each key's in arrival order; records an ``order``
        indeterminacy for a key whose arrival order no test fixes, unless ``order_free``
        (a bool, or a predicate on the key's events) says the order does not matter."""
        by_key: dict[Any, list[Event]] = defaultdict(list)
        for e in events:
            by_key[key_fn(e.item)].append(e)
        ordered_input = self.ordered[stage["inputs"][0]]
        for k, evs in by_key.items():
            evs.sort(key=lambda e: e.origin)
            partitions = sorted({e.origin[:2] for e in evs})
            free = order_free(evs) if callable(order_free) else order_free
            if not free and (len(partitions) > 1 or not ordered_input):
                self._indeterminate(stage, evs[0], "order",
                                    f"key {k!r}: items from partitions {partitions}"
                                    + ("" if ordered_input else " after a merge"))
        return by_key

    # --- stages ---------------------------------------------------------------------------

    def _stateless(self, stage: dict, events: list[Event]) -> list[Event]:
        kind, fn = STATELESS[stage["fn"]]
        out = []
        for e in events:
            if kind == "map":
                y = fn(e.item)
                if y is not None:
                    out.append(Event(y, e.ts, e.origin))
            elif kind == "filter":
                if fn(e.item):
                    out.append(e)
            else:
                for j, y in enumerate(fn(e.item) or ()):
                    out.append(Event(y, e.ts, e.origin + (j,)))
        return out

    def _merge(self, stage: dict, a: list[Event], b: list[Event]) -> list[Event]:
        return a + b

    def _window(self, stage: dict, *inputs: list[Event]) -> list[Event]:
        sid = stage["id"]
        w = stage["window"]
        kind = w[0]
        if stage["late_sink"]:
            self.result.late_sinks += (sid,)
        self.result.late.setdefault(sid, [])
        self.result.late_positions.setdefault(sid, [])
        if kind == "session":
            late_fn = late_at_session
        else:
            slide = w[1] if kind == "tumbling" else w[2]
            late_fn = lambda t, wm: late_at_window(t, wm, slide)  # noqa: E731
        on_time: list[list[Event]] = []
        for events in inputs:
            kept = []
            for e in events:
                if self._judge(stage, e, late_fn):
                    self._late(stage, e)
                else:
                    kept.append(e)
            on_time.append(kept)
        key = key_of if stage["keyed"] else (lambda item: None)
        # (start, end, key) -> the items of each input in that window
        windows: dict[tuple, list[list]] = defaultdict(lambda: [[] for _ in inputs])
        if kind == "session":
            gap = w[1]
            by_key: dict[Any, list[Event]] = defaultdict(list)
            for e in on_time[0]:
                by_key[key(e.item)].append(e)
            for k, evs in by_key.items():
                evs.sort(key=_time)
                sessions: list[list[Event]] = []
                for e in evs:  # by time: a session's last event is its latest
                    if sessions and _time(e) < _time(sessions[-1][-1]) + gap:
                        sessions[-1].append(e)
                    else:
                        sessions.append([e])
                for session in sessions:
                    start, end = _time(session[0]), _time(session[-1]) + gap
                    windows[(start, end, k)][0] = [x.item for x in session]
        else:
            size = w[1]
            slide = w[1] if kind == "tumbling" else w[2]
            for i, events in enumerate(on_time):
                for e in events:
                    for s in window_starts(_time(e), size, slide):
                        windows[(s, s + size, key(e.item))][i].append(e.item)
        windows = {w: items for w, items in windows.items() if self.closed(stage, w[1])}
        out = []
        if stage.get("join"):  # a result per pair of a left and a right item
            for (start, end, k), (lefts, rights) in windows.items():
                out += [Event(("KeyedWindowResult", start, end, k, (a, b)), None, ())
                        for a in lefts for b in rights]
            return out
        for (start, end, k), items in windows.items():
            results = tuple(aggregate(op, xs) for op, xs in zip(stage["ops"], items))
            result = results[0] if len(results) == 1 else results
            r = ("KeyedWindowResult", start, end, k, result) if stage["keyed"] else \
                ("WindowResult", start, end, result)
            out.append(Event(r, None, ()))
        return out

    def _rolling(self, stage: dict, events: list[Event]) -> list[Event]:
        op = stage["op"]
        key = key_of if stage["keyed"] else (lambda item: None)
        out = []
        for k, evs in self._in_key_order(stage, events, key, order_free=op == "count").items():
            for n, e in enumerate(evs, 1):
                r = aggregate(op, [x.item for x in evs[:n]])
                out.append(Event((k, r) if stage["keyed"] else r, e.ts, e.origin))
        return out

    def _map_stateful(self, stage: dict, events: list[Event]) -> list[Event]:
        ttl = stage["ttl"]
        sid = stage["id"]
        if ttl is not None:
            self.result.late.setdefault(sid, [])
            self.result.late_positions.setdefault(sid, [])
        out = []
        for k, evs in self._in_key_order(stage, events, key_of).items():
            state: list | None = None
            last = NO_WATERMARK  # with a ttl: the highest timestamp since the state was created
            for e in evs:
                if ttl is not None:
                    lo, hi = self.watermark_range(stage, e)
                    if state is not None:  # did a watermark before e evict the key's state?
                        gone_lo, gone_hi = evicted_by(lo, last, ttl), evicted_by(hi, last, ttl)
                        if gone_lo != gone_hi:
                            self._indeterminate(stage, e, "evicted", f"key {k!r} last at "
                                                f"{last}, ttl {ttl}: kept at watermark {lo}, "
                                                f"evicted at {hi}")
                        if gone_hi:
                            self.result.evicted_before.setdefault(sid, []).append(e.position)
                            if stage["on_evict"]:
                                out.append(Event(evicted_state(state, k), None, e.origin))
                            state = None
                    if self._judge(stage, e, lambda t, wm: late_at_ttl(t, wm, ttl)):
                        self._late(stage, e)
                        continue
                    last = _time(e) if state is None else max(last, _time(e))
                if state is None:
                    state = new_state()
                r = count_and_sum(state, k, e.item)
                if r is not None:
                    out.append(Event(r, e.ts, e.origin))
            if state is not None and ttl is not None and stage["on_evict"] and (
                    self.bounded or evicted_by(self.result.final_watermark[sid], last, ttl)):
                # at the end of the stream; streaming, if the final watermark passed it
                out.append(Event(evicted_state(state, k), None, ()))
        return out

    def _aggregate(self, stage: dict, events: list[Event]) -> list[Event]:
        if not self.bounded:  # a batch aggregation emits at the end of the stream: never
            return []
        op = stage["op"]
        if not stage["keyed"]:
            return [Event(aggregate(op, [e.item for e in events]), None, ())]
        by_key: dict[Any, list] = defaultdict(list)
        for e in events:
            by_key[key_of(e.item)].append(e.item)
        return [Event((k, aggregate(op, xs)), None, ()) for k, xs in by_key.items()]

    def _distinct(self, stage: dict, events: list[Event]) -> list[Event]:
        if not stage["keyed"]:
            first: dict[Any, Event] = {}
            for e in events:
                first.setdefault(e.item, Event(e.item, None, e.origin))
            return list(first.values())
        # the first item of each key; a key whose items are all equal has one first item
        # whatever the order
        by_key = self._in_key_order(stage, events, key_of,
                                    order_free=lambda evs: len({e.item for e in evs}) == 1)
        return [Event(evs[0].item, None, evs[0].origin) for evs in by_key.values()]

    def _hash_join(self, stage: dict, events: list[Event]) -> list[Event]:
        table: dict[Any, list] = defaultdict(list)
        for k, v in self.inputs.get("build", []):
            table[k].append(v)
        out = []
        for e in events:
            matches = table.get(key_of(e.item))
            if matches:
                out += [Event((e.item, v), None, e.origin) for v in matches]
            elif stage["outer"]:
                out.append(Event((e.item, None), None, e.origin))
        return out


    def _on_time(self, stage: dict, events: list[Event]) -> list[Event]:
        """The events a join of two streams does not judge late (the late ones recorded)."""
        kept = []
        for e in events:
            if self._judge(stage, e, late_at_session):  # the same rule: below the watermark
                self._late(stage, e)
            else:
                kept.append(e)
        return kept

    def _interval_join(self, stage: dict, lefts: list[Event], rights: list[Event]
                       ) -> list[Event]:
        sid = stage["id"]
        self.result.late.setdefault(sid, [])
        self.result.late_positions.setdefault(sid, [])
        lefts, rights = self._on_time(stage, lefts), self._on_time(stage, rights)
        lower, upper = stage["lower"], stage["upper"]
        return [Event((a.item, b.item), max(_time(a), _time(b)), ())
                for a in lefts for b in rights
                if key_of(a.item) == key_of(b.item)
                and _time(a) + lower <= _time(b) <= _time(a) + upper]

    def _asof_join(self, stage: dict, lefts: list[Event], rights: list[Event]) -> list[Event]:
        sid = stage["id"]
        self.result.late.setdefault(sid, [])
        self.result.late_positions.setdefault(sid, [])
        lefts, rights = self._on_time(stage, lefts), self._on_time(stage, rights)
        tolerance = stage["tolerance"]
        out = []
        for a in lefts:
            if not self.bounded and _time(a) >= self.result.final_watermark[sid]:
                continue  # still waiting for the watermark to pass it
            candidates = [b for b in rights if key_of(b.item) == key_of(a.item)
                          and _time(b) <= _time(a)
                          and (tolerance is None or _time(b) >= _time(a) - tolerance)]
            if candidates:
                best = max(candidates, key=lambda b: (_time(b), b.origin))
                out.append(Event((a.item, best.item), _time(a), a.origin))
            elif stage["how"] == "left":
                out.append(Event((a.item, None), _time(a), a.origin))
        return out


def _time(e: Event) -> int:
    """The timestamp of an event that has one (every event a window or ttl stage sees)."""
    assert e.ts is not None, f"{e} has no timestamp"
    return e.ts


def _check_inputs(spec: Spec, inputs: Inputs) -> None:
    for s in source_names(spec):
        parts = inputs["partitions"].get(s)
        if not parts:
            raise ValueError(f"source {s!r} has no partitions")
        for p, records in enumerate(parts):
            if not records:
                raise ValueError(f"source {s!r}: partition {p} is empty (idleness is not "
                                 "modelled: every partition has records)")
            for r in records:
                if not isinstance(event_time(r), int):
                    raise ValueError(f"source {s!r}: record {r!r} has no int timestamp")


def run_model(spec: Spec, inputs: Inputs, bounded: bool = True) -> ModelResult:
    """What ``spec`` emits for ``inputs``, which events are late where, and what the input
    leaves undetermined (see the module docstring). ``bounded=False``: what a streaming job
    has emitted once it has read everything (windows and ttl states up to the final
    watermark, no end-of-stream flush; the module docstring, "Streaming")."""
    return _Model(spec, inputs, bounded).run()


def is_determinate(spec: Spec, inputs: Inputs, bounded: bool = True) -> bool:
    """Whether the input fixes every output: no event's fate (late or not, its key's state
    evicted or not) depends on the progress of other partitions, and every order-sensitive
    keyed stage sees each key's items in one partition's order."""
    return not run_model(spec, inputs, bounded).indeterminate


def expected_run(model: ModelResult) -> RunResult:
    """The model's answer in the shape a runtime returns."""
    return RunResult(
        outputs={k: multiset(v) for k, v in model.outputs.items()},
        late_items={k: multiset(model.late.get(k, [])) for k in model.late_sinks},
        late_counts=dict(model.late_counts))
