"""What a source or sink gives the pipeline: a name and the processors that do the work.

Connectors (``jetwake.connectors``) build these; the planner only sees this contract, so the
engine never imports a concrete connector.
"""

from __future__ import annotations

from typing import Any, Callable

from jetwake.engine.core.meta_supplier import ProcessorMetaSupplier, as_meta_supplier

__all__ = ["Source", "Sink", "native_pair_timestamp"]


def native_pair_timestamp(pair: tuple[int, Any]) -> int:
    """The ``timestamp_fn`` of a source that emits ``(timestamp, item)`` pairs (Kafka's record
    timestamps, ``TestSources.item_stream``): it marks the source as one whose items are pairs,
    which ``with_native_timestamps`` turns into timestamped items and every other stage
    receives as plain items (the pairs' second halves)."""
    return pair[0]


class Source:
    """A pipeline source.

    ``is_stream``: unbounded (a streaming job) or bounded (a batch that completes).
    ``timestamp_fn``: for sources whose items carry an event time (``with_native_timestamps``),
    how to read it from an emitted item; :func:`native_pair_timestamp` says the source emits
    ``(timestamp, item)`` pairs.
    ``emits_watermarks``: the source itself emits watermarks of its native event time (for
    example the minimum over the partitions it reads, and the idle marker when all are quiet);
    ``with_native_timestamps(lag)`` then follows them, shifted by the lag, instead of deriving
    one watermark from the highest timestamp seen.
    ``partitioned``: the source reads partitions, each in order, and its processors implement
    ``PartitionedSource`` (engine/processors/source_event_time.py): a ``with_timestamps`` or
    ``with_native_timestamps`` stage right after it then runs inside it, with a watermark per
    partition.
    ``spark``: how the Spark backfill reads the source (a ``SparkReader`` of
    ``jetwake.engine.backfill.connector_forms``), or a
    :class:`~jetwake.engine.pipeline.spark_form.NotOnSpark` saying why it cannot; None (a
    source of the user's own) is refused by the backfill as a source without a Spark form.
    """

    #: the source emits a table's changelog with the "table ready" markers of a table join's
    #: bootstrap (``Sources.kafka_table``, engine/processors/table_join.py); the planner takes
    #: the markers out for any other consumer
    table_changelog = False

    def __init__(self, name: str, processor: Any, *, is_stream: bool = False,
                 timestamp_fn: Callable[[Any], int] | None = None,
                 emits_watermarks: bool = False, partitioned: bool = False,
                 spark: Any = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a source needs a non-empty name, got {name!r}")
        self.name = name
        self.meta_supplier: ProcessorMetaSupplier = as_meta_supplier(processor, f"source {name}")
        self.is_stream = is_stream
        self.timestamp_fn = timestamp_fn
        self.emits_watermarks = emits_watermarks
        self.partitioned = partitioned
        self.spark = spark

    @property
    def emits_pairs(self) -> bool:
        """Whether the source emits ``(timestamp, item)`` pairs (see
        :func:`native_pair_timestamp`)."""
        return self.timestamp_fn is native_pair_timestamp

    def __repr__(self) -> str:
        return f"Source({self.name!r}{', stream' if self.is_stream else ''})"


class Sink:
    """A pipeline sink.

    ``partition_key_fn``: when set, items reach the sink processor owning the key's partition
    (a sink keeping per-key order or per-key state needs it).
    ``spark``: how the Spark backfill writes to the sink (a ``SparkWriter``), or a
    ``NotOnSpark`` saying why it cannot (see :class:`Source`).
    """

    def __init__(self, name: str, processor: Any, *,
                 partition_key_fn: Callable[[Any], Any] | None = None,
                 spark: Any = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a sink needs a non-empty name, got {name!r}")
        self.name = name
        self.meta_supplier: ProcessorMetaSupplier = as_meta_supplier(processor, f"sink {name}")
        self.partition_key_fn = partition_key_fn
        self.spark = spark

    def __repr__(self) -> str:
        return f"Sink({self.name!r})"
