"""Reading the state of a job's stateful stages: from a committed snapshot and live.

A stateful stage keeps its state per key in one or two vertices (the vertex named after the
stage, and ``<stage>-accumulate`` for a two-stage aggregation). Its state is read in the
form its processors save it in snapshots (``(key, value)`` entries, decoded with each
processor's own codec: :class:`MapStatefulEntries`, :class:`WindowEntries`,
:class:`RollingEntries`, :class:`TableEntries`, :class:`DistinctEntries`), whether the entries
come from a committed snapshot (:func:`snapshot_entries`, RocksDB checkpoint files included)
or from the live processors (:func:`live_entries`, on each processor's own thread). One
decoder per kind of stage (:func:`decode_stage`) turns the entries into ``key -> value``:

==================  ==========================================================================
stage kind          value of a key
==================  ==========================================================================
map-stateful        the key's state object
rolling-aggregate   the operation's current result (``export`` of the key's accumulator)
aggregate           the operation's result so far (``export`` of the key's accumulator)
window-aggregate    the key's open windows, ``{(start, end): result so far}``
join-table          the table's value of the key
distinct            ``True`` (the key was seen)
==================  ==========================================================================

``job.state()`` (engine/jobs/state_view.py) and ``jetwake snapshot inspect`` both read with
these functions.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from jetwake.engine.core.errors import JetwakeError, RestartableError
from jetwake.engine.core.processor import BroadcastKey
from jetwake.engine.operations.aggregate import AggregateOperation
from jetwake.engine.processors.aggregation import (
    NO_ACC, AccumulateProcessor, AggregateProcessor, CombineProcessor,
)
from jetwake.engine.processors.distinct import DistinctEntries, DistinctProcessor
from jetwake.engine.processors.event_time_base import MISSING
from jetwake.engine.processors.map_stateful import (
    IN_FILES, MapStatefulEntries, MapStatefulProcessor,
)
from jetwake.engine.processors.rolling_aggregate import RollingAggregateProcessor
from jetwake.engine.processors.session_window import SessionWindowProcessor
from jetwake.engine.processors.sliding_window import (
    FrameAccumulateProcessor, FrameWindows, SlidingWindowProcessor, WindowCombineProcessor,
    composite_operation, frame_items,
)
from jetwake.engine.processors.table_join import TableEntries, TableJoinProcessor
from jetwake.engine.processors.window_entries import WindowEntries
from jetwake.engine.core.partitioning import PARTITION_COUNT
from jetwake.engine.core.serialization import dumps, loads
from jetwake.snapshot.state.rocksdb_files import read_checkpoint_entries
from jetwake.snapshot.store.snapshot_files import SnapshotFiles

__all__ = [
    "STATEFUL_KINDS", "StatefulStage", "SavedEntry", "StateQueryError", "StateUnavailableError",
    "stateful_stages", "find_stage", "snapshot_entries", "decode_stage", "live_entries",
    "key_type_problem", "filter_items", "value_bytes", "read_local_state", "LIVE_READ_TIMEOUT_S",
    "live_entries_bytes", "entries_of", "count_local_state", "live_count", "key_from_text", "stage_summaries", "json_ready",
]

LIVE_READ_TIMEOUT_S = 10.0
"""How long a live read waits for a processor to serve it between two of its steps."""

STATEFUL_KINDS = {
    "map-stateful": "map_stateful",
    "rolling-aggregate": "rolling_aggregate",
    "aggregate": "a keyed or keyless aggregate",
    "window-aggregate": "a window aggregation",
    "join-table": "join_table",
    "distinct": "distinct",
}
"""The kinds of stage (``Transform.kind``) that keep state a reader can read, and what the
user calls them."""


class StateQueryError(JetwakeError, ValueError):
    """A read of a job's state that cannot be answered as asked: an unknown stage, a stage
    without state, a key of the wrong type, no committed snapshot yet. The message names the
    fix."""


class StateUnavailableError(RestartableError):
    """The state cannot be read right now (a member that holds it is lost, the job is
    restarting): the same read may succeed when tried again."""


class SavedEntry(NamedTuple):
    """One saved entry of a stage: the vertex that saved it, its key and value, and
    ``state_name`` when it was read out of a RocksDB checkpoint's files of the processor's
    keyed state of that name (the value is then the raw per-key value), else None."""
    vertex: str
    key: Any
    value: Any
    state_name: str | None = None


@dataclass
class StatefulStage:
    """A stage whose state can be read: its name and kind, the vertices holding its state
    (``vertices[0]`` the one named after the stage) and what decoding needs."""
    name: str
    kind: str
    vertices: list[str]
    keyed: bool
    op: AggregateOperation | None = None
    window: Any = None          # the WindowDefinition of a window aggregation
    two_stage: bool = False     # frames accumulated in ``<name>-accumulate`` first
    ops: list[AggregateOperation] = field(default_factory=list)
    broadcast: bool = False     # a broadcast table: every processor holds all of it

    @property
    def description(self) -> str:
        return STATEFUL_KINDS[self.kind]


def stateful_stages(definition: Any) -> dict[str, StatefulStage] | None:
    """The stages of a job's definition that keep state, by name; None when the job was
    submitted as a DAG (it has no stages, only vertices)."""
    transforms = getattr(definition, "transforms", None)
    if transforms is None:
        return None
    out: dict[str, StatefulStage] = {}
    for t in transforms:
        kind = getattr(t, "kind", "")
        if kind not in STATEFUL_KINDS:
            continue
        name = t.name
        if kind == "window-aggregate":
            ops = list(t.ops)
            two = bool(t.two_stage)
            op = ops[0] if len(ops) == 1 else composite_operation(ops)
            out[name] = StatefulStage(
                name, kind, [name, f"{name}-accumulate"] if two else [name],
                t.key_fns is not None, op, t.wdef, two, ops)
        elif kind == "aggregate":
            op = t.op
            vertices = [name, f"{name}-accumulate"] if op.can_combine else [name]
            out[name] = StatefulStage(name, kind, vertices, t.key_fn is not None, op)
        elif kind == "join-table":
            out[name] = StatefulStage(name, kind, [name], True, broadcast=bool(t.broadcast))
        else:
            out[name] = StatefulStage(name, kind, [name], getattr(t, "key_fn", None) is not None,
                                      getattr(t, "op", None))
    return out


def find_stage(definition: Any, job_name: str, stage: str) -> StatefulStage:
    """The stateful stage ``stage`` of the job; StateQueryError naming the stages that have
    state when there is no such stage, or it keeps none."""
    stages = stateful_stages(definition)
    if stages is None:
        raise StateQueryError(f"job {job_name!r} was submitted as a DAG: its state can be "
                              "read only for a job submitted as a Pipeline")
    found = stages.get(stage)
    if found is not None:
        return found
    have = ", ".join(f"{s.name!r} ({s.description})" for s in stages.values()) or "none"
    names = {t.name: t.kind for t in getattr(definition, "transforms", ())}
    if stage in names:
        raise StateQueryError(f"stage {stage!r} of job {job_name!r} keeps no state (it is "
                              f"a {names[stage]} stage); the stages with state are: {have}")
    raise StateQueryError(f"job {job_name!r} has no stage {stage!r}; the stages with state "
                          f"are: {have} (name a stage with .set_name(...))")


# --- where the entries come from -------------------------------------------------------------

def snapshot_entries(reader: Any, vertices: Iterable[str]) -> Iterator[SavedEntry]:
    """Every saved entry of ``vertices`` in a committed snapshot (a SnapshotReader), the
    entries of RocksDB checkpoint files read out of them, key by key."""
    for vertex in vertices:
        for keys, values in reader.chunks(vertex):
            for k, v in zip(keys, values):
                if type(v) is SnapshotFiles and type(k) is BroadcastKey \
                        and isinstance(k.key, (tuple, list)) and len(k.key) == 3:
                    name = k.key[2]
                    for fk, fv in read_checkpoint_entries([v], range(PARTITION_COUNT)):
                        yield SavedEntry(vertex, fk, fv, name)
                    continue
                yield SavedEntry(vertex, k, v)


def live_entries(processor: Any, vertex: str, keys: list[Any] | None,
                 index: int = 0) -> list[SavedEntry]:
    """The entries a live processor holds for ``keys`` (all when None), in the form it saves
    them, copied: call it on the processor's own thread (between its calls), so no entry is
    read half-changed and none changes afterwards. ``index`` is the processor's global index
    (a broadcast table is read from processor 0 alone)."""
    return entries_of(live_entries_bytes(processor, vertex, keys, index))


def _live(processor: Any, vertex: str, keys: list[Any] | None,
          index: int = 0) -> list[SavedEntry]:
    """The entries of :func:`live_entries`, not copied."""
    p = processor
    out: list[SavedEntry] = []
    want: Callable[[Any], bool] = (lambda k: True) if keys is None else _member_of(keys)
    if isinstance(p, MapStatefulProcessor):
        states, last = p.keyed.states, p.keyed.last_ts
        for k, s in _pairs(states, keys):
            out.append(SavedEntry(vertex, *MapStatefulEntries.state(k, s, last.get(k))))
    elif isinstance(p, RollingAggregateProcessor):
        out.extend(SavedEntry(vertex, k, a) for k, a in _pairs(p.accs, keys))
    elif isinstance(p, TableJoinProcessor):
        if p.broadcast and index != 0:
            return out
        out.extend(SavedEntry(vertex, *TableEntries.entry(k, v, False))
                   for k, v in _pairs(p.table, keys))
    elif isinstance(p, DistinctProcessor):
        out.extend(SavedEntry(vertex, *DistinctEntries.seen(k)) for k in p.seen if want(k))
    elif isinstance(p, WindowCombineProcessor):
        w = p.windows
        if w.next_end is not None:
            out.append(SavedEntry(vertex, *WindowEntries.next_end(w.next_end)))
        for f, t in w.frames.items():
            out.extend(SavedEntry(vertex, *WindowEntries.frame(k, f, a)) for k, a in t.items()
                       if want(k))
    elif isinstance(p, FrameAccumulateProcessor):
        for f, tables in p.frames.items():
            for i, t in enumerate(tables):
                out.extend(SavedEntry(vertex, *WindowEntries.frame_partial(k, f, i, a))
                           for k, a in t.items() if want(k))
    elif isinstance(p, SlidingWindowProcessor):
        for e, t in p.windows.items():
            out.extend(SavedEntry(vertex, *WindowEntries.window(k, e, a)) for k, a in t.items()
                       if want(k))
    elif isinstance(p, SessionWindowProcessor):
        out.extend(SavedEntry(vertex, *WindowEntries.sessions(k, ss))
                   for k, ss in p.sessions.items() if want(k))
    elif isinstance(p, (AggregateProcessor, AccumulateProcessor, CombineProcessor)):
        if p.keyed:
            out.extend(SavedEntry(vertex, k, a) for k, a in p.table.items() if want(k))
        elif p.acc is not NO_ACC:
            out.append(SavedEntry(vertex, ("keyless-acc", vertex, index), p.acc))
    return out


def live_entries_bytes(processor: Any, vertex: str, keys: list[Any] | None,
                       index: int = 0) -> bytes:
    """:func:`live_entries` serialized: the copy a live read takes on the processor's own
    thread (every state value serializes, as a snapshot needs); :func:`entries_of` reads it
    back on the reader's thread, so the processor pauses only for the serialization."""
    entries = _live(processor, vertex, keys, index)
    # in columns, as a snapshot's frames: one list of keys, one of values (several times
    # faster to serialize than a list of pairs)
    return dumps([vertex, [e.key for e in entries], [e.value for e in entries]])


