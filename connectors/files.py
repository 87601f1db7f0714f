"""Text files: a source of the lines of files (a file, a directory's files or a glob's
matches, as ``record_files.matching_files`` lists them), and a sink writing lines."""

from __future__ import annotations

import os
from typing import Any, Iterator, TextIO

from jetwake.connectors.record_files import matching_files, warn_if_no_files
from jetwake.engine.core.processor import BroadcastKey, Inbox, Processor, ProcessorContext
from jetwake.engine.backfill.connector_forms import SparkWriter

__all__ = ["FileSourceProcessor", "FileSinkProcessor", "FilesSparkWriter"]

_READ_HINT = 1 << 16  # bytes per readlines() call


class FileSourceProcessor(Processor):
    """Emits the lines (without line endings) of its share of the matching files; a literal
    path that does not exist fails the job when it starts (``matching_files``)."""

    def __init__(self, pattern: str, encoding: str) -> None:
        self.pattern = pattern
        self.encoding = encoding
        self.files: list[str] = []
        self._current: TextIO | None = None
        self._path = ""
        self._lines = 0   # lines of the current file emitted so far
        self._skip = 0    # lines to skip after a restore

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        matched = matching_files(self.pattern, "files")
        if context.global_processor_index == 0:
            warn_if_no_files(self.pattern, "files", matched)
        self.files = matched[context.global_processor_index::context.total_parallelism]

    def complete(self) -> bool:
        outbox = self.outbox
        while outbox.has_room():
            if self._current is None:
                if not self.files:
                    return True
                path = self.files.pop(0)
                try:
                    self._current = open(path, encoding=self.encoding)
                except OSError as e:
                    raise OSError(f"Sources.files: cannot read {path}: {e}") from e
                self._path, self._lines = path, 0
            lines = self._current.readlines(_READ_HINT)
            if not lines:
                self._current.close()
                self._current = None
                continue
            self._lines += len(lines)
            if self._skip:
                skipped = min(self._skip, len(lines))
                lines = lines[skipped:]
                self._skip -= skipped
            if lines:
                outbox.offer_chunk(-1, [line.rstrip("\r\n") for line in lines])
        return False

    def save_to_snapshot(self) -> bool:
        # the files still to read and the position in the current one
        remaining = ([self._path] if self._current is not None else []) + self.files
        key = BroadcastKey(("files", self.context.global_processor_index))
        return self.outbox.offer_to_snapshot(
            key, [remaining, self._lines - self._skip if self._current is not None else 0])

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        mine = ("files", self.context.global_processor_index)
        for key, (remaining, lines_done) in inbox.drain():
            if key.key == mine:
                self.files = list(remaining)
                self._skip = lines_done

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None


class FileSinkProcessor(Processor):
    """Writes ``str(item)`` lines to ``<directory>/<global processor index>``.

    A snapshot saves the file's length (after a flush); a restore truncates the file back to
    that length and appends from there, so lines written after the snapshot are not written a
    second time by the replay. A job without snapshots starts the file afresh.
    """

    def __init__(self, directory: str, encoding: str) -> None:
        self.directory = directory
        self.encoding = encoding
        self._file: Any = None
        self._path = ""
        self._restored_length: int | None = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        os.makedirs(self.directory, exist_ok=True)
        self._path = os.path.join(self.directory, str(context.global_processor_index))

    def is_cooperative(self) -> bool:
        return False

    def _open(self) -> Any:
        if self._file is None:
            if self._restored_length is None:
                self._file = open(self._path, "w", encoding=self.encoding)
            else:
                size = os.path.getsize(self._path) if os.path.exists(self._path) else 0
                if size < self._restored_length:
                    raise OSError(
                        f"Sinks.files: {self._path} has {size} bytes but the snapshot being "
                        f"restored recorded {self._restored_length}: the file was truncated or "
                        "replaced outside the job; restore it or start the job afresh")
                os.truncate(self._path, self._restored_length)
                self._file = open(self._path, "a", encoding=self.encoding)
        return self._file

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self._open().write("".join(f"{item}\n" for item in inbox.drain()))

    def save_to_snapshot(self) -> bool:
        f = self._open()
        f.flush()
        length = os.fstat(f.fileno()).st_size
        key = BroadcastKey(("file-sink", self.context.global_processor_index))
        return self.outbox.offer_to_snapshot(key, length)

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        mine = ("file-sink", self.context.global_processor_index)
        for key, length in inbox.drain():
            if key.key == mine:
                self._restored_length = length

    def complete(self) -> bool:
        self._open().flush()
        return True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class FilesSparkWriter(SparkWriter):
    """``Sinks.files`` on the Spark backfill: each task writes ``str(item)`` lines into file
    ``<its index>`` of the directory."""

    def __init__(self, directory: str, encoding: str) -> None:
        self.directory, self.encoding = directory, encoding

    def write(self, backfill: Any, t: Any, chunks: Any) -> int:
        directory, encoding = self.directory, self.encoding
        os.makedirs(directory, exist_ok=True)
        # the files of an earlier run, which has had more tasks than this one writes, go:
        # the directory holds this run's output only
        for name in os.listdir(directory):
            if name.isdigit() and int(name) >= chunks.getNumPartitions():
                os.remove(os.path.join(directory, name))

        def write(i: int, it: Iterator) -> Iterator:
            n = 0
            with open(os.path.join(directory, str(i)), "w", encoding=encoding) as f:
                for chunk in it:
                    f.write("".join([f"{x}\n" for x in chunk]))
                    n += len(chunk)
            yield n
        return chunks.mapPartitionsWithIndex(write).sum()
