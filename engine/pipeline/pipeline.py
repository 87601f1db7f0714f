"""The Pipeline API: stages that read, transform and write, compiled to a DAG at submission.

    p = Pipeline()
    (p.read_from(Sources.items(lines))
      .flat_map(str.split)
      .group_by(lambda w: w)
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.map("counts")))

Every method checks its arguments when called, so a wrong argument fails where it was written,
not later inside a running job.
"""

from __future__ import annotations

from typing import Any, Callable, Self, TypeVar

from jetwake.engine.core.dag import DAG
from jetwake.engine.core.errors import PipelineError
from jetwake.engine.operations.aggregate import AggregateOperation
from jetwake.engine.pipeline.connector import Sink, Source, native_pair_timestamp
from jetwake.engine.pipeline.planner import Planner
from jetwake.engine.pipeline.transforms import (
    AggregateTransform, CustomTransform, DistinctTransform, HashJoinTransform,
    MapStatefulTransform, MergeTransform, RebalanceTransform, RollingAggregateTransform,
    JoinTableTransform, MapUsingMapTransform,
    SideSinkTransform, SinkTransform, SortTransform, SourceTransform, StatelessTransform,
    TimestampTransform, Transform, WindowAggregateTransform,
)
from jetwake.engine.pipeline.transforms import AsofJoinTransform, IntervalJoinTransform

__all__ = ["Pipeline", "Stage", "GroupedStage", "SinkStage", "PipelineError", "WindowedStage",
           "WindowedGroupedStage"]

T = TypeVar("T", bound=Transform)


def check_fn(fn: Any, where: str) -> None:
    if not callable(fn):
        raise TypeError(f"{where} expects a callable, got {type(fn).__qualname__}: {fn!r}")


