"""Sources of records in files: Parquet files (one dict per row) and JSON-lines files (one
value per line), read in file order by one processor (``Sources.parquet``,
``Sources.json_lines``), and :func:`matching_files`, the rule by which every file source
(``Sources.files`` too) turns its path into files.

The files are read sorted by path, so the order of the records is the same in every run, on a
member and in the Spark backfill (``FilesSparkReader`` below), which lists them with the same
:func:`matching_files` and reads them with :func:`read_records`, a run of files per Spark task.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Any, Iterator

from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext
from jetwake.engine.backfill.chunks import chunked
from jetwake.engine.backfill.connector_forms import SparkReader
from jetwake.engine.backfill.stage_output import StageOut

__all__ = ["RecordFileSourceProcessor", "is_glob", "matching_files", "read_records",
           "warn_if_no_files", "FilesSparkReader"]

log = logging.getLogger("jetwake.connectors.record_files")

_BATCH = 4096
_SOURCE_NAMES = {"files": "Sources.files", "parquet": "Sources.parquet",
                 "json_lines": "Sources.json_lines"}
_EXAMPLE_GLOBS = {"files": "*.txt", "parquet": "*.parquet", "json_lines": "*.jsonl"}


def is_glob(pattern: str) -> bool:
    """Whether ``pattern`` has glob characters (``*?[``), so that matching nothing is an
    empty input rather than a wrong path."""
    return any(c in pattern for c in "*?[")


def matching_files(pattern: str, kind: str) -> list[str]:
    """The files ``pattern`` names, sorted by path: a directory means every regular file in it
    whose name does not start with '.' or '_' (a Parquet dataset's parts, not its ``_SUCCESS``
    or ``.crc`` files), a glob every regular file it matches (possibly none), any other path
    that one file.

    Raises FileNotFoundError for a path without glob characters that does not exist: a
    mistyped path must not read as an empty input. The member's file sources call this when
    the job starts and the Spark backfill before it starts Spark work, so both fail alike.
    """
    if os.path.isdir(pattern):
        return sorted(path for path in (os.path.join(pattern, n) for n in os.listdir(pattern)
                                        if not n.startswith((".", "_")))
                      if os.path.isfile(path))
    if is_glob(pattern):
        return sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    if not os.path.exists(pattern):
        where = _SOURCE_NAMES.get(kind, kind)
        example = os.path.join(os.path.dirname(pattern), _EXAMPLE_GLOBS.get(kind, "*"))
        raise FileNotFoundError(
            f"{where}({pattern!r}): no such file or directory; check the path, or, to accept "
            f"an empty input, give a glob such as {example!r}")
    return [pattern]


def warn_if_no_files(pattern: str, kind: str, files: list[str]) -> None:
    """Logs a warning when a glob or a directory names no file: an empty input is valid, but
    rarely what was meant."""
    if not files:
        log.warning("%s(%r): no file matches; the source is empty",
                    _SOURCE_NAMES.get(kind, kind), pattern)


def read_records(path: str, kind: str) -> Iterator[Any]:
    """The records of one file, in order: dicts of a Parquet file's rows, or the JSON values
    of a JSON-lines file's non-blank lines."""
    if kind == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:  # pragma: no cover - pyarrow comes with the spark extra
            raise ImportError("Sources.parquet() needs pyarrow: pip install pyarrow") from e
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=_BATCH):
            yield from batch.to_pylist()
        return
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError as e:
                raise ValueError(f"Sources.json_lines: {path} line {n} is not JSON: {e}") \
                    from None


class RecordFileSourceProcessor(Processor):
    """Emits the records of every matching file, in path order (one processor); a literal
    path that does not exist fails the job when it starts. Its position (files done, records
    of the current file emitted) is saved in snapshots."""

    def __init__(self, pattern: str, kind: str) -> None:
        self.pattern = pattern
        self.kind = kind
        self.files: list[str] = []
        self.file_index = 0
        self.done_in_file = 0
        self._records: Iterator[Any] | None = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.files = matching_files(self.pattern, self.kind)
        if context.global_processor_index == 0:
            warn_if_no_files(self.pattern, self.kind, self.files)

    def complete(self) -> bool:
        outbox = self.outbox
        while outbox.has_room():
            if self.file_index >= len(self.files):
                return True
            if self._records is None:
                self._records = read_records(self.files[self.file_index], self.kind)
                for _ in range(self.done_in_file):  # after a restore: skip what was emitted
                    next(self._records, None)
            chunk = []
            for rec in self._records:
                chunk.append(rec)
                if len(chunk) >= _BATCH:
                    break
            if chunk:
                self.done_in_file += len(chunk)
                outbox.offer_chunk(-1, chunk)
            if len(chunk) < _BATCH:
                self._records = None
                self.file_index += 1
                self.done_in_file = 0
        return False

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(BroadcastKey(("record-files", self.kind)),
                                             [self.file_index, self.done_in_file])

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for _, (index, done) in inbox.drain():
            self.file_index, self.done_in_file = index, done


class FilesSparkReader(SparkReader):
    """``Sources.files``, ``parquet`` and ``json_lines`` on the Spark backfill: the files
    listed on the driver before Spark starts (a wrong path fails there), read in order by
    runs of files, one run per task."""

    def __init__(self, pattern: str, kind: str, encoding: str = "utf-8") -> None:
        self.pattern, self.kind, self.encoding = pattern, kind, encoding

    def bounds(self, until: Any) -> list[str]:
        return matching_files(self.pattern, self.kind)

    def read(self, backfill: Any, t: Any, bounds: Any) -> StageOut:
        warn_if_no_files(self.pattern, self.kind, bounds)
        return backfill.file_runs(bounds, self.read_path)

    def read_path(self, path: str) -> Iterator[list]:
        """The chunks of one file: lines (``files``) or records."""
        if self.kind != "files":
            yield from chunked(read_records(path, self.kind))
            return
        with open(path, encoding=self.encoding) as f:
            while True:
                lines = [line.rstrip("\r\n") for line in f.readlines(1 << 18)]
                if not lines:
                    return
                yield lines