def entries_of(data: bytes) -> list[SavedEntry]:
    """The entries :func:`live_entries_bytes` serialized."""
    vertex, keys, values = loads(data)
    return [SavedEntry(vertex, k, v) for k, v in zip(keys, values)]


def read_local_state(tasklets: Iterable[Any], vertices: Iterable[str], keys: list[Any] | None,
                     timeout: float = LIVE_READ_TIMEOUT_S) -> list[bytes]:
    """The live entries this member's processors (``tasklets``) of ``vertices`` hold for
    ``keys`` (all when None), serialized per processor (:func:`live_entries_bytes`; read them
    with :func:`entries_of`), each taken on its processor's own thread
    (``ProcessorTasklet.on_processor_thread``): the processors are asked at once and each
    answers between two of its steps. StateUnavailableError when one does not answer in
    ``timeout`` seconds (it is stuck, or its execution is ending)."""
    wanted = set(vertices)
    futures = []
    for t in tasklets:
        ctx = t.context
        if ctx.vertex_name in wanted:
            vertex, index = ctx.vertex_name, ctx.global_processor_index
            futures.append((t, t.on_processor_thread(
                lambda p, v=vertex, i=index: live_entries_bytes(p, v, keys, i))))
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    for t, f in futures:
        out.append(_served(t, f, deadline, timeout))
    return out


