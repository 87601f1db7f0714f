"""The job records and definitions of a cluster's jobs, kept in the cluster's records topic
where every member can read them, so that a new coordinator resumes the jobs of the last."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import cloudpickle

from jetwake.engine.jobs.job_records import JobRecord

__all__ = ["ClusterJobRecords"]


class ClusterJobRecords:
    """Job records and definitions of a cluster's jobs, kept where every member can read them
    (the cluster's records topic), with the interface of a member's own JobRecordStore.

    Only the coordinator writes them (through its fenced producer)."""

    def __init__(self, records: Any) -> None:
        self.records = records

    @property
    def persistent(self) -> bool:
        return True

    def save(self, record: JobRecord, definition: Any | None = None) -> None:
        items = [(f"job/{record.job_id}",
                  json.dumps(asdict(record), sort_keys=True).encode())]
        if definition is not None:
            items.insert(0, (f"definition/{record.job_id}", cloudpickle.dumps(definition)))
        self.records.put_many(items)

    def load_all(self) -> list[JobRecord]:
        out = []
        for key, value in sorted(self.records.read_all().items()):
            if key.startswith("job/"):
                out.append(JobRecord(**json.loads(value)))
        return out

    def load_definition(self, job_id: str) -> Any:
        data = self.records.read_all().get(f"definition/{job_id}")
        if data is None:
            raise KeyError(f"the definition of job {job_id} is missing from the cluster's "
                           "records")
        return cloudpickle.loads(data)  # written by a coordinator of this cluster

    def delete(self, job_id: str) -> None:
        self.records.put_many([(f"job/{job_id}", None), (f"definition/{job_id}", None)])
