"""Sources: the catalogue of pipeline sources (Jet's ``Sources``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Iterable

from jetwake.engine.core.meta_supplier import ProcessorMetaSupplier
from jetwake.engine.pipeline.connector import Source
from jetwake.engine.pipeline.spark_form import NotOnSpark
from jetwake.connectors.files import FileSourceProcessor
from jetwake.connectors.items_source import ItemsSourceProcessor, ItemsSparkReader
from jetwake.connectors.maps import MapJournalSourceProcessor, MapSourceProcessor, MapSparkReader
from jetwake.connectors.record_files import FilesSparkReader, RecordFileSourceProcessor, is_glob

__all__ = ["Sources"]


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where} needs a non-empty name, got {name!r}")
    return name


def _check_directory(pattern: str, where: str) -> None:
    """Fails early when the directory ``pattern`` is in does not exist (without glob
    characters): the path is wrong, not the input empty. Whether the file itself exists is
    checked when the job starts, on the machine that reads it."""
    directory = pattern if os.path.isdir(pattern) else os.path.dirname(pattern) or "."
    if not is_glob(directory) and not os.path.isdir(directory):
        raise FileNotFoundError(f"{where}: directory {directory!r} of {pattern!r} does not "
                                "exist")


class Sources:
    """Factories of pipeline sources."""

    @staticmethod
    def items(items: Iterable[Any]) -> Source:
        """The given items, in order (a batch). The iterable is read when this is called."""
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            raise TypeError(f"Sources.items() expects an iterable of items (a list, tuple, "
                            f"range...), got {type(items).__qualname__}")
        data = items if isinstance(items, Sequence) else list(items)
        return Source("items", ProcessorMetaSupplier.of(lambda: ItemsSourceProcessor(data), 1),
                      spark=ItemsSparkReader(data))

    @staticmethod
    def files(pattern: str, encoding: str = "utf-8") -> Source:
        """The lines (without line endings) of a file, of every file in a directory, or of
        every file a glob matches (a batch).

        ``pattern`` follows :func:`~jetwake.connectors.record_files.matching_files`: a
        directory means its regular files whose names do not start with '.' or '_', sorted; a
        path without glob characters (``*?[``) that does not exist fails the job when it starts
        (FileNotFoundError); a glob that matches nothing is an empty input, with a warning.
        """
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"Sources.files() needs a file, a directory or a glob pattern "
                             f"such as 'data/*.txt', got {pattern!r}")
        _check_directory(pattern, "Sources.files()")
        return Source("files", ProcessorMetaSupplier.of(
            lambda: FileSourceProcessor(pattern, encoding), 1),
            spark=FilesSparkReader(pattern, "files", encoding))

    @staticmethod
    def parquet(path: str) -> Source:
        """The rows of a Parquet file, of every file in a directory (a dataset), or of every
        file a glob matches, as dicts (column -> value), file after file in path order (a
        batch). Paths follow the rules of :meth:`files`."""
        return Sources._record_files(path, "parquet", "Sources.parquet()",
                                     "a Parquet file, a directory or a glob such as "
                                     "'data/*.parquet'")

    @staticmethod
    def json_lines(pattern: str) -> Source:
        """The JSON values of the lines of a file, of every file in a directory, or of every
        file a glob matches, file after file in path order; blank lines are skipped (a batch).
        Paths follow the rules of :meth:`files`."""
        return Sources._record_files(pattern, "json_lines", "Sources.json_lines()",
                                     "a file, a directory or a glob such as 'data/*.jsonl'")

    @staticmethod
    def _record_files(pattern: str, kind: str, where: str, what: str) -> Source:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"{where} needs {what}, got {pattern!r}")
        _check_directory(pattern, where)
        return Source(kind.replace("_", "-"), ProcessorMetaSupplier.of(
            lambda: RecordFileSourceProcessor(pattern, kind), 1),
            spark=FilesSparkReader(pattern, kind))

    @staticmethod
    def map(name: str) -> Source:
        """The entries of a member's named map as (key, value) tuples (a batch)."""
        _check_name(name, "Sources.map()")
        return Source(f"map-source-{name}",
                      ProcessorMetaSupplier.of(lambda: MapSourceProcessor(name)),
                      spark=MapSparkReader(name))

    @staticmethod
    def map_journal(name: str, start: str = "oldest", on_overrun: str = "fail") -> Source:
        """An unbounded stream of ``(key, new_value)`` for each put into the member's map.

        ``start``: "oldest" (every event still in the journal) or "current" (events after the
        job starts). Replayable: the position is saved in snapshots. ``on_overrun``: "fail"
        (default) or "skip" when the bounded journal dropped unread events.
        """
        _check_name(name, "Sources.map_journal()")
        if start not in ("oldest", "current"):
            raise ValueError(f"Sources.map_journal(start=...) must be 'oldest' or 'current', "
                             f"got {start!r}")
        if on_overrun not in ("fail", "skip"):
            raise ValueError(f"Sources.map_journal(on_overrun=...) must be 'fail' or 'skip', "
                             f"got {on_overrun!r}")
        return Source(f"map-journal-{name}", ProcessorMetaSupplier.of(
            lambda: MapJournalSourceProcessor(name, start, on_overrun), 1), is_stream=True,
            partitioned=True, spark=NotOnSpark(
                "a map's journal is an unbounded stream of a member; a backfill reads "
                "Sources.items, files, parquet, json_lines, map and kafka (bounded by until)"))

    @staticmethod
    def kafka(topics: "str | Sequence[str]", properties: dict, *,
              key_deserializer: Any = None, value_deserializer: Any = None,
              start: "str | int" = "earliest", projection: Any = None,
              on_error: str = "fail", dead_letter_topic: "str | None" = None) -> Source:
        """A stream of the records of Kafka ``topics`` as ``(key, value)`` tuples (or
        ``projection(record)``), replayable from the offsets kept in the job's snapshots.

        ``properties``: librdkafka consumer settings (``bootstrap.servers`` at least; see
        docs/kafka.md for the ``jetwake.*`` options). Deserializers: None (raw bytes), "str",
        "json", "msgpack" or a callable. ``start``: "earliest", "latest" or a timestamp (ms)
        for partitions without a saved offset. ``projection(record)`` sees ``.topic
        .partition .offset .timestamp .key .value .headers``. ``on_error``: "fail" (a record
        that cannot be deserialized fails the job) or "dead_letter" (it goes to
        ``dead_letter_topic`` with the error in its headers). Record timestamps are the
        native timestamps (``with_native_timestamps(lag)``). A ``with_timestamps`` or
        ``with_native_timestamps`` stage right after this source runs inside it, with a
        watermark per partition (docs/windowing.md, "Event time per partition").
        """
        from jetwake.engine.pipeline.event_time import native_pair_timestamp
        from jetwake.connectors.kafka.properties import source_properties
        from jetwake.connectors.kafka.serde import make_deserializer
        from jetwake.connectors.kafka.source import KafkaSourceProcessor
        from jetwake.connectors.kafka.spark import KafkaSparkReader

        where = "Sources.kafka()"
        if isinstance(topics, str):
            topics = [topics]
        if not isinstance(topics, (list, tuple)) or not topics or not all(
                isinstance(t, str) and t.strip() for t in topics):
            raise ValueError(f"{where}: topics must be a topic name or a non-empty list of "
                             f"names, got {topics!r}")
        if len(set(topics)) != len(topics):
            raise ValueError(f"{where}: topics listed twice in {topics!r}")
        props, opts = source_properties(properties, where)
        kd = make_deserializer(key_deserializer, f"{where} key_deserializer")
        vd = make_deserializer(value_deserializer, f"{where} value_deserializer")
        if not (start in ("earliest", "latest") or (
                isinstance(start, int) and not isinstance(start, bool) and start >= 0)):
            raise ValueError(f"{where}: start must be 'earliest', 'latest' or a timestamp in "
                             f"ms since the epoch, got {start!r}")
        if projection is not None and not callable(projection):
            raise TypeError(f"{where}: projection must be a callable record -> item, got "
                            f"{type(projection).__qualname__}")
        if on_error not in ("fail", "dead_letter"):
            raise ValueError(f"{where}: on_error must be 'fail' or 'dead_letter', got "
                             f"{on_error!r}")
        if on_error == "dead_letter":
            if not isinstance(dead_letter_topic, str) or not dead_letter_topic.strip():
                raise ValueError(f"{where}: on_error='dead_letter' needs dead_letter_topic, "
                                 "the topic that receives the records that cannot be read")
            if dead_letter_topic in topics:
                raise ValueError(f"{where}: the dead-letter topic {dead_letter_topic!r} is "
                                 "also a source topic")
        elif dead_letter_topic is not None:
            raise ValueError(f"{where}: dead_letter_topic is only used with "
                             "on_error='dead_letter'")
        topic_list = list(topics)
        dlq = dead_letter_topic if on_error == "dead_letter" else None

        def make() -> KafkaSourceProcessor:
            return KafkaSourceProcessor(topic_list, props, opts, kd, vd, start, projection,
                                        on_error, dlq)

        return Source(f"kafka-source-{'-'.join(topic_list)}"[:120],
                      ProcessorMetaSupplier.of(make), is_stream=True,
                      timestamp_fn=native_pair_timestamp, partitioned=True,
                      spark=KafkaSparkReader(topic_list, props, start, kd, vd, projection,
                                             on_error, dlq))

    @staticmethod
    def kafka_table(topic: str, props: dict, key_deserializer: Any = None,
                    value_deserializer: Any = None) -> Source:
        """A table kept current by the compacted Kafka ``topic``: a stream of ``(key, value)``
        changes, the latest value per key, where a tombstone (a record without a value) gives
        ``(key, None)`` and deletes the key. Read from the topic's beginning; the offsets are
        saved in snapshots as ``Sources.kafka``'s. Join a stream to it with
        ``Stage.join_table`` (docs/enrichment.md, "Tables").

        ``props``: librdkafka consumer settings, as for ``Sources.kafka``. Deserializers: None
        (raw bytes), "str", "json", "msgpack" or a callable, as for ``Sources.kafka``. When the
        job starts, a missing topic fails it with the command that creates it compacted, and
        a topic whose cleanup.policy is not compact logs a warning with the fix.
        """
        from jetwake.connectors.kafka.properties import source_properties
        from jetwake.connectors.kafka.serde import make_deserializer
        from jetwake.connectors.kafka.spark import KafkaSparkReader
        from jetwake.connectors.kafka.table_source import KafkaTableSourceProcessor

        where = "Sources.kafka_table()"
        if not isinstance(topic, str) or not topic.strip():
            raise ValueError(f"{where}: topic must be a topic name (one compacted topic), got "
                             f"{topic!r}")
        kprops, opts = source_properties(props, where)
        kd = make_deserializer(key_deserializer, f"{where} key_deserializer")
        vd = make_deserializer(value_deserializer, f"{where} value_deserializer")

        def make() -> KafkaTableSourceProcessor:
            return KafkaTableSourceProcessor(topic, kprops, opts, kd, vd)

        source = Source(f"kafka-table-{topic}"[:120], ProcessorMetaSupplier.of(make),
                        is_stream=True,
                        spark=KafkaSparkReader([topic], kprops, "earliest", kd, vd, None,
                                               "fail", None))
        source.table_changelog = True
        return source

    @staticmethod
    def postgres(query: str, dsn: str, *, partition_column: "str | None" = None,
                 partitions: "int | None" = None) -> Source:
        """The rows of a PostgreSQL ``query`` at ``dsn`` (a libpq connection string or URI)
        as dicts (column -> value, values as psycopg adapts them), a batch. See
        docs/postgres.md, "Reading from PostgreSQL".

        Without ``partition_column`` one processor in the cluster runs the query. With it (a
        numeric, date or timestamp column of the result) the range ``[min, max]`` of its
        values is split into ``partitions`` ranges (default: one per processor of the stage
        over every member), read side by side (``SELECT * FROM (query) q WHERE col >= lo AND
        col < hi``), the rows whose key is NULL a range of their own; every processor on
        every member reads one snapshot of the database (exported by the first member).
        Rows are fetched ``CHUNK_ROWS`` at a time from a server-side cursor. In a job with snapshots each range's progress is saved,
        and a restored job goes on where it was.
        """
        from jetwake.connectors.postgres.source import (
            PostgresSourceMetaSupplier, PostgresSparkReader, source_spec,
        )

        spec = source_spec(query, dsn, partition_column, partitions)
        return Source("postgres-source", PostgresSourceMetaSupplier(spec),
                      spark=PostgresSparkReader(spec))