def _served(tasklet: Any, future: Any, deadline: float, timeout: float) -> Any:
    """A processor's answer to a live read; StateUnavailableError when it gave none in time,
    or its state was released as its execution ended."""
    try:
        return future.result(max(0.0, deadline - time.monotonic()))
    except FutureTimeout:
        raise StateUnavailableError(f"processor {tasklet.name} did not serve a state read in "
                                    f"{timeout:g} s (its execution may be ending); try "
                                    "again") from None
    except Exception as e:
        if not tasklet.is_closed:
            raise
        raise StateUnavailableError(f"processor {tasklet.name} ended before the state read "
                                    f"({type(e).__name__}: {e}); try again") from e


def live_count(processor: Any, index: int = 0) -> int:
    """How many keys a live processor of a stage whose keys each live on one processor holds
    (``map_stateful``, ``rolling_aggregate``, ``join_table``, ``distinct``, a one-stage
    ``aggregate``): a count without a copy. Call it on the processor's own thread."""
    p = processor
    if isinstance(p, MapStatefulProcessor):
        return len(p.keyed.states)
    if isinstance(p, RollingAggregateProcessor):
        return len(p.accs)
    if isinstance(p, TableJoinProcessor):
        return 0 if p.broadcast and index != 0 else len(p.table)
    if isinstance(p, DistinctProcessor):
        return len(p.seen)
    if isinstance(p, (AggregateProcessor, AccumulateProcessor, CombineProcessor)):
        return len(p.table) if p.keyed else int(p.acc is not NO_ACC)
    raise TypeError(f"{type(p).__name__} is counted from its decoded entries")


