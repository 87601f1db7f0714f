"""The member service's view of its jobs' lifecycle: one log line per event, and how many
executions of each job have started (``jetwake restart`` waits for a new one)."""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["JobEvents"]

log = logging.getLogger("jetwake.service")

# events the coordinator logs itself ("started: N processors"), or that are steps of another
_QUIET = ("starting", "completing", "not_running", "suspended_exporting_snapshot")


class JobEvents:
    """A listener of a member's job events (``member.add_listener(events.on_event)``)."""

    def __init__(self, member: Any) -> None:
        self.member = member
        self._starts: dict[str, int] = {}  # job id -> executions started (RUNNING events)
        self._lock = threading.Lock()

    def starts(self, job_id: str) -> int:
        """Executions of the job started since this member process started."""
        with self._lock:
            return self._starts.get(job_id, 0)

    def on_event(self, job_id: str, job_name: str, event: str) -> None:
        if event == "running":
            with self._lock:
                self._starts[job_id] = self._starts.get(job_id, 0) + 1
            return  # the coordinator logs "started: N processors[, restored from ...]"
        if event in _QUIET:
            return
        who = f"job '{job_name}' ({job_id})"
        if event == "failed":
            c = self.member.find_coordinator(job_id)
            why = c.failure_text if c is not None else None
            if why and why.startswith("JobCancelledError"):
                log.info("%s cancelled", who)
            else:
                log.warning("%s failed: %s", who, why or "unknown reason")
        elif event == "suspended":
            c = self.member.find_coordinator(job_id)
            if c is not None and c.error is not None:
                log.warning("%s suspended on failure: %s", who, c.failure_text)
            else:
                log.info("%s suspended", who)
        else:
            log.info("%s %s", who, event)