def check_ms(value: Any, what: str, where: str, *, minimum: int | None = 0,
             meaning: str = "ms", allow_none: bool = False,
             floats: bool = False) -> None:
    """Checks a duration or offset argument given in milliseconds: an int (a float too when
    ``floats``), never a bool (``True`` is an int to Python, but never what the user meant),
    None only when ``allow_none``; at least ``minimum`` when one is given. A value of the
    wrong type raises TypeError, one out of range PipelineError; both name the stage and
    what the number means."""
    if value is None and allow_none:
        return
    kinds = (int, float) if floats else (int,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        none = " or None" if allow_none else ""
        raise TypeError(f"{where}: {what} must be an int ({meaning}){none}, got "
                        f"{type(value).__qualname__}: {value!r}")
    if minimum is not None and value < minimum:
        bound = "positive" if minimum == 1 else f"{minimum} or more"
        raise PipelineError(f"{where}: {what} must be {bound} ({meaning}), got {value!r}")


def check_migrate(migrate: Any, where: str) -> None:
    """Checks a stage's ``migrate`` function: when a job starts from a snapshot another job
    wrote (``JobConfig(initial_snapshot_name=...)``, a backfill's hand-off), each restored
    state goes through ``migrate(old)`` and its result is the key's state from then on (a
    None result drops the key). It must also accept a state already in the new shape (a
    backfill's hand-off is written by the new pipeline) and return it as it is."""
    if migrate is not None and not callable(migrate):
        raise TypeError(f"{where} migrate expects a callable (old state -> new state), got "
                        f"{type(migrate).__qualname__}: {migrate!r}")


class Pipeline:
    """A graph of stages; submit it with ``Member.new_job``."""

    def __init__(self) -> None:
        self.transforms: list[Transform] = []
        self._names: set[str] = set()

    def read_from(self, source: Source) -> "Stage":
        """Starts a branch reading from ``source`` (see ``jetwake.Sources``)."""
        if not isinstance(source, Source):
            raise TypeError(f"read_from() expects a Source (from jetwake.Sources), "
                            f"got {type(source).__qualname__}")
        t = self._add(SourceTransform(source), source.name)
        return Stage(self, t, is_stream=source.is_stream, timestamp_fn=None,
                     native_timestamp_fn=source.timestamp_fn)

    @property
    def is_stream(self) -> bool:
        """Whether any source is unbounded (the job then runs until cancelled)."""
        return any(isinstance(t, SourceTransform) and t.source.is_stream
                   for t in self.transforms)

    def sinks(self) -> list[SinkTransform]:
        return [t for t in self.transforms if isinstance(t, SinkTransform)]

    def to_dag(self, default_parallelism: int = 2) -> DAG:
        """Compiles the pipeline to a DAG: each stage plans itself (see ``planner.py``)."""
        if not self.transforms:
            raise PipelineError("the pipeline is empty: start it with read_from(source)")
        if not self.sinks():
            raise PipelineError("the pipeline has no sink: end it with write_to(sink)")
        return Planner(self.transforms, default_parallelism).build()

    def _add(self, t: T, base_name: str) -> T:
        name = base_name
        n = 2
        while name in self._names:
            name = f"{base_name}-{n}"
            n += 1
        t.name = name
        self._names.add(name)
        self.transforms.append(t)
        return t

    def _rename(self, t: Transform, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a stage name must be a non-empty string, got {name!r}")
        if name != t.name and name in self._names:
            raise PipelineError(f"stage name {name!r} is already used in this pipeline; "
                                "stage names must be unique")
        self._names.discard(t.name)
        t.name = name
        self._names.add(name)

    def __repr__(self) -> str:
        return "Pipeline(" + ", ".join(t.name for t in self.transforms) + ")"


class _StageBase:
    def __init__(self, pipeline: Pipeline, transform: Transform) -> None:
        self.pipeline = pipeline
        self.transform = transform

    @property
    def name(self) -> str:
        return self.transform.name

    def set_name(self, name: str) -> Self:
        """Names the stage (its vertices and its saved state are found by this name)."""
        self.pipeline._rename(self.transform, name)
        return self

    def set_local_parallelism(self, n: int) -> Self:
        """Processors per member for this stage; -1 for the job's default."""
        if not isinstance(n, int) or isinstance(n, bool) or (n < 1 and n != -1):
            raise ValueError(f"stage {self.name!r}: local parallelism must be a positive int "
                             f"or -1, got {n!r}")
        self.transform.local_parallelism = n
        self.transform.explicit_parallelism = n != -1
        return self


class Stage(_StageBase):
    """A stream of items: a batch (bounded) or a stream (unbounded) stage."""

    def __init__(self, pipeline: Pipeline, transform: Transform, *, is_stream: bool,
                 timestamp_fn: Callable[[Any], int] | None,
                 native_timestamp_fn: Callable[[Any], int] | None = None) -> None:
        super().__init__(pipeline, transform)
        self.is_stream = is_stream
        self.timestamp_fn = timestamp_fn
        self.native_timestamp_fn = native_timestamp_fn

    def _next(self, t: Transform, base_name: str, *, keeps_timestamps: bool = True) -> "Stage":
        self.pipeline._add(t, base_name)
        return Stage(self.pipeline, t, is_stream=self.is_stream,
                     timestamp_fn=self.timestamp_fn if keeps_timestamps else None,
                     native_timestamp_fn=self.native_timestamp_fn)

    # --- stateless ------------------------------------------------------------------------

    def map(self, fn: Callable[[Any], Any]) -> "Stage":
        """``fn(item)`` for each item; a None result drops the item."""
        check_fn(fn, "map()")
        return self._next(StatelessTransform(self.transform, "map", fn), "map")

    def filter(self, fn: Callable[[Any], bool]) -> "Stage":
        """Keeps the items for which ``fn(item)`` is true."""
        check_fn(fn, "filter()")
        return self._next(StatelessTransform(self.transform, "filter", fn), "filter")

    def flat_map(self, fn: Callable[[Any], Any]) -> "Stage":
        """Every item of the iterable ``fn(item)`` returns (None means none)."""
        check_fn(fn, "flat_map()")
        return self._next(StatelessTransform(self.transform, "flat_map", fn), "flat-map")


    # --- event time -----------------------------------------------------------------------

    @property
    def has_timestamps(self) -> bool:
        """Whether the items of this stage carry event timestamps (windows need them)."""
        return self.timestamp_fn is not None

    def with_timestamps(self, timestamp_fn: Callable[[Any], int], allowed_lag: int, *,
                        policy: Any = "limiting_lag", idle_timeout: int = 60_000,
                        bad_events_to: Sink | None = None) -> "Stage":
        """Gives each item the event timestamp ``timestamp_fn(item)`` (an int, milliseconds
        by convention) and starts watermarks that allow events to be ``allowed_lag`` behind
        the newest one.

        ``policy``: "limiting_lag" (watermark = highest timestamp - lag, the default),
        "limiting_real_time_lag" (wall clock - lag) or a ``WatermarkPolicy`` factory.
        ``idle_timeout``: ms of wall-clock time without items after which a processor's input
        counts as idle, so that it does not hold the watermark back (0: never).
        ``bad_events_to``: a sink for the items whose timestamp cannot be read (otherwise
        such an item fails the job).
        """
        check_fn(timestamp_fn, f"with_timestamps() after stage {self.name!r}")
        return self._timestamps(timestamp_fn, allowed_lag, policy, idle_timeout,
                                bad_events_to, "with_timestamps()")

    def with_native_timestamps(self, allowed_lag: int, *, policy: Any = "limiting_lag",
                               idle_timeout: int = 60_000) -> "Stage":
        """Uses the timestamps the source gives its items (see ``with_timestamps``)."""
        if self.native_timestamp_fn is None or not isinstance(self.transform,
                                                              SourceTransform):
            raise PipelineError(
                f"with_native_timestamps() after stage {self.name!r}: the stage has no native "
                "timestamps (only a source that assigns times to its items has them, called "
                "directly on the source stage); use with_timestamps(timestamp_fn, "
                "allowed_lag) instead")
        fn = self.native_timestamp_fn
        native_pairs = fn is native_pair_timestamp
        return self._timestamps(None if native_pairs else fn, allowed_lag, policy,
                                idle_timeout, None, "with_native_timestamps()",
                                native=native_pairs,
                                upstream_watermarks=self.transform.source.emits_watermarks)

    def _timestamps(self, fn: Any, allowed_lag: int, policy: Any, idle_timeout: int,
                    bad_sink: Any, where: str, native: bool = False,
                    upstream_watermarks: bool = False) -> "Stage":
        from jetwake.engine.operations.watermark_policy import WatermarkPolicy
        where = f"{where} after stage {self.name!r}"
        try:
            if policy == "limiting_lag":
                factory = WatermarkPolicy.limiting_lag(allowed_lag)
            elif policy == "limiting_real_time_lag":
                factory = WatermarkPolicy.limiting_real_time_lag(allowed_lag)
            elif callable(policy) and not isinstance(policy, str):
                factory = policy
            else:
                raise PipelineError(
                    f"unknown watermark policy {policy!r}: use 'limiting_lag', "
                    "'limiting_real_time_lag' or a WatermarkPolicy factory")
        except (TypeError, ValueError) as e:
            raise type(e)(f"{where}: {e}") from None
        check_ms(idle_timeout, "idle_timeout", where,
                 meaning="ms of wall-clock time without items; 0 for never idle")
        if bad_sink is not None and not isinstance(bad_sink, Sink):
            raise TypeError(f"{where}: bad_events_to expects a Sink, got "
                            f"{type(bad_sink).__qualname__}")
        t = TimestampTransform(self.transform, fn, factory, idle_timeout, native,
                               upstream_watermarks)
        self.pipeline._add(t, "timestamps")
        if bad_sink is not None:
            t.side_sink = bad_sink
            self.pipeline._add(SideSinkTransform(t, bad_sink), bad_sink.name)
        return Stage(self.pipeline, t, is_stream=self.is_stream,
                     timestamp_fn=fn or _pair_timestamp, native_timestamp_fn=None)

    def window(self, wdef: Any) -> "WindowedStage":
        """Windows over event time (``WindowDefinition.tumbling/sliding/session``): follow
        with ``group_by(key_fn).aggregate(op)`` or a keyless ``aggregate(op)``."""
        _check_window(self, wdef)
        return WindowedStage(self, wdef)

    def rolling_aggregate(self, op: AggregateOperation, *,
                          migrate: Callable[[Any], Any] | None = None) -> "Stage":
        """The running result of ``op`` over every item so far, emitted for each item.
        ``migrate(old_accumulator)``: see :func:`check_migrate`."""
        _check_op(op, "rolling_aggregate()")
        check_migrate(migrate, "rolling_aggregate()")
        return self._next(RollingAggregateTransform(self.transform, op, None, migrate),
                          "rolling-aggregate")

    def map_stateful(self, create_fn: Callable[[], Any],
                     map_fn: Callable[[Any, Any], Any], *,
                     migrate: Callable[[Any], Any] | None = None) -> "Stage":
        """``map_fn(state, item)`` with one state object (``create_fn()``) for the whole
        stream, on one processor; a None result emits nothing. ``migrate(old_state)``: see
        :func:`check_migrate`."""
        check_fn(create_fn, "map_stateful() create_fn")
        check_fn(map_fn, "map_stateful() map_fn")
        check_migrate(migrate, "map_stateful()")
        return self._next(MapStatefulTransform(self.transform, create_fn, map_fn, None, None,
                                                None, migrate), "map-stateful")

    # --- keyed and aggregating -------------------------------------------------------------

    def group_by(self, key_fn: Callable[[Any], Any]) -> "GroupedStage":
        """Groups items by ``key_fn(item)`` for a keyed aggregation or a stateful stage."""
        check_fn(key_fn, "group_by()")
        return GroupedStage(self, key_fn)

    def aggregate(self, op: AggregateOperation) -> "Stage":
        """Aggregates every item into one result (a batch stage emits it at the end)."""
        _check_op(op, "aggregate()")
        return self._next(AggregateTransform(self.transform, op, None), "aggregate",
                          keeps_timestamps=False)

    def distinct(self) -> "Stage":
        """Each distinct item once (the first seen)."""
        return self._next(DistinctTransform(self.transform, None), "distinct",
                          keeps_timestamps=False)

    def sort(self, key: Callable[[Any], Any] | None = None, reverse: bool = False) -> "Stage":
        """Every item in order (batch only): ``key`` and ``reverse`` as in ``sorted``."""
        if key is not None:
            check_fn(key, "sort()")
        if self.is_stream:
            raise PipelineError(f"sort() after stage {self.name!r}: an unbounded stream "
                                "cannot be sorted; sort inside windows instead")
        return self._next(SortTransform(self.transform, key, bool(reverse)), "sort")

    def rebalance(self, key_fn: Callable[[Any], Any] | None = None) -> "Stage":
        """Spreads items over every processor of the next stage, across the cluster; by
        ``key_fn`` partition when given, else round-robin."""
        if key_fn is not None:
            check_fn(key_fn, "rebalance()")
        return self._next(RebalanceTransform(self.transform, key_fn), "rebalance")

    def merge(self, other: "Stage") -> "Stage":
        """The items of this stage and of ``other``, in no particular order."""
        self._check_same_pipeline(other, "merge()")
        t = MergeTransform([self.transform, other.transform])
        self.pipeline._add(t, "merge")
        return Stage(self.pipeline, t, is_stream=self.is_stream or other.is_stream,
                     timestamp_fn=self.timestamp_fn if other.timestamp_fn else None,
                     native_timestamp_fn=None)

    # --- joins of two streams in event time ------------------------------------------------

    def join_interval(self, other: "Stage", key_fn: Callable[[Any], Any],
                      other_key_fn: Callable[[Any], Any], lower_ms: int, upper_ms: int,
                      fn: Callable[[Any, Any], Any] | None = None, *,
                      late_events_to: Sink | None = None) -> "Stage":
        """Joins this stream (left) with ``other`` (right) in event time: each pair of a left
        item at ``tl`` and a right item at ``tr`` with ``key_fn(left) == other_key_fn(right)``
        and ``tl + lower_ms <= tr <= tl + upper_ms`` is emitted once, as
        ``fn(left, right)`` (default: the tuple ``(left, right)``; a None result is dropped),
        at the event time ``max(tl, tr)``, so windows can follow.

        Both stages need timestamps. The state is bounded by the watermark: a left item is
        dropped once the watermark passes ``tl + upper_ms``, a right one once it passes
        ``tr - lower_ms``; an item below the watermark is late, counted in ``late_events``
        and dropped, or sent to ``late_events_to`` (a sink) when given.
        See docs/enrichment.md, "Joining two streams in event time".
        """
        where = f"join_interval() after stage {self.name!r}"
        self._check_stream_join(other, key_fn, other_key_fn, fn, late_events_to, where)
        for value, what in ((lower_ms, "lower_ms"), (upper_ms, "upper_ms")):
            check_ms(value, what, where, minimum=None, meaning="ms of event time, may be "
                     "negative")
        if lower_ms > upper_ms:
            raise PipelineError(f"{where}: lower_ms ({lower_ms}) is above upper_ms "
                                f"({upper_ms}): no right time can lie in [left time + "
                                f"{lower_ms}, left time + {upper_ms}]; swap them")
        t = IntervalJoinTransform(self.transform, other.transform, key_fn, other_key_fn,
                                  lower_ms, upper_ms, fn)
        return self._stream_join(t, other, "interval-join", late_events_to)

    def join_asof(self, other: "Stage", key_fn: Callable[[Any], Any],
                  other_key_fn: Callable[[Any], Any], *, tolerance_ms: int | None = None,
                  fn: Callable[[Any, Any], Any] | None = None, how: str = "left",
                  late_events_to: Sink | None = None) -> "Stage":
        """Joins each item of this stream (left) with the latest item of ``other`` (right)
        of the same key (``key_fn(left) == other_key_fn(right)``) at or before its event
        time, and at most ``tolerance_ms`` before it when given; among right items of one
        key and time, the last to arrive. Emits ``fn(left, right)`` (default: the tuple
        ``(left, right)``; a None result is dropped) at the left item's time. A left item
        without a right one gives ``fn(left, None)`` with ``how="left"`` (the default) and
        nothing with ``how="inner"``.

        Both stages need timestamps. Deterministic in event time: a left item waits until
        the watermark passes its time, when no right item at or before it can come any
        more. Per key, only the right items a later left item can still need are kept. An
        item below the watermark is late: counted in ``late_events`` and dropped, or sent to
        ``late_events_to``. See docs/enrichment.md, "Joining two streams in event time".
        """
        where = f"join_asof() after stage {self.name!r}"
        self._check_stream_join(other, key_fn, other_key_fn, fn, late_events_to, where)
        check_ms(tolerance_ms, "tolerance_ms", where, allow_none=True,
                 meaning="ms of event time a right item may lie before the left one; None "
                 "for no limit")
        if how not in ("left", "inner"):
            raise PipelineError(f"{where}: how must be 'left' (a left item without a match "
                                f"gives fn(left, None)) or 'inner' (it gives nothing), got "
                                f"{how!r}")
        t = AsofJoinTransform(self.transform, other.transform, key_fn, other_key_fn,
                              tolerance_ms, fn, how)
        return self._stream_join(t, other, "asof-join", late_events_to)

    def _check_stream_join(self, other: Any, key_fn: Any, other_key_fn: Any, fn: Any,
                           late_sink: Any, where: str) -> None:
        self._check_same_pipeline(other, where)
        check_fn(key_fn, f"{where}: key_fn")
        check_fn(other_key_fn, f"{where}: other_key_fn")
        if fn is not None:
            check_fn(fn, f"{where}: fn")
        if late_sink is not None and not isinstance(late_sink, Sink):
            raise TypeError(f"{where}: late_events_to expects a Sink (from jetwake.Sinks), "
                            f"got {type(late_sink).__qualname__}")
        for s, side in ((self, "left"), (other, "right")):
            if not s.has_timestamps:
                raise PipelineError(
                    f"{where}: the {side} stage {s.name!r} has no timestamps; a join in "
                    "event time needs both; call with_timestamps(timestamp_fn, allowed_lag) "
                    "on it (or with_native_timestamps(lag) on a source with native "
                    "timestamps) before the join")

    def _stream_join(self, t: Transform, other: "Stage", base_name: str,
                     late_sink: Sink | None) -> "Stage":
        self.pipeline._add(t, base_name)
        if late_sink is not None:
            t.side_sink = late_sink
            self.pipeline._add(SideSinkTransform(t, late_sink), late_sink.name)
        return Stage(self.pipeline, t, is_stream=self.is_stream or other.is_stream,
                     timestamp_fn=_pair_timestamp, native_timestamp_fn=None)

    def hash_join(self, build: "Stage", key_fn: Callable[[Any], Any],
                  join_fn: Callable[[Any, Any], Any] = lambda item, value: (item, value), *,
                  build_key_fn: Callable[[Any], Any] = lambda e: e[0],
                  build_value_fn: Callable[[Any], Any] = lambda e: e[1],
                  outer: bool = False) -> "Stage":
        """Enriches each item with the build side's values of the same key.

        The build stage (a batch, consumed completely first) gives entries, by default
        ``(key, value)`` tuples; each item whose ``key_fn(item)`` matches emits
        ``join_fn(item, value)`` once per matching value. With ``outer=True`` an item without
        a match emits ``join_fn(item, None)`` instead of nothing.
        """
        self._check_same_pipeline(build, "hash_join()")
        if build.is_stream:
            raise PipelineError(f"hash_join(): the build side {build.name!r} is unbounded; "
                                "it must be a batch stage")
        for fn, what in ((key_fn, "key_fn"), (join_fn, "join_fn"),
                         (build_key_fn, "build_key_fn"), (build_value_fn, "build_value_fn")):
            check_fn(fn, f"hash_join() {what}")
        t = HashJoinTransform(self.transform, build.transform, key_fn, build_key_fn,
                              build_value_fn, join_fn, bool(outer))
        return self._next(t, "hash-join", keeps_timestamps=False)

    # --- tables and maps (docs/enrichment.md, "Tables") -------------------------------------

    def map_using_map(self, map_name: str, key_fn: Callable[[Any], Any],
                      fn: Callable[[Any, Any], Any]) -> "Stage":
        """``fn(item, value)`` for each item, ``value`` being the named map's value for
        ``key_fn(item)`` (None when absent); a None result drops the item. The map is the
        member's (in a cluster, the cluster's) map, read as it is when the item passes, one
        ``get_all`` per chunk of items. Metrics: ``map_lookups``, ``map_misses``."""
        where = f"map_using_map() after stage {self.name!r}"
        if not isinstance(map_name, str) or not map_name.strip():
            raise ValueError(f"{where}: map_name must be the non-empty name of a map, got "
                             f"{map_name!r}")
        check_fn(key_fn, f"{where}: key_fn")
        check_fn(fn, f"{where}: fn")
        return self._next(MapUsingMapTransform(self.transform, map_name, key_fn, fn),
                          "map-using-map", keeps_timestamps=False)

    def join_table(self, table_stage: "Stage", key_fn: Callable[[Any], Any],
                   fn: Callable[[Any, Any], Any] | None = None, *, how: str = "inner",
                   broadcast: bool = False, bootstrap: bool = True) -> "Stage":
        """Joins each item to the current value of ``key_fn(item)`` in the table that
        ``table_stage`` (a ``Sources.kafka_table`` source stage) keeps: ``fn(item, value)``,
        by default the pair ``(item, value)``; a None result is dropped.

        ``how``: "inner" (the default, Kafka Streams' ``join``) drops items whose key has no
        value; "left" (``leftJoin``) emits ``fn(item, None)`` for them. ``broadcast``: False
        (the default, a KTable) partitions the table and the stream by key, so the stream's
        keys must equal the table's (same value and type); True (a GlobalKTable) gives every
        processor the whole table and leaves the stream where it is. ``bootstrap``: True (the
        default) holds the stream back on a first start until the table is read to its end
        offsets as of the start; False joins from the first item against the table read so
        far. The table lives in keyed state (RocksDB with ``JobConfig(state_backend=
        "rocksdb")``) and is saved in snapshots. The result has no timestamps.
        Metrics: ``table_entries``, ``table_hits``, ``table_misses``, ``table_updates``,
        ``table_deletes``.
        """
        where = f"join_table() after stage {self.name!r}"
        self._check_same_pipeline(table_stage, where)
        t = table_stage.transform
        if not isinstance(t, SourceTransform) or not t.source.table_changelog:
            raise PipelineError(
                f"{where}: the table stage {table_stage.name!r} is not a table; pass the stage "
                "that reads it, p.read_from(Sources.kafka_table(topic, props)), itself (to "
                "change the table's values, do it in fn)")
        check_fn(key_fn, f"{where}: key_fn")
        if fn is None:
            fn = _table_pair
        check_fn(fn, f"{where}: fn")
        if how not in ("inner", "left"):
            raise ValueError(f"{where}: how must be 'inner' or 'left', got {how!r}")
        for flag, what in ((broadcast, "broadcast"), (bootstrap, "bootstrap")):
            if not isinstance(flag, bool):
                raise TypeError(f"{where}: {what} must be True or False, got {flag!r}")
        return self._next(JoinTableTransform(self.transform, t, key_fn, fn, how, broadcast,
                                             bootstrap), "join-table", keeps_timestamps=False)

    # --- calling services (docs/enrichment.md, "Calling services") --------------------------

    def map_using_service(self, service_factory: Any, fn: Callable[[Any, Any], Any], *,
                          errors_to: Sink | None = None) -> "Stage":
        """``fn(service, item)`` for each item, with the service ``service_factory`` (a
        ``jetwake.ServiceFactory``) creates once per processor or per member; a None result
        drops the item. The calls block, so the stage's processors run on threads of their
        own. A call that raises goes to ``errors_to`` (a sink) as a record naming the item and
        the error, or without one fails the job naming the item and the cause."""
        return _service_stage(self, None, service_factory, fn, False, errors_to,
                              "map_using_service()")

    def map_using_service_async(self, service_factory: Any, fn: Callable[[Any, Any], Any], *,
                                max_concurrent: int = 16, preserve_order: bool = True,
                                timeout_ms: int | None = None, retry: Any = None,
                                errors_to: Sink | None = None) -> "Stage":
        """``await fn(service, item)`` for each item (``fn`` is an ``async def``), up to
        ``max_concurrent`` calls in flight per processor on its own event loop; results in
        input order (``preserve_order``) or as the calls complete. ``timeout_ms`` bounds each
        attempt (a timeout is a failure); ``retry`` is a tenacity policy
        (``tenacity.AsyncRetrying(stop=..., wait=...)``, a ``Retrying``, or a dict of its
        keyword arguments) applied to each call. A call that still fails goes to ``errors_to``
        or fails the job naming the item. A snapshot waits for the calls in flight, so
        exactly-once holds; watermarks wait for the calls started before them."""
        return _service_stage(self, None, service_factory, fn, True, errors_to,
                              "map_using_service_async()", max_concurrent, preserve_order,
                              timeout_ms, retry)

    def custom_transform(self, name: str, processor_supplier: Any) -> "Stage":
        """A stage made of your own processors (the core API): ``processor_supplier`` is a
        Processor subclass, a zero-argument factory, a ProcessorSupplier or a meta-supplier."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"custom_transform() needs a non-empty name, got {name!r}")
        from jetwake.engine.core.meta_supplier import as_meta_supplier
        as_meta_supplier(processor_supplier, f"custom_transform({name!r})")
        return self._next(CustomTransform(self.transform, processor_supplier), name,
                          keeps_timestamps=False)

    def write_to(self, sink: Sink) -> "SinkStage":
        """Ends the branch in ``sink`` (see ``jetwake.Sinks``)."""
        if not isinstance(sink, Sink):
            raise TypeError(f"write_to() expects a Sink (from jetwake.Sinks), "
                            f"got {type(sink).__qualname__}")
        t = SinkTransform(self.transform, sink)
        self.pipeline._add(t, sink.name)
        return SinkStage(self.pipeline, t)

    def _check_same_pipeline(self, other: Any, where: str) -> None:
        if not isinstance(other, Stage):
            raise TypeError(f"{where} expects a stage, got {type(other).__qualname__}")
        if other.pipeline is not self.pipeline:
            raise PipelineError(f"{where}: stage {other.name!r} belongs to another pipeline")


class GroupedStage:
    """A stage whose items are grouped by a key; stateful operations run per key."""

    def __init__(self, stage: Stage, key_fn: Callable[[Any], Any]) -> None:
        self.stage = stage
        self.key_fn = key_fn

    def aggregate(self, op: AggregateOperation) -> Stage:
        """One ``(key, result)`` per key (a batch stage emits them when its input ends)."""
        _check_op(op, "group_by().aggregate()")
        return self.stage._next(AggregateTransform(self.stage.transform, op, self.key_fn),
                                "aggregate", keeps_timestamps=False)

    def window(self, wdef: Any) -> "WindowedGroupedStage":
        """Windows over event time, per key (Jet's order: ``group_by(k).window(w)``)."""
        _check_window(self.stage, wdef)
        return WindowedGroupedStage(WindowedStage(self.stage, wdef), self.key_fn)

    def rolling_aggregate(self, op: AggregateOperation, *,
                          migrate: Callable[[Any], Any] | None = None) -> Stage:
        """``(key, result so far)`` for every item, the result of ``op`` over the key's items.
        ``migrate(old_accumulator)``: see :func:`check_migrate`."""
        _check_op(op, "group_by().rolling_aggregate()")
        check_migrate(migrate, "group_by().rolling_aggregate()")
        return self.stage._next(RollingAggregateTransform(self.stage.transform, op,
                                                          self.key_fn, migrate),
                                "rolling-aggregate")

    def map_stateful(self, create_fn: Callable[[], Any],
                     map_fn: Callable[[Any, Any, Any], Any], ttl: int | None = None,
                     on_evict: Callable[..., Any] | None = None, *,
                     migrate: Callable[[Any], Any] | None = None) -> Stage:
        """``map_fn(state, key, item)`` with one state object per key, made by
        ``create_fn()`` and changed in place; a None result emits nothing.

        ``ttl`` (event time, needs timestamps): a key's state is dropped when the watermark
        passes its last event's time + ``ttl``, after ``on_evict(state, key, watermark)``,
        whose result (unless None) is emitted. State must be msgpack-able (it is saved in
        snapshots). ``migrate(old_state)``: see :func:`check_migrate`.
        """
        where = f"group_by().map_stateful() after stage {self.stage.name!r}"
        check_fn(create_fn, f"{where}: create_fn")
        check_fn(map_fn, f"{where}: map_fn")
        if on_evict is not None:
            check_fn(on_evict, f"{where}: on_evict")
        if ttl is not None:
            check_ms(ttl, "ttl", where, minimum=1, meaning="ms of event time")
            if not self.stage.has_timestamps:
                raise PipelineError(
                    f"{where}: a ttl is measured in event time, but stage "
                    f"{self.stage.name!r} has no timestamps; call with_timestamps() first")
        elif on_evict is not None:
            raise PipelineError(f"{where}: on_evict needs a ttl")
        check_migrate(migrate, f"{where}:")
        return self.stage._next(MapStatefulTransform(self.stage.transform, create_fn, map_fn,
                                                     self.key_fn, ttl, on_evict, migrate),
                                "map-stateful")

    def map_using_map(self, map_name: str, key_fn: Callable[[Any], Any] | None = None,
                      fn: Callable[[Any, Any], Any] | None = None) -> Stage:
        """``fn(item, value)`` with the named map's value for the item's grouping key (None
        when absent), as ``Stage.map_using_map`` (Jet's ``mapUsingIMap`` after
        ``groupingKey``): ``map_using_map(map_name, fn)``; with ``key_fn`` as well
        (``map_using_map(map_name, key_fn, fn)``) the map is read by ``key_fn(item)``. The
        items reach the processor owning their grouping key's partition."""
        where = f"group_by().map_using_map() after stage {self.stage.name!r}"
        if fn is None:
            key_fn, fn = None, key_fn
        if not isinstance(map_name, str) or not map_name.strip():
            raise ValueError(f"{where}: map_name must be the non-empty name of a map, got "
                             f"{map_name!r}")
        check_fn(fn, f"{where}: fn")
        if key_fn is not None:
            check_fn(key_fn, f"{where}: key_fn")
        assert fn is not None  # checked
        return self.stage._next(MapUsingMapTransform(self.stage.transform, map_name,
                                                     key_fn or self.key_fn, fn,
                                                     partition_fn=self.key_fn),
                                "map-using-map", keeps_timestamps=False)

    def distinct(self) -> Stage:
        """The first item of each key."""
        return self.stage._next(DistinctTransform(self.stage.transform, self.key_fn),
                                "distinct", keeps_timestamps=False)


    # --- calling services, the key's items in order (docs/enrichment.md) -------------------

    def map_using_service(self, service_factory: Any, fn: Callable[[Any, Any], Any], *,
                          errors_to: Sink | None = None) -> Stage:
        """``Stage.map_using_service`` per key: the items reach the processor owning their
        key (across the cluster), so the service sees each key's items in order."""
        return _service_stage(self.stage, self.key_fn, service_factory, fn, False, errors_to,
                              "group_by().map_using_service()")

    def map_using_service_async(self, service_factory: Any, fn: Callable[[Any, Any], Any], *,
                                max_concurrent: int = 16, preserve_order: bool = True,
                                timeout_ms: int | None = None, retry: Any = None,
                                errors_to: Sink | None = None) -> Stage:
        """``Stage.map_using_service_async`` per key: at most one call per key in flight (the
        key's next items wait for it, in order), other keys proceed, up to
        ``max_concurrent`` calls in all."""
        return _service_stage(self.stage, self.key_fn, service_factory, fn, True, errors_to,
                              "group_by().map_using_service_async()", max_concurrent,
                              preserve_order, timeout_ms, retry)


def _service_stage(stage: Stage, key_fn: Callable[[Any], Any] | None, factory: Any,
                   fn: Callable[..., Any], is_async: bool, errors_to: Sink | None, what: str,
                   max_concurrent: int = 1, preserve_order: bool = True,
                   timeout_ms: int | None = None, retry: Any = None) -> Stage:
    """A ``map_using_service`` stage after ``stage``, its arguments checked first."""
    from jetwake.engine.pipeline.transforms import MapUsingServiceTransform
    from jetwake.engine.processors.service_calls import check_service_stage, retry_policy
    where = f"{what} after stage {stage.name!r}"
    check_service_stage(where, factory, fn, is_async)
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
        raise TypeError(f"{where}: max_concurrent must be an int (calls in flight per "
                        f"processor), got {type(max_concurrent).__qualname__}")
    if max_concurrent < 1:
        raise PipelineError(f"{where}: max_concurrent must be at least 1 (calls in flight "
                            f"per processor), got {max_concurrent}")
    check_ms(timeout_ms, "timeout_ms", where, allow_none=True, floats=True, minimum=None,
             meaning="ms per attempt; None for no timeout")
    if timeout_ms is not None and timeout_ms <= 0:
        raise PipelineError(f"{where}: timeout_ms must be positive (ms per attempt), or "
                            f"None for no timeout; got {timeout_ms}")
    if errors_to is not None and not isinstance(errors_to, Sink):
        raise TypeError(f"{where}: errors_to expects a Sink (from jetwake.Sinks), got "
                        f"{type(errors_to).__qualname__}")
    t = MapUsingServiceTransform(stage.transform, factory, fn, key_fn, is_async,
                                 max_concurrent, bool(preserve_order), timeout_ms,
                                 retry_policy(retry, where))
    out = stage._next(t, "map-using-service")
    if errors_to is not None:
        t.side_sink = errors_to
        stage.pipeline._add(SideSinkTransform(t, errors_to), errors_to.name)
    return out


class SinkStage(_StageBase):
    """The end of a branch: nothing can follow a sink."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        raise PipelineError(
            f"cannot call {attr}() on sink stage {self.transform.name!r}: write_to() ends a "
            "branch; to write one stage to several sinks call write_to() on that stage again")


class WindowedStage:
    """A stage with a window definition: ``group_by(key_fn)`` or a keyless ``aggregate``."""

    def __init__(self, stage: Stage, wdef: Any) -> None:
        self.stage = stage
        self.wdef = wdef
        self.late_sink: Sink | None = None

    @property
    def pipeline(self) -> Pipeline:
        return self.stage.pipeline

    def late_events_to(self, sink: Sink) -> "WindowedStage":
        """Sends late events (behind the watermark, for windows already emitted) to ``sink``
        instead of dropping them; they are counted in the ``late_events`` metric either way."""
        if not isinstance(sink, Sink):
            raise TypeError(f"late_events_to() expects a Sink (from jetwake.Sinks), got "
                            f"{type(sink).__qualname__}")
        self.late_sink = sink
        return self

    def group_by(self, key_fn: Callable[[Any], Any]) -> "WindowedGroupedStage":
        check_fn(key_fn, "window().group_by()")
        return WindowedGroupedStage(self, key_fn)

    def aggregate(self, op: AggregateOperation) -> Stage:
        """One ``WindowResult(start, end, result)`` per window."""
        _check_op(op, "window().aggregate()")
        return _window_stage(self, [self.stage], [op], None, "window-aggregate")

    def aggregate2(self, *args: Any) -> Stage:
        """Co-aggregates this stage and another in the same windows:
        ``aggregate2(other, op0, op1)`` or ``aggregate2(op0, other, op1)``; the result is the
        tuple ``(result0, result1)``."""
        other, op0, op1 = _aggregate2_args(args, "window().aggregate2()")
        other_stage = other.stage if isinstance(other, WindowedStage) else other
        if not isinstance(other_stage, Stage):
            raise TypeError(f"window().aggregate2() expects a stage to co-aggregate with, got "
                            f"{type(other).__qualname__}")
        return _window_stage(self, [self.stage, other_stage], [op0, op1], None,
                             "window-aggregate2")


class WindowedGroupedStage:
    """A windowed stage grouped by key: ``aggregate``, ``aggregate2`` or ``join``."""

    def __init__(self, windowed: WindowedStage, key_fn: Callable[[Any], Any]) -> None:
        self.windowed = windowed
        self.key_fn = key_fn

    @property
    def stage(self) -> Stage:
        return self.windowed.stage

    def late_events_to(self, sink: Sink) -> "WindowedGroupedStage":
        """See :meth:`WindowedStage.late_events_to`."""
        self.windowed.late_events_to(sink)
        return self

    def aggregate(self, op: AggregateOperation) -> Stage:
        """One ``KeyedWindowResult(start, end, key, result)`` per window and key."""
        _check_op(op, "window().group_by().aggregate()")
        return _window_stage(self.windowed, [self.stage], [op], [self.key_fn],
                             "window-aggregate")

    def aggregate2(self, *args: Any) -> Stage:
        """Co-aggregates with another grouped stage in the same windows and keys:
        ``aggregate2(other, op0, op1)`` or ``aggregate2(op0, other, op1)``, ``other`` from
        ``stage.group_by(key_fn)``; the result is the tuple ``(result0, result1)``."""
        other, op0, op1 = _aggregate2_args(args, "window().group_by().aggregate2()")
        stage, key_fn = _grouped_other(other, "aggregate2()")
        return _window_stage(self.windowed, [self.stage, stage], [op0, op1],
                             [self.key_fn, key_fn], "window-aggregate2")

    def join(self, other: Any,
             join_fn: Callable[[Any, Any], Any] = lambda left, right: (left, right)) -> Stage:
        """A windowed stream-to-stream inner join: for each window and key, one
        ``KeyedWindowResult(start, end, key, join_fn(left, right))`` per pair of a left item
        and a right item (``other`` from ``stage.group_by(key_fn)``); None results are
        dropped."""
        check_fn(join_fn, "window().group_by().join() join_fn")
        stage, key_fn = _grouped_other(other, "join()")
        from jetwake.engine.operations.aggregate import AggregateOperations
        from jetwake.engine.pipeline.event_time import window_join_flattener
        return _window_stage(self.windowed, [self.stage, stage],
                             [AggregateOperations.to_list(), AggregateOperations.to_list()],
                             [self.key_fn, key_fn], "window-join",
                             post=window_join_flattener(join_fn))


def _aggregate2_args(args: tuple[Any, ...], where: str) -> tuple[Any, AggregateOperation,
                                                        AggregateOperation]:
    if len(args) == 3 and isinstance(args[0], AggregateOperation):
        op0, other, op1 = args
    elif len(args) in (2, 3) and not isinstance(args[0], AggregateOperation):
        other, op0 = args[0], args[1]
        op1 = args[2] if len(args) == 3 else op0
    else:
        raise TypeError(f"{where} expects (other, op0, op1) or (op0, other, op1)")
    _check_op(op0, where)
    _check_op(op1, where)
    return other, op0, op1


def _grouped_other(other: Any, where: str) -> tuple[Stage, Callable[[Any], Any]]:
    if isinstance(other, WindowedGroupedStage):
        return other.stage, other.key_fn
    if isinstance(other, GroupedStage):
        return other.stage, other.key_fn
    raise TypeError(f"{where} expects the other side grouped by key "
                    f"(other_stage.group_by(key_fn)), got {type(other).__qualname__}")


def _check_window(stage: Stage, wdef: Any) -> None:
    from jetwake.engine.operations.window_definition import WindowDefinition
    if not isinstance(wdef, WindowDefinition):
        raise TypeError(f"window() after stage {stage.name!r} expects a WindowDefinition "
                        f"(WindowDefinition.tumbling/sliding/session), got "
                        f"{type(wdef).__qualname__}")
    if not stage.has_timestamps:
        raise PipelineError(
            f"window() after stage {stage.name!r}: the stage has no timestamps; call "
            "with_timestamps(timestamp_fn, allowed_lag) (or with_native_timestamps(lag) on a "
            "source with native timestamps) before windowing")


def _window_stage(windowed: WindowedStage, stages: list[Stage], ops: list[AggregateOperation],
                  key_fns: list[Callable[[Any], Any]] | None, base_name: str,
                  post: Any = None) -> Stage:
    first = stages[0]
    wdef = windowed.wdef
    for s in stages[1:]:
        first._check_same_pipeline(s, f"{base_name}()")
        if not s.has_timestamps:
            raise PipelineError(
                f"{base_name}(): stage {s.name!r} has no timestamps; call with_timestamps() "
                "on it before windowing it")
    if len(stages) > 1 and not all(op.can_combine for op in ops):
        raise PipelineError(f"{base_name}() after stage {first.name!r}: co-aggregation needs "
                            "operations that can combine")
    if len(stages) > 1 and wdef.is_session:
        # refused here, once, so that no runtime (a member's planner, the Spark backfill)
        # meets a stage it cannot run
        raise PipelineError(f"{base_name}() after stage {first.name!r}: co-aggregation of "
                            "session windows is not supported; use sliding or tumbling windows")
    if wdef.is_session and not all(op.can_combine for op in ops):
        raise PipelineError(
            f"{base_name}() after stage {first.name!r}: session windows merge sessions, which "
            "needs an aggregate operation with combine")
    t = WindowAggregateTransform([s.transform for s in stages], wdef, list(ops), key_fns, post)
    pipeline = first.pipeline
    pipeline._add(t, base_name)
    if windowed.late_sink is not None:
        t.side_sink = windowed.late_sink
        pipeline._add(SideSinkTransform(t, windowed.late_sink), windowed.late_sink.name)
    return Stage(pipeline, t, is_stream=any(s.is_stream for s in stages), timestamp_fn=None)


def _table_pair(item: Any, value: Any) -> tuple[Any, Any]:
    """join_table's default result: the item and its table value."""
    return item, value


def _pair_timestamp(pair: tuple[int, Any]) -> int:
    return pair[0]


def _check_op(op: Any, where: str) -> None:
    if not isinstance(op, AggregateOperation):
        raise TypeError(f"{where} expects an AggregateOperation (from "
                        f"jetwake.AggregateOperations), got {type(op).__qualname__}")