def count_local_state(tasklets: Iterable[Any], vertices: Iterable[str],
                      timeout: float = LIVE_READ_TIMEOUT_S) -> int:
    """The keys this member's processors of ``vertices`` hold, summed (:func:`live_count`,
    each on its processor's own thread)."""
    wanted = set(vertices)
    futures = [(t, t.on_processor_thread(
        lambda p, i=t.context.global_processor_index: live_count(p, i)))
        for t in tasklets if t.context.vertex_name in wanted]
    n = 0
    deadline = time.monotonic() + timeout
    for t, f in futures:
        n += _served(t, f, deadline, timeout)
    return n


def _member_of(keys: list[Any]) -> Callable[[Any], bool]:
    try:
        wanted = set(keys)
        return wanted.__contains__
    except TypeError:  # unhashable keys: compare one by one
        return lambda k: k in keys


def _pairs(state: Any, keys: list[Any] | None) -> Iterator[tuple[Any, Any]]:
    """``(key, value)`` of ``keys`` found in ``state`` (a dict or a keyed state store), or
    every entry when ``keys`` is None."""
    if keys is None:
        yield from list(state.items())
        return
    for k in keys:
        try:
            v = state.get(k, MISSING)
        except TypeError:  # an unhashable key is in no dict
            continue
        if v is not MISSING:
            yield k, v


# --- decoding --------------------------------------------------------------------------------

def decode_stage(stage: StatefulStage, entries: Iterable[SavedEntry]) -> dict[Any, Any]:
    """``key -> value`` of a stage from its saved (or live) entries: see the module doc for
    each kind's value. Keyless stages have the one key None."""
    return _DECODERS[stage.kind](stage, entries)


