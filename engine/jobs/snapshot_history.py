"""The outcomes of a job's latest snapshots, as an operator looks at them.

The job coordinator keeps only its last good snapshot and a failure count; to see *which*
snapshot failed, at which phase and why, or how long snapshots take lately, it also records
each attempt here: id, start time, duration, size, the phase reached and the failure cause.
The history is bounded (the newest :data:`SNAPSHOT_HISTORY` attempts) and kept in memory only:
it describes this coordinator's run, not the job's whole life.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Literal

from jetwake.engine.core.errors import SnapshotWriteError

__all__ = ["SNAPSHOT_HISTORY", "SnapshotHistory", "SnapshotAttempt"]

#: how many snapshot outcomes a job keeps
SNAPSHOT_HISTORY = 50


class SnapshotHistory:
    """The newest :data:`SNAPSHOT_HISTORY` snapshot attempts of one job, oldest first."""

    def __init__(self, size: int = SNAPSHOT_HISTORY) -> None:
        self._entries: collections.deque[dict] = collections.deque(maxlen=size)
        self._lock = threading.Lock()

    def attempt(self, terminal: bool) -> "SnapshotAttempt":
        """A new attempt; enter it around the snapshot's steps (see :class:`SnapshotAttempt`)."""
        return SnapshotAttempt(self, terminal)

    def _add(self, entry: dict) -> None:
        with self._lock:
            self._entries.append(entry)

    def entries(self) -> list[dict]:
        """Copies of the entries, oldest first (an attempt in progress is the last one)."""
        with self._lock:
            return [dict(e) for e in self._entries]

    def __len__(self) -> int:
        return len(self._entries)


class SnapshotAttempt:
    """One snapshot attempt: ``reached(phase, ...)`` at the end of each step, and a context
    manager that records how it ended. An attempt that never took an id (the job had no
    execution to snapshot) is not recorded; one whose id could not be taken (a full disk) is.

    Phases, in order: ``started`` (id taken), ``phase 1`` (every processor saved its state),
    ``committed`` (the commit record is written), ``phase 2`` (every processor committed),
    ``done`` (older snapshots pruned). ``outcome`` is ``in progress``, ``committed`` or
    ``failed``; ``failure`` is the cause's text."""

    def __init__(self, history: SnapshotHistory, terminal: bool) -> None:
        self._history = history
        self._t0 = time.monotonic()
        self._recorded = False
        self.entry: dict[str, Any] = {
            "id": None, "terminal": terminal, "started": time.time(), "duration_ms": None,
            "size_bytes": None, "entries": None, "phase": "not started",
            "outcome": "in progress", "failure": None}

    def reached(self, phase: str, **values: Any) -> None:
        """The attempt completed ``phase`` (with ``id``, ``size_bytes``... when known)."""
        self.entry.update(values, phase=phase)
        if not self._recorded and self.entry["id"] is not None:
            self._recorded = True
            self._history._add(self.entry)

    def __enter__(self) -> "SnapshotAttempt":
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        e = self.entry
        if not self._recorded and not isinstance(exc, SnapshotWriteError):
            return False  # no snapshot was started
        e["outcome"] = "committed" if e["size_bytes"] is not None else "failed"
        if exc is not None:
            e["failure"] = f"{type(exc).__name__}: {exc}"
        if e["duration_ms"] is None:
            e["duration_ms"] = round((time.monotonic() - self._t0) * 1000, 1)
        if not self._recorded:
            self._recorded = True
            self._history._add(e)
        return False
