"""A member's snapshot store in a cluster: its own files first, the cluster's on demand.

Each member writes its part of a snapshot into its own data directory, then copies it to the
cluster's snapshot data topic; the coordinator's commit record lists where every member's part
is (``CommitRecord.data_refs``) and is written to the cluster's records. Reading a snapshot on
any member therefore first fetches the parts it does not have from Kafka (and keeps them), then
reads the files as a single member does. The committed snapshots of a job are those the
cluster's records hold, so a member that becomes coordinator finds the snapshots its
predecessor committed, and snapshot ids stay unique across coordinators.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Callable

from jetwake.engine.cluster.snapshot_data_topic import SnapshotDataMissingError, files_under
from jetwake.engine.core.errors import RestartableError
from jetwake.snapshot.store.snapshot_store import (
    COMMIT_FILE, CommitRecord, SnapshotDamagedError, SnapshotReader, SnapshotStore,
    write_atomically,
)

__all__ = ["ClusterSnapshotStore", "RecordsUnreachableError"]

log = logging.getLogger("jetwake.cluster")


class RecordsUnreachableError(RestartableError, OSError):
    """The cluster's records, which list the committed snapshots, could not be read. Nothing
    that depends on the newest committed snapshot may go on without them: a restore from what
    this member alone knows could pick an older snapshot than another coordinator committed,
    and write that snapshot's output again. Restartable: a start is tried again with back-off;
    an OSError: a snapshot that cannot take its id is skipped and the job runs on."""


class ClusterSnapshotStore(SnapshotStore):
    """See the module doc. ``data_topic`` is a SnapshotDataTopic, ``records`` ClusterRecords."""

    def __init__(self, root: str, data_topic: Any, records: Any, keep: int = 2) -> None:
        super().__init__(root, keep)
        self.data_topic = data_topic
        self.records = records
        #: called with a job id whose snapshots were all deleted (the job ended): the other
        #: members drop their parts of them too
        self.on_job_deleted: Callable[[str], None] | None = None

    def _directory(self, rec: CommitRecord) -> str:
        return self._export_dir(rec.name) if rec.name is not None \
            else self._snap_dir(rec.job_id, rec.snapshot_id)

    def fetch_parts(self, rec: CommitRecord) -> None:
        """Makes every member's part of ``rec`` present in this member's directory: files
        already there with the recorded size stay, the others are fetched."""
        directory = self._directory(rec)
        for member, refs in rec.data_refs.items():
            missing = {path: ref for path, ref in refs.items()
                       if not _present(os.path.join(directory, path), ref)}
            if not missing:
                continue
            try:
                self.data_topic.download(missing, directory)
            except SnapshotDataMissingError as e:  # its data is gone or differs: damaged
                raise SnapshotDamagedError(
                    f"snapshot {rec.snapshot_id} of job {rec.job_name}: the part of member "
                    f"{member} cannot be fetched ({e})") from e
            except Exception as e:  # noqa: BLE001 - Kafka not answering now: not damage
                # (a fallback past a snapshot taken for damaged could write output twice, or
                # suspend an exactly-once job for a broker that comes back in seconds)
                raise RecordsUnreachableError(
                    f"snapshot {rec.snapshot_id} of job {rec.job_name}: the part of member "
                    f"{member} could not be fetched from Kafka now ({e!r}); tried again once "
                    "Kafka answers") from e

    def reader(self, rec: CommitRecord) -> SnapshotReader:
        if rec.data_refs:
            self.fetch_parts(rec)
        return super().reader(rec)

    def export(self, rec: CommitRecord, name: str) -> CommitRecord:
        """Keeps a copy of ``rec`` under ``name`` here and in the cluster: the export's data is
        copied to the snapshot data topic under its own name (so pruning the job's snapshots
        never takes it away) and its record to the cluster's records."""
        if rec.data_refs:
            self.fetch_parts(rec)
            commit = os.path.join(self._directory(rec), COMMIT_FILE)
            if not os.path.exists(commit):  # a snapshot another coordinator committed
                write_atomically(commit, rec.to_json().encode())
        previous = self.get_export(name)
        exported = super().export(rec, name)
        directory = self._export_dir(name)
        paths = files_under(directory, [n for n in os.listdir(directory) if n != COMMIT_FILE])
        refs = self.data_topic.upload(directory, paths, _export_prefix(name)) if paths else {}
        exported.data_refs = {"export": refs}
        write_atomically(os.path.join(directory, COMMIT_FILE), exported.to_json().encode())
        self.records.put(f"export/{name}", exported.to_json().encode())
        if previous is not None and previous.data_refs.get("export"):
            self._delete_data(previous.data_refs["export"], _export_prefix(name))
        return exported

    def get_export(self, name: str) -> CommitRecord | None:
        found = super().get_export(name)
        if found is not None:
            return found
        value = self._stored().get(f"export/{name}")
        return CommitRecord.from_json(value.decode()) if value is not None else None

    def exports(self) -> list[CommitRecord]:
        found = {r.name: r for r in super().exports()}
        for key, value in self._stored().items():
            if key.startswith("export/") and key[len("export/"):] not in found:
                rec = CommitRecord.from_json(value.decode())
                found[rec.name] = rec
        return sorted(found.values(), key=lambda r: r.name or "")

    def delete_export(self, name: str) -> bool:
        rec = self.get_export(name)
        local = super().delete_export(name)
        if rec is None:
            return local
        self.records.put(f"export/{name}", None)
        if rec.data_refs.get("export"):
            self._delete_data(rec.data_refs["export"], _export_prefix(name))
        return True

    def prune(self, job_id: str) -> None:
        """Deletes snapshots beyond the newest ``keep``: their commit records and their data
        in the cluster, then what this member keeps of them."""
        try:
            older = self.committed(job_id)[self.keep:]
        except RecordsUnreachableError as e:  # old snapshots left are only clutter
            log.warning("pruning the snapshots of job %s: %s", job_id, e)
            older = []
        for rec in older:
            self._delete_snapshot(rec)
        super().prune(job_id)

    def remove_local_before(self, job_id: str, snapshot_id: int) -> None:
        """Drops this member's copies of the job's snapshots older than ``snapshot_id``."""
        base = os.path.join(self._job_dir(job_id), "snapshots")
        for entry in _entries(base):
            if entry.isdigit() and int(entry) < snapshot_id:
                shutil.rmtree(os.path.join(base, entry), ignore_errors=True)

    def remove_local_job(self, job_id: str) -> None:
        shutil.rmtree(self._job_dir(job_id), ignore_errors=True)

    def _delete_snapshot(self, rec: CommitRecord) -> None:
        try:
            self.records.put(f"commit/{rec.job_id}/{rec.snapshot_id}", None)
        except Exception as e:  # noqa: BLE001 - an old snapshot left is only clutter
            log.warning("removing the commit record of snapshot %d of job %s failed: %r",
                        rec.snapshot_id, rec.job_name, e)
            return
        for member, refs in rec.data_refs.items():
            self._delete_data(refs, f"{rec.job_id}/{rec.snapshot_id}/{member}")

    def _delete_data(self, refs: dict, prefix: str) -> None:
        try:
            self.data_topic.delete(refs, prefix)
        except Exception as e:  # noqa: BLE001 - compaction-eligible data left is clutter
            log.warning("removing snapshot data %s from Kafka failed: %r", prefix, e)

    def _stored(self) -> dict[str, bytes]:
        try:
            return self.records.read_all()
        except Exception as e:  # noqa: BLE001 - Kafka away: nothing to decide on
            raise RecordsUnreachableError(
                f"the cluster's records (the committed snapshots) could not be read: {e!r}; "
                "tried again once Kafka answers") from e

    def committed(self, job_id: str) -> list[CommitRecord]:
        """The job's committed snapshots, newest first: those in the cluster's records, and
        those committed here."""
        found = {r.snapshot_id: r for r in super().committed(job_id)}
        prefix = f"commit/{job_id}/"
        for key, value in self._stored().items():
            if key.startswith(prefix):
                try:
                    rec = CommitRecord.from_json(value.decode())
                except (ValueError, TypeError) as e:
                    log.warning("ignoring the commit record %s: unreadable (%s)", key, e)
                    continue
                found.setdefault(rec.snapshot_id, rec)
        return sorted(found.values(), key=lambda r: -r.snapshot_id)

    def next_snapshot_id(self, job_id: str) -> int:
        sid = super().next_snapshot_id(job_id)
        newest = max((r.snapshot_id for r in self.committed(job_id)), default=-1)
        while sid <= newest:  # a snapshot id another coordinator used is never taken again
            sid = super().next_snapshot_id(job_id)
        return sid

    def delete_job_snapshots(self, job_id: str) -> None:
        """Deletes every automatic snapshot of the job, in the cluster and here (named exports
        stay); the other members drop their copies through :attr:`on_job_deleted`."""
        try:
            recs = self.committed(job_id)
        except RecordsUnreachableError as e:  # what is left is only clutter
            log.warning("deleting the snapshots of job %s: %s", job_id, e)
            recs = super().committed(job_id)
        for rec in recs:
            self._delete_snapshot(rec)
        super().delete_job_snapshots(job_id)
        if self.on_job_deleted is not None:
            self.on_job_deleted(job_id)


def _export_prefix(name: str) -> str:
    return f"export/{name}"


def _entries(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _present(path: str, ref: list) -> bool:
    try:
        return os.path.getsize(path) == ref[3]
    except OSError:
        return False
