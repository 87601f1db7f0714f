"""Job records: what a member needs to run a job again after its process restarts.

``jobs/<job_id>/RECORD`` (JSON: id, name, status, config, times) and ``jobs/<job_id>/PIPELINE``
(the pipeline or DAG serialized with cloudpickle). These files are written only by the member
itself into its own data directory; bytes received from a client are never unpickled before
the client has authenticated.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import cloudpickle

from jetwake.snapshot.store.snapshot_store import write_atomically

__all__ = ["JobRecord", "JobRecords", "JobRecordStore", "JobRecordError"]

log = logging.getLogger("jetwake.jobs")


class JobRecordError(Exception):
    """A job record cannot be read; the message names the file and the fix."""


@dataclass
class JobRecord:
    job_id: str
    name: str
    status: str
    config: dict
    submission_time: float
    completion_time: float | None = None
    failure: str | None = None
    extra: dict = field(default_factory=dict)


class JobRecords(Protocol):
    """Where a member's job records and definitions are kept: its data directory
    (:class:`JobRecordStore`), or a cluster's records topic."""

    @property
    def persistent(self) -> bool:
        """Whether the records outlive the member's process."""

    def save(self, record: JobRecord, definition: Any | None = None) -> None:
        """Writes a job's record (and its definition, when given)."""

    def load_all(self) -> list[JobRecord]:
        """Every job's record."""

    def load_definition(self, job_id: str) -> Any:
        """A job's definition (a Pipeline or a DAG)."""

    def delete(self, job_id: str) -> None:
        """Forgets a job's record and definition."""


class JobRecordStore:
    """Job records under ``<root>/jobs`` (``root`` None: nothing is persisted)."""

    def __init__(self, root: str | None) -> None:
        self.root = root

    def _dir(self, job_id: str) -> str:
        return os.path.join(self.root, "jobs", job_id)  # type: ignore[arg-type]

    @property
    def persistent(self) -> bool:
        return self.root is not None

    def save(self, record: JobRecord, definition: Any | None = None) -> None:
        """Writes the record (and the pipeline, when given) atomically."""
        if self.root is None:
            return
        d = self._dir(record.job_id)
        os.makedirs(d, exist_ok=True)
        if definition is not None:
            write_atomically(os.path.join(d, "PIPELINE"), cloudpickle.dumps(definition))
        write_atomically(os.path.join(d, "RECORD"),
                         json.dumps(asdict(record), sort_keys=True, indent=1).encode())

    def load_all(self) -> list[JobRecord]:
        """Every readable record; an unreadable one is an error naming its file."""
        if self.root is None:
            return []
        base = os.path.join(self.root, "jobs")
        try:
            names = sorted(os.listdir(base))
        except FileNotFoundError:
            return []
        records = []
        for job_id in names:
            path = os.path.join(base, job_id, "RECORD")
            if not os.path.exists(path):
                continue  # snapshots of an export-only job, or a job being deleted
            try:
                with open(path) as f:
                    records.append(JobRecord(**json.load(f)))
            except (OSError, ValueError, TypeError) as e:
                raise JobRecordError(
                    f"the job record {path} is damaged ({e}); move the directory "
                    f"{os.path.dirname(path)} aside to start without that job") from e
        return records

    def load_definition(self, job_id: str) -> Any:
        path = os.path.join(self._dir(job_id), "PIPELINE")
        try:
            with open(path, "rb") as f:
                return cloudpickle.load(f)
        except FileNotFoundError as e:
            raise JobRecordError(f"the pipeline of job {job_id} is missing ({path})") from e
        except Exception as e:  # noqa: BLE001 - unpickling raises anything
            raise JobRecordError(
                f"the pipeline of job {job_id} cannot be loaded from {path}: {e!r}. The code it "
                "refers to (modules, functions) must be importable in this process") from e

    def delete(self, job_id: str) -> None:
        if self.root is not None:
            shutil.rmtree(self._dir(job_id), ignore_errors=True)
