"""Text files: a source of lines from files matching a glob, and a sink writing lines."""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

from ..engine.processor import BroadcastKey, Inbox, Processor, ProcessorContext

__all__ = ["FileSourceProcessor", "FileSinkProcessor"]

log = logging.getLogger("jetwake.connectors.files")

_READ_HINT = 1 << 16  # bytes per readlines() call


class FileSourceProcessor(Processor):
    """Emits the lines (without line endings) of its share of the matching files."""

    def __init__(self, pattern: str, encoding: str) -> None:
        self.pattern = pattern
        self.encoding = encoding
        self.files: list[str] = []
        self._current = None
        self._path = ""
        self._lines = 0   # lines of the current file emitted so far
        self._skip = 0    # lines to skip after a restore

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        matched = sorted(p for p in glob.glob(self.pattern) if os.path.isfile(p))
        if not matched and context.global_processor_index == 0:
            log.warning("Sources.files(%r): no file matches", self.pattern)
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
    """Writes ``str(item)`` lines to ``<directory>/<global processor index>``."""

    def __init__(self, directory: str, encoding: str) -> None:
        self.directory = directory
        self.encoding = encoding
        self._file: Any = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, str(context.global_processor_index))
        self._file = open(path, "w", encoding=self.encoding)

    def is_cooperative(self) -> bool:
        return False

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self._file.write("".join(f"{item}\n" for item in inbox.drain()))

    def complete(self) -> bool:
        self._file.flush()
        return True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