def _decode_map_stateful(stage: StatefulStage, entries: Iterable[SavedEntry]) -> dict:
    out: dict = {}
    for e in entries:
        if e.state_name is not None:
            out[e.key] = e.value
        elif type(e.key) is not BroadcastKey:
            state, _last = MapStatefulEntries.read(e.value)
            if state is not IN_FILES:
                out[e.key] = state
    return out


def _accumulators(stage: StatefulStage, entries: Iterable[SavedEntry]) -> dict:
    """Each key's accumulator, the saved accumulators of one key combined (a rolling
    aggregate's restore does the same)."""
    combine = stage.op.combine if stage.op is not None else None
    accs: dict = {}
    for e in entries:
        if type(e.key) is BroadcastKey:
            continue  # a watermark, a completion marker
        k = e.key
        if not stage.keyed and e.state_name is None and stage.kind == "aggregate":
            k = None  # the keyless accumulator of one processor
        old = accs.get(k, MISSING)
        accs[k] = e.value if old is MISSING or combine is None else combine(old, e.value)
    return accs


def _decode_exported(stage: StatefulStage, entries: Iterable[SavedEntry]) -> dict:
    op = stage.op
    assert op is not None
    return {k: op.export(a) for k, a in _accumulators(stage, entries).items()}


def _decode_table(stage: StatefulStage, entries: Iterable[SavedEntry]) -> dict:
    return {TableEntries.key(e.key) if e.state_name is None else e.key: e.value
            for e in entries}


def _decode_distinct(stage: StatefulStage, entries: Iterable[SavedEntry]) -> dict:
    return {e.key: True for e in entries if type(e.key) is not BroadcastKey}


def _decode_windows(stage: StatefulStage, entries: Iterable[SavedEntry]) -> dict:
    op, wdef = stage.op, stage.window
    assert op is not None
    out: dict = {}
    if wdef.is_session:
        for e in entries:
            if type(e.key) is not BroadcastKey:
                ss = out.setdefault(e.key, {})
                for start, end, acc in WindowEntries.read_sessions(e.value):
                    ss[(start, end)] = op.export(acc)
        return out
    if not stage.two_stage:  # one stage: a key's accumulator per window end
        size = wdef.size
        for e in entries:
            if type(e.key) is not BroadcastKey:
                end, acc = e.value
                out.setdefault(e.key, {})[(end - size, end)] = op.export(acc)
        return _sorted_windows(out)
    # two stages: the combined frames and the partial frames not yet sent, made into the
    # open windows by the combining processor's own rule (FrameWindows.early_results)
    windows = FrameWindows(op, wdef.size, wdef.slide, True)
    partial: dict[int, list[dict]] = {}
    partials: list[tuple] = []
    next_end = None
    for e in entries:
        if type(e.key) is BroadcastKey:
            if e.key.key == WindowEntries.NEXT_END:
                next_end = e.value if next_end is None else min(next_end, e.value)
            continue
        if len(e.value) == 3:  # (frame, input index, acc) of the accumulating processor
            f, i, acc = e.value
            tables = partial.setdefault(f, [{} for _ in stage.ops])
            old = tables[i].get(e.key, MISSING)
            combine = stage.ops[i].combine
            tables[i][e.key] = acc if old is MISSING or combine is None else combine(old, acc)
        else:
            f, acc = e.value
            partials.append((e.key, f, acc))
    for f, tables in partial.items():
        partials.extend(frame_items(f, tables, stage.ops))
    windows.restore(partials, next_end)
    for results in windows.early_results():
        for r in results:
            out.setdefault(r.key if stage.keyed else None, {})[(r.start, r.end)] = r.result
    return out


def _sorted_windows(out: dict) -> dict:
    return {k: dict(sorted(w.items())) for k, w in out.items()}


