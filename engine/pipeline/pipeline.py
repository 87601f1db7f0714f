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

from typing import Any, Callable, TypeVar

from .aggregate import AggregateOperation
from .connector import Sink, Source
from .transforms import (
    AggregateTransform, CustomTransform, DistinctTransform, HashJoinTransform, MergeTransform,
    RebalanceTransform, SinkTransform, SortTransform, SourceTransform, StatelessTransform,
    Transform,
)

__all__ = ["Pipeline", "Stage", "GroupedStage", "SinkStage", "PipelineError"]

T = TypeVar("T", bound=Transform)


class PipelineError(ValueError):
    """The pipeline is wired wrongly; the message names the stage."""


def check_fn(fn: Any, where: str) -> None:
    if not callable(fn):
        raise TypeError(f"{where} expects a callable, got {type(fn).__qualname__}: {fn!r}")


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

    def to_dag(self, default_parallelism: int = 2):
        """Compiles the pipeline to a DAG (see ``planner.py``)."""
        from .planner import Planner
        return Planner(self, default_parallelism).build()

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

    def set_name(self, name: str):
        """Names the stage (its vertices and its saved state are found by this name)."""
        self.pipeline._rename(self.transform, name)
        return self

    def set_local_parallelism(self, n: int):
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
        return self._next(DistinctTransform(self.transform, None), "distinct")

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
        return self._next(t, "hash-join")

    def custom_transform(self, name: str, processor_supplier: Any) -> "Stage":
        """A stage made of your own processors (the core API): ``processor_supplier`` is a
        Processor subclass, a zero-argument factory, a ProcessorSupplier or a meta-supplier."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"custom_transform() needs a non-empty name, got {name!r}")
        from ..meta_supplier import as_meta_supplier
        as_meta_supplier(processor_supplier, f"custom_transform({name!r})")
        return self._next(CustomTransform(self.transform, processor_supplier), name)

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

    def distinct(self) -> Stage:
        """The first item of each key."""
        return self.stage._next(DistinctTransform(self.stage.transform, self.key_fn),
                                "distinct")


class SinkStage(_StageBase):
    """The end of a branch: nothing can follow a sink."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        raise PipelineError(
            f"cannot call {attr}() on sink stage {self.transform.name!r}: write_to() ends a "
            "branch; to write one stage to several sinks call write_to() on that stage again")


def _check_op(op: Any, where: str) -> None:
    if not isinstance(op, AggregateOperation):
        raise TypeError(f"{where} expects an AggregateOperation (from "
                        f"jetwake.AggregateOperations), got {type(op).__qualname__}")
