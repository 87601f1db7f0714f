"""Sources of records in files: Parquet files (one dict per row) and JSON-lines files (one
value per line), read in file order by one processor (``Sources.parquet``,
``Sources.json_lines``).

Both read the matching files sorted by path, so the order of the records is the same in every
run, on a member and in the Spark backfill (``connectors/spark``), which reads the same files
with :func:`read_records`, one file per Spark task.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Iterator

from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext

__all__ = ["RecordFileSourceProcessor", "matching_files", "read_records"]

_BATCH = 4096


def matching_files(pattern: str, kind: str) -> list[str]:
    """The files ``pattern`` names, sorted: a directory means every file in it (a Parquet
    dataset is a directory), a glob every match."""
    if kind == "parquet" and os.path.isdir(pattern):
        return sorted(os.path.join(pattern, n) for n in os.listdir(pattern)
                      if not n.startswith((".", "_"))
                      and os.path.isfile(os.path.join(pattern, n)))
    return sorted(p for p in glob.glob(pattern) if os.path.isfile(p))


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
    """Emits the records of every matching file, in path order (one processor); its position
    (files done, records of the current file emitted) is saved in snapshots."""

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