_DECODERS: dict[str, Callable[[StatefulStage, Iterable[SavedEntry]], dict]] = {
    "map-stateful": _decode_map_stateful,
    "rolling-aggregate": _decode_exported,
    "aggregate": _decode_exported,
    "window-aggregate": _decode_windows,
    "join-table": _decode_table,
    "distinct": _decode_distinct,
}


# --- what readers share ----------------------------------------------------------------------

def key_type_problem(stage: str, key: Any, key_types: Iterable[type]) -> str | None:
    """Why ``key`` cannot be a key of ``stage``, whose stored keys have ``key_types``; None
    when it may be one (no keys stored, or one of them has its type)."""
    types = set(key_types)
    if not types or type(key) in types:
        return None
    if isinstance(key, bool) or not any(isinstance(key, t) for t in types):
        names = " or ".join(sorted(t.__name__ for t in types))
        tn = type(key).__name__
        article = "an" if tn[:1] in "aeiou" else "a"
        return (f"stage {stage!r} has keys of type {names}; the key {key!r} is {article} {tn}: "
                f"give a key of type {names} (on the command line a key is JSON when it "
                "parses: 42 is an int, '\"42\"' a str)")
    return None


def filter_items(items: Iterable[tuple[Any, Any]], prefix: Any = None,
                 limit: int | None = None) -> Iterator[tuple[Any, Any]]:
    """``items`` whose key starts with ``prefix`` (a str or bytes key by its text, a tuple key
    by its leading elements: ``prefix`` is then a tuple of them, or one value for the first
    element), at most ``limit`` of them."""
    if limit is not None and limit < 0:
        raise StateQueryError(f"limit must be None or >= 0, got {limit!r}")
    n = 0
    for k, v in items:
        if limit is not None and n >= limit:
            return
        if prefix is not None and not _starts_with(k, prefix):
            continue
        n += 1
        yield k, v


def _starts_with(key: Any, prefix: Any) -> bool:
    if isinstance(key, str):
        return isinstance(prefix, str) and key.startswith(prefix)
    if isinstance(key, bytes):
        return isinstance(prefix, bytes) and key.startswith(prefix)
    if isinstance(key, tuple):
        lead = prefix if isinstance(prefix, tuple) else (prefix,)
        return key[:len(lead)] == lead
    return False


def value_bytes(value: Any) -> int:
    """The serialized size of a value (the dashboard's and inspection's sizes)."""
    try:
        return len(dumps(value))
    except Exception:  # noqa: BLE001 - a value the serializer refuses still has a place
        return 0


def key_from_text(text: str) -> Any:
    """A key typed by a user (``jetwake state``, the dashboard's lookup): its JSON value when
    it parses as JSON, a JSON array taken as a tuple (the form of composite keys), so ``42``
    is the int 42 and ``"42"`` the str "42"; anything else is the text as a str."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return _tuples(value)


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def stage_summaries(definition: Any, record: Any,
                    keys: Callable[[StatefulStage], tuple[int, int]] | None) -> list[dict]:
    """Each stateful stage of a job with its kind and, in the committed snapshot ``record``
    (None: none yet), the bytes its vertices' entries take (RocksDB checkpoint files not
    counted) and its key count: ``keys(stage)`` gives ``(snapshot id, key count)``, the id of
    the snapshot that was counted."""
    stages = stateful_stages(definition) or {}
    out = []
    for st in stages.values():
        row: dict[str, Any] = {"stage": st.name, "kind": st.kind,
                               "description": st.description, "keys": None, "bytes": None,
                               "snapshot_id": None}
        if record is not None:
            row["snapshot_id"] = record.snapshot_id
            row["bytes"] = sum(f[2] for v in st.vertices
                               for f in record.files.get(v, {}).values())
            if keys is not None:
                try:
                    row["keys_snapshot_id"], row["keys"] = keys(st)
                except Exception:  # noqa: BLE001 - the snapshot went meanwhile: no count
                    row["keys"] = None
        out.append(row)
    return out


def json_ready(value: Any) -> Any:
    """A key or value as JSON can show it: tuples as arrays, dict keys that are not str (a
    window's ``(start, end)``) as their JSON text, anything else JSON lacks as its repr."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(json_ready(k)): json_ready(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)
