"""The logical plan: one Transform per pipeline stage, linked to its upstream transforms.

Stages build transforms; the planner (``planner.py``) turns them into a DAG. A transform's name
is unique in its pipeline and names its vertices, so saved state can be matched to stages.
"""

from __future__ import annotations

from typing import Any, Callable

from jetwake.engine.operations.aggregate import AggregateOperation
from jetwake.engine.pipeline.connector import Sink, Source

__all__ = [
    "Transform", "SourceTransform", "StatelessTransform", "AggregateTransform",
    "DistinctTransform", "SortTransform", "RebalanceTransform", "MergeTransform",
    "HashJoinTransform", "CustomTransform", "SinkTransform", "TimestampTransform",
    "WindowAggregateTransform", "RollingAggregateTransform", "MapStatefulTransform",
    "SideSinkTransform",
]


class Transform:
    kind = "transform"

    def __init__(self, upstream: list["Transform"]) -> None:
        self.upstream = upstream
        self.name = ""
        self.local_parallelism = -1
        self.explicit_parallelism = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class SourceTransform(Transform):
    kind = "source"

    def __init__(self, source: Source) -> None:
        super().__init__([])
        self.source = source


class StatelessTransform(Transform):
    def __init__(self, upstream: Transform, op: str, fn: Callable[[Any], Any]) -> None:
        super().__init__([upstream])
        self.kind = op
        self.op = op
        self.fn = fn


class AggregateTransform(Transform):
    kind = "aggregate"

    def __init__(self, upstream: Transform, op: AggregateOperation,
                 key_fn: Callable[[Any], Any] | None) -> None:
        super().__init__([upstream])
        self.op = op
        self.key_fn = key_fn


class DistinctTransform(Transform):
    kind = "distinct"

    def __init__(self, upstream: Transform, key_fn: Callable[[Any], Any] | None) -> None:
        super().__init__([upstream])
        self.key_fn = key_fn


class SortTransform(Transform):
    kind = "sort"

    def __init__(self, upstream: Transform, key: Callable[[Any], Any] | None,
                 reverse: bool) -> None:
        super().__init__([upstream])
        self.key = key
        self.reverse = reverse


class RebalanceTransform(Transform):
    kind = "rebalance"

    def __init__(self, upstream: Transform, key_fn: Callable[[Any], Any] | None) -> None:
        super().__init__([upstream])
        self.key_fn = key_fn


class MergeTransform(Transform):
    kind = "merge"


class HashJoinTransform(Transform):
    kind = "hash-join"

    def __init__(self, stream: Transform, build: Transform, key_fn: Callable[[Any], Any],
                 build_key_fn: Callable[[Any], Any], build_value_fn: Callable[[Any], Any],
                 join_fn: Callable[[Any, Any], Any], outer: bool) -> None:
        super().__init__([stream, build])
        self.key_fn = key_fn
        self.build_key_fn = build_key_fn
        self.build_value_fn = build_value_fn
        self.join_fn = join_fn
        self.outer = outer


class CustomTransform(Transform):
    kind = "custom"

    def __init__(self, upstream: Transform, processor_supplier: Any) -> None:
        super().__init__([upstream])
        self.processor_supplier = processor_supplier


class SinkTransform(Transform):
    kind = "sink"

    def __init__(self, upstream: Transform, sink: Sink) -> None:
        super().__init__([upstream])
        self.sink = sink


# --- event time ------------------------------------------------------------------------------

class TimestampTransform(Transform):
    """Assigns event timestamps and inserts watermarks (``with_timestamps``)."""

    kind = "timestamps"

    def __init__(self, upstream: Transform, timestamp_fn: Callable[[Any], int] | None,
                 policy_factory: Any, idle_timeout: int, native: bool,
                 upstream_watermarks: bool = False) -> None:
        super().__init__([upstream])
        self.timestamp_fn = timestamp_fn  # None: the source emits (ts, item) pairs
        self.policy_factory = policy_factory
        self.idle_timeout = idle_timeout
        self.native = native
        # the source emits its own watermarks (per partition): follow them
        self.upstream_watermarks = upstream_watermarks
        self.side_sink: Sink | None = None  # events without a readable timestamp


class WindowAggregateTransform(Transform):
    """A windowed aggregation of one or more inputs (``aggregate`` / ``aggregate2``)."""

    kind = "window-aggregate"

    def __init__(self, upstream: list[Transform], wdef: Any, ops: list[AggregateOperation],
                 key_fns: list[Callable[[Any], Any]] | None,
                 post: Callable[[Any], Any] | None = None) -> None:
        super().__init__(upstream)
        self.wdef = wdef
        self.ops = ops
        self.key_fns = key_fns  # None: keyless
        self.post = post        # a flat-map over the window results (the windowed join)
        self.side_sink: Sink | None = None  # late events


class RollingAggregateTransform(Transform):
    kind = "rolling-aggregate"

    def __init__(self, upstream: Transform, op: AggregateOperation,
                 key_fn: Callable[[Any], Any] | None) -> None:
        super().__init__([upstream])
        self.op = op
        self.key_fn = key_fn


class MapStatefulTransform(Transform):
    kind = "map-stateful"

    def __init__(self, upstream: Transform, create_fn: Callable[[], Any],
                 map_fn: Callable[..., Any], key_fn: Callable[[Any], Any] | None,
                 ttl: int | None, on_evict: Callable[..., Any] | None) -> None:
        super().__init__([upstream])
        self.create_fn = create_fn
        self.map_fn = map_fn
        self.key_fn = key_fn
        self.ttl = ttl
        self.on_evict = on_evict


class SideSinkTransform(SinkTransform):
    """A sink fed by a side output of ``owner`` (late events, unreadable timestamps); the
    planner wires it while planning the owner."""

    kind = "side-sink"
