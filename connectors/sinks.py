"""Sinks: the catalogue of pipeline sinks (Jet's ``Sinks``)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from jetwake.engine.core.meta_supplier import (
    ProcessorMetaSupplier, ProcessorSupplier, SupplierContext,
)
from jetwake.engine.pipeline.connector import Sink
from jetwake.engine.core.processor import Processor
from jetwake.connectors.files import FileSinkProcessor, FilesSparkWriter
from jetwake.connectors.lists import (
    ExactlyOnceListSinkProcessor, ListSinkProcessor, ListSparkWriter,
)
from jetwake.connectors.logger_sink import LoggerSinkProcessor, LoggerSparkWriter
from jetwake.connectors.maps import MapSinkProcessor, MapSparkWriter
from jetwake.connectors.noop_sink import NoopSinkProcessor, NoopSparkWriter

__all__ = ["Sinks"]


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where} needs a non-empty name, got {name!r}")
    return name


def _check_fn(fn: Any, where: str) -> None:
    if fn is not None and not callable(fn):
        raise TypeError(f"{where} must be a callable, got {type(fn).__qualname__}")


def _key(entry: Any) -> Any:
    """The key of a (key, value) entry; a malformed entry is reported by the sink itself."""
    return entry[0] if type(entry) is tuple and len(entry) == 2 else None


class _ByGuarantee(ProcessorSupplier):
    """Creates a sink's processors once the job's processing guarantee is known: a sink that
    writes exactly once under exactly-once is another processor class (a transactional sink)
    than the one that writes as items arrive."""

    def __init__(self, choose: Callable[[SupplierContext], Callable[[], Processor]]) -> None:
        self.choose = choose
        self.factory: Callable[[], Processor] | None = None

    def init(self, context: SupplierContext) -> None:
        self.factory = self.choose(context)

    def get(self, count: int) -> list[Processor]:
        if self.factory is None:
            raise RuntimeError("the sink's supplier was not initialized (init before get)")
        return [self.factory() for _ in range(count)]


class Sinks:
    """Factories of pipeline sinks."""

    @staticmethod
    def map(name: str, key_fn: Callable[[Any], Any] | None = None,
            value_fn: Callable[[Any], Any] | None = None) -> Sink:
        """Puts each (key, value) item into the member's map ``name`` (idempotent).

        With ``key_fn`` and ``value_fn``, puts ``key_fn(item) -> value_fn(item)`` instead.
        """
        _check_name(name, "Sinks.map()")
        _check_fn(key_fn, "Sinks.map() key_fn")
        _check_fn(value_fn, "Sinks.map() value_fn")
        if (key_fn is None) != (value_fn is None):
            raise ValueError("Sinks.map(): pass both key_fn and value_fn, or neither")
        # routed by key, so the puts of one key keep their order (the last value wins)
        return Sink(f"map-sink-{name}", ProcessorMetaSupplier.of(
            lambda: MapSinkProcessor(name, key_fn, value_fn)), partition_key_fn=key_fn or _key,
            spark=MapSparkWriter(name, key_fn, value_fn))

    @staticmethod
    def map_with_merging(name: str, merge_fn: Callable[[Any, Any], Any],
                         key_fn: Callable[[Any], Any] | None = None,
                         value_fn: Callable[[Any], Any] | None = None) -> Sink:
        """Like :meth:`map`, but stores ``merge_fn(old, new)`` when the key exists (a None
        result removes the key)."""
        _check_name(name, "Sinks.map_with_merging()")
        if not callable(merge_fn):
            raise TypeError("Sinks.map_with_merging() needs a callable merge_fn(old, new)")
        _check_fn(key_fn, "Sinks.map_with_merging() key_fn")
        _check_fn(value_fn, "Sinks.map_with_merging() value_fn")
        if (key_fn is None) != (value_fn is None):
            raise ValueError("Sinks.map_with_merging(): pass both key_fn and value_fn, or "
                             "neither")
        # one writer per key, so a read-merge-write is never interleaved with another
        return Sink(f"map-sink-{name}", ProcessorMetaSupplier.of(
            lambda: MapSinkProcessor(name, key_fn, value_fn, merge_fn)),
            partition_key_fn=key_fn or _key, spark=MapSparkWriter(name, key_fn, value_fn, merge_fn))

    @staticmethod
    def list(name: str) -> Sink:
        """Appends every item to the member's list ``name``, in arrival order.

        Under exactly-once the items are appended at each snapshot's phase 2 (they appear
        once, a snapshot interval late); otherwise as they arrive.
        """
        _check_name(name, "Sinks.list()")

        def choose(ctx: SupplierContext) -> Callable[[], Processor]:
            if ctx.processing_guarantee == "exactly_once":
                return lambda: ExactlyOnceListSinkProcessor(name)
            return lambda: ListSinkProcessor(name)
        return Sink(f"list-sink-{name}", ProcessorMetaSupplier.of(_ByGuarantee(choose), 1),
                    spark=ListSparkWriter(name))

    @staticmethod
    def files(directory: str, encoding: str = "utf-8") -> Sink:
        """Writes ``str(item)`` lines, one file per processor, into ``directory``."""
        _check_name(directory, "Sinks.files()")
        return Sink("file-sink", ProcessorMetaSupplier.of(
            lambda: FileSinkProcessor(directory, encoding)),
            spark=FilesSparkWriter(directory, encoding))

    @staticmethod
    def noop() -> Sink:
        """Discards every item."""
        return Sink("noop-sink", ProcessorMetaSupplier.of(NoopSinkProcessor),
                    spark=NoopSparkWriter())

    @staticmethod
    def logger(to_string: Callable[[Any], str] = str, level: int = logging.INFO) -> Sink:
        """Logs every item on the ``jetwake.sink.logger`` logger."""
        _check_fn(to_string, "Sinks.logger() to_string")
        return Sink("logger-sink", ProcessorMetaSupplier.of(
            lambda: LoggerSinkProcessor(to_string, level), 1),
            spark=LoggerSparkWriter(to_string, level))

    @staticmethod
    def kafka(topic: str, properties: dict, *, key_fn: Callable[[Any], Any] | None = None,
              value_fn: Callable[[Any], Any] | None = None, key_serializer: Any = None,
              value_serializer: Any = None, exactly_once: "bool | None" = None) -> Sink:
        """Writes items to the Kafka ``topic``.

        Without ``key_fn``/``value_fn`` a ``(key, value)`` tuple is written as such and any
        other item as a value without key. Serializers: None (bytes or str), "str", "json",
        "msgpack" or a callable. ``exactly_once``: None follows the job's processing
        guarantee (transactions under exactly_once); False forces at-least-once (an
        idempotent producer flushed at every snapshot); True requires a job with
        processing_guarantee="exactly_once" and fails the job's start otherwise. See
        docs/kafka.md.
        """
        from jetwake.connectors.kafka.properties import KafkaConfigError, sink_properties
        from jetwake.connectors.kafka.serde import make_serializer
        from jetwake.connectors.kafka.sink import KafkaRecordFormat, KafkaSinkProcessor
        from jetwake.connectors.kafka.sink_exactly_once import KafkaExactlyOnceSinkProcessor
        from jetwake.connectors.kafka.spark import KafkaSparkWriter

        where = "Sinks.kafka()"
        _check_name(topic, where)
        props, opts = sink_properties(properties, where)
        _check_fn(key_fn, f"{where} key_fn")
        _check_fn(value_fn, f"{where} value_fn")
        ks = make_serializer(key_serializer, f"{where} key_serializer")
        vs = make_serializer(value_serializer, f"{where} value_serializer")
        if exactly_once not in (None, True, False):
            raise TypeError(f"{where}: exactly_once must be None, True or False, got "
                            f"{exactly_once!r}")
        fmt = KafkaRecordFormat(topic, props, opts, key_fn, value_fn, ks, vs)

        def choose(ctx: SupplierContext) -> Callable[[], Processor]:
            transactional = ctx.processing_guarantee == "exactly_once"
            if exactly_once and not transactional:
                raise KafkaConfigError(
                    f"{where}: Sinks.kafka({topic!r}, exactly_once=True) needs a job with "
                    f"exactly-once snapshots, but job '{ctx.job_name}' runs with "
                    f"processing_guarantee='{ctx.processing_guarantee}'. Submit it with "
                    "JobConfig(processing_guarantee='exactly_once'), or pass "
                    "exactly_once=None (follow the job's guarantee) or exactly_once=False "
                    "(write at-least-once)")
            if transactional and exactly_once is not False:
                return lambda: KafkaExactlyOnceSinkProcessor(fmt)
            return lambda: KafkaSinkProcessor(fmt)
        return Sink(f"kafka-sink-{topic}", ProcessorMetaSupplier.of(_ByGuarantee(choose)),
                    spark=KafkaSparkWriter(fmt, exactly_once))

    @staticmethod
    def postgres(table: str, dsn: str, *, columns: "Sequence[str] | None" = None,
                 key_columns: "Sequence[str] | None" = None,
                 value_fn: Callable[[Any], Any] | None = None,
                 exactly_once: "bool | None" = None, batch_size: int = 1000) -> Sink:
        """Writes items as rows of the PostgreSQL ``table`` (``"name"`` or ``"schema.name"``)
        at ``dsn`` (a libpq connection string or URI). See docs/postgres.md.

        ``value_fn(item)`` (the item itself without one) gives a dict (column -> value) or a
        tuple in ``columns`` order; ``columns=None``: the table's columns, read from its
        catalog when the job starts. ``key_columns``: upsert (``INSERT ... ON CONFLICT
        (key_columns) DO UPDATE``), which needs a unique key on them. ``exactly_once``: None
        follows the job's processing guarantee (under exactly_once, one transaction per
        processor and snapshot, prepared at phase 1 and committed at phase 2); False writes and
        commits every batch (exact contents with ``key_columns``, at-least-once without); True
        requires a job with processing_guarantee="exactly_once". Rows go to the server
        ``batch_size`` at a time (COPY, or the upsert pipelined).
        """
        from jetwake.connectors.postgres.connection import check_dsn
        from jetwake.connectors.postgres.rows import PostgresSinkError, row_key_fn
        from jetwake.connectors.postgres.sink import (
            PostgresExactlyOnceSinkProcessor, PostgresSinkProcessor, PostgresSinkSpec,
        )
        from jetwake.connectors.postgres.statements import parse_table

        where = f"Sinks.postgres({table!r})"
        parse_table(table)
        check_dsn(dsn, where)
        _check_fn(value_fn, f"{where} value_fn")

        def names(value: Any, what: str) -> "tuple[str, ...] | None":
            if value is None:
                return None
            if isinstance(value, str) or not all(isinstance(c, str) and c for c in value) \
                    or not value:
                raise PostgresSinkError(f"{where}: {what} must be a non-empty list of column "
                                        f"names, got {value!r}")
            if len(set(value)) != len(value):
                raise PostgresSinkError(f"{where}: {what} names a column twice: {value!r}")
            return tuple(value)
        cols, keys = names(columns, "columns"), names(key_columns, "key_columns")
        if cols is not None and keys is not None and not set(keys) <= set(cols):
            raise PostgresSinkError(f"{where}: key_columns {list(keys)} must be among columns "
                                    f"{list(cols)}")
        if exactly_once not in (None, True, False):
            raise TypeError(f"{where}: exactly_once must be None, True or False, got "
                            f"{exactly_once!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise PostgresSinkError(f"{where}: batch_size must be a positive int, got "
                                    f"{batch_size!r}")
        spec = PostgresSinkSpec(table, dsn, cols, keys, value_fn, exactly_once, batch_size,
                                where)

        def choose(ctx: SupplierContext) -> Callable[[], Processor]:
            transactional = ctx.processing_guarantee == "exactly_once"
            if exactly_once and not transactional:
                raise PostgresSinkError(
                    f"{where}: exactly_once=True needs a job with exactly-once snapshots, but "
                    f"job '{ctx.job_name}' runs with processing_guarantee="
                    f"'{ctx.processing_guarantee}'. Submit it with JobConfig(processing_"
                    "guarantee='exactly_once'), or pass exactly_once=None (follow the job's "
                    "guarantee) or exactly_once=False (commit every batch)")
            if transactional and exactly_once is not False:
                return lambda: PostgresExactlyOnceSinkProcessor(spec)
            return lambda: PostgresSinkProcessor(spec)
        # with key_columns, items reach the processor owning their key: the upserts of one
        # key keep their order (the last one wins), and two open transactions never wait for
        # each other's row locks
        key_fn = None if keys is None else row_key_fn(value_fn, cols, keys, where)
        from jetwake.connectors.postgres.spark import PostgresSparkWriter
        return Sink(f"postgres-sink-{table}", ProcessorMetaSupplier.of(_ByGuarantee(choose)),
                    partition_key_fn=key_fn, spark=PostgresSparkWriter(spec))
