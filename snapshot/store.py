"""The snapshot store: snapshot data, commit records, retention and named exports.

Layout under the member's data directory::

    jobs/<job_id>/snapshots/<snapshot_id>/<vertex>/<processor>.bin   saved (key, value) pairs
    jobs/<job_id>/snapshots/<snapshot_id>/COMMIT                        the commit record
    jobs/<job_id>/next-snapshot-id                                      ids are never reused
    exports/<name>/...                                                  named snapshots

Data files are written first; the commit record is written last, atomically (write, fsync,
rename, fsync the directory): its presence is the commit point of the snapshot. A commit record
holds the entry count and CRC-32 of every data file, so a restore can tell a damaged snapshot
from a good one. Without a data directory the same store lives in memory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from ..engine.serialization import dumps, loads

__all__ = ["SnapshotStore", "CommitRecord", "SnapshotDamagedError", "SnapshotStoreError"]

log = logging.getLogger("jetwake.snapshot")

COMMIT_FILE = "COMMIT"


class SnapshotStoreError(Exception):
    """A snapshot cannot be read or written; the message says which and why."""


class SnapshotDamagedError(SnapshotStoreError):
    """A snapshot's data does not match its commit record."""


@dataclass
class CommitRecord:
    job_id: str
    job_name: str
    snapshot_id: int
    created: float
    duration_ms: float
    # vertex -> processor index (as str) -> [entry count, crc32, bytes]
    files: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    name: str | None = None  # set for exported snapshots
    terminal: bool = False

    @property
    def entry_count(self) -> int:
        return sum(f[0] for v in self.files.values() for f in v.values())

    @property
    def size_bytes(self) -> int:
        return sum(f[2] for v in self.files.values() for f in v.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CommitRecord":
        return cls(**json.loads(text))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes) -> None:
    """Replaces ``path`` with ``data`` so that a crash leaves the old or the new file."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or "/" in name or "\\" in name \
            or name in (".", ".."):
        raise ValueError(f"a snapshot name must be a non-empty string without path separators, "
                         f"got {name!r}")
    return name


class SnapshotWriter:
    """Collects one snapshot's data; ``commit()`` makes it the job's latest snapshot."""

    def __init__(self, store: "SnapshotStore", job_id: str, job_name: str,
                 snapshot_id: int, terminal: bool) -> None:
        self.store = store
        self.record = CommitRecord(job_id, job_name, snapshot_id, time.time(), 0.0,
                                   terminal=terminal)
        self._started = time.perf_counter()
        self._data: dict[tuple[str, int], list] = {}
        self._lock = threading.Lock()

    def add(self, vertex: str, processor: int, entries: list[tuple[Any, Any]]) -> None:
        with self._lock:
            self._data.setdefault((vertex, processor), []).extend(entries)

    def commit(self) -> CommitRecord:
        """Writes the data and then the commit record (the commit point)."""
        rec = self.record
        blobs: dict[str, dict[str, bytes]] = {}
        for (vertex, proc), entries in self._data.items():
            # two flat lists pack far faster than a list of (key, value) tuples
            data = dumps([[e[0] for e in entries], [e[1] for e in entries]])
            blobs.setdefault(vertex, {})[str(proc)] = data
            rec.files.setdefault(vertex, {})[str(proc)] = [len(entries), zlib.crc32(data),
                                                            len(data)]
        rec.duration_ms = (time.perf_counter() - self._started) * 1000
        self.store._write_snapshot(rec, blobs)
        return rec


class SnapshotStore:
    """Snapshots of every job of a member, on disk under ``root`` or in memory (None)."""

    def __init__(self, root: str | None, keep: int = 2) -> None:
        self.root = root
        self.keep = keep  # committed automatic snapshots kept per job: the latest and a spare
        self._mem: dict[tuple[str, Any], tuple[CommitRecord, dict[str, dict[str, bytes]]]] = {}
        self._mem_next: dict[str, int] = {}
        self._lock = threading.RLock()

    # --- paths -----------------------------------------------------------------------------

    def _job_dir(self, job_id: str) -> str:
        return os.path.join(self.root, "jobs", job_id)  # type: ignore[arg-type]

    def _snap_dir(self, job_id: str, sid: int) -> str:
        return os.path.join(self._job_dir(job_id), "snapshots", str(sid))

    def _export_dir(self, name: str) -> str:
        return os.path.join(self.root, "exports", name)  # type: ignore[arg-type]

    # --- writing ---------------------------------------------------------------------------

    def next_snapshot_id(self, job_id: str) -> int:
        """A new id for the job's next snapshot; ids are never reused, also across restarts."""
        with self._lock:
            if self.root is None:
                sid = self._mem_next.get(job_id, 0)
                self._mem_next[job_id] = sid + 1
                return sid
            path = os.path.join(self._job_dir(job_id), "next-snapshot-id")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                with open(path) as f:
                    sid = int(f.read().strip() or 0)
            except FileNotFoundError:
                sid = 0
            write_atomically(path, str(sid + 1).encode())
            return sid

    def writer(self, job_id: str, job_name: str, snapshot_id: int,
               terminal: bool = False) -> SnapshotWriter:
        return SnapshotWriter(self, job_id, job_name, snapshot_id, terminal)

    def _write_snapshot(self, rec: CommitRecord, blobs: dict[str, dict[str, bytes]]) -> None:
        if self.root is None:
            with self._lock:
                self._mem[(rec.job_id, rec.snapshot_id)] = (rec, blobs)
            return
        self._write_dir(self._snap_dir(rec.job_id, rec.snapshot_id), rec, blobs)

    @staticmethod
    def _write_dir(directory: str, rec: CommitRecord, blobs: dict[str, dict[str, bytes]]) -> None:
        if os.path.exists(directory):
            shutil.rmtree(directory)  # leftovers of an attempt that never committed
        for vertex, procs in blobs.items():
            vdir = os.path.join(directory, _safe(vertex))
            os.makedirs(vdir, exist_ok=True)
            for proc, data in procs.items():
                with open(os.path.join(vdir, f"{proc}.bin"), "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            _fsync_dir(vdir)
        os.makedirs(directory, exist_ok=True)
        write_atomically(os.path.join(directory, COMMIT_FILE), rec.to_json().encode())

    # --- reading ---------------------------------------------------------------------------

    def committed(self, job_id: str) -> list[CommitRecord]:
        """The job's committed automatic snapshots, newest first."""
        if self.root is None:
            with self._lock:
                recs = [r for (j, _), (r, _) in self._mem.items() if j == job_id]
            return sorted(recs, key=lambda r: -r.snapshot_id)
        base = os.path.join(self._job_dir(job_id), "snapshots")
        recs = []
        for entry in _listdir(base):
            rec = self._read_record(os.path.join(base, entry))
            if rec is not None:
                recs.append(rec)
        return sorted(recs, key=lambda r: -r.snapshot_id)

    def latest(self, job_id: str) -> CommitRecord | None:
        recs = self.committed(job_id)
        return recs[0] if recs else None

    @staticmethod
    def _read_record(directory: str) -> CommitRecord | None:
        try:
            with open(os.path.join(directory, COMMIT_FILE)) as f:
                return CommitRecord.from_json(f.read())
        except FileNotFoundError:
            return None  # never committed: not a snapshot
        except (ValueError, TypeError) as e:
            log.warning("ignoring snapshot %s: its commit record is unreadable (%s)",
                        directory, e)
            return None

    def read(self, rec: CommitRecord) -> dict[str, list[tuple[Any, Any]]]:
        """Every saved entry per vertex; raises SnapshotDamagedError if data is damaged."""
        if rec.name is not None:
            blobs = self._load_blobs(self._export_dir(rec.name) if self.root else None, rec,
                                     ("export", rec.name))
        else:
            blobs = self._load_blobs(self._snap_dir(rec.job_id, rec.snapshot_id) if self.root
                                     else None, rec, (rec.job_id, rec.snapshot_id))
        out: dict[str, list[tuple[Any, Any]]] = {}
        for vertex, procs in rec.files.items():
            entries: list = out.setdefault(vertex, [])
            for proc, (count, crc, _size) in procs.items():
                data = blobs.get(vertex, {}).get(proc)
                where = f"snapshot {rec.snapshot_id} of job {rec.job_name}, {vertex}/{proc}"
                if data is None:
                    raise SnapshotDamagedError(f"{where}: data file missing")
                if zlib.crc32(data) != crc:
                    raise SnapshotDamagedError(f"{where}: checksum mismatch")
                try:
                    keys, values = loads(data)
                except Exception as e:  # noqa: BLE001
                    raise SnapshotDamagedError(f"{where}: undecodable ({e})") from e
                if len(keys) != count or len(values) != count:
                    raise SnapshotDamagedError(
                        f"{where}: {len(keys)} entries, the commit record says {count}")
                entries.extend(zip(keys, values))
        return out

    def _load_blobs(self, directory: str | None, rec: CommitRecord,
                    mem_key: tuple) -> dict[str, dict[str, bytes]]:
        if self.root is None:
            with self._lock:
                found = self._mem.get(mem_key)
            if found is None:
                raise SnapshotDamagedError(f"snapshot {rec.snapshot_id} of job {rec.job_name} "
                                           "is gone")
            return found[1]
        blobs: dict[str, dict[str, bytes]] = {}
        for vertex, procs in rec.files.items():
            for proc in procs:
                path = os.path.join(directory, _safe(vertex), f"{proc}.bin")  # type: ignore
                try:
                    with open(path, "rb") as f:
                        blobs.setdefault(vertex, {})[proc] = f.read()
                except FileNotFoundError:
                    pass
        return blobs

    # --- retention -------------------------------------------------------------------------

    def prune(self, job_id: str) -> None:
        """Deletes automatic snapshots beyond the newest ``keep`` and uncommitted leftovers."""
        recs = self.committed(job_id)
        keep_ids = {r.snapshot_id for r in recs[: self.keep]}
        if self.root is None:
            with self._lock:
                for key in [k for k in self._mem if k[0] == job_id and k[1] not in keep_ids]:
                    del self._mem[key]
            return
        newest = max(keep_ids, default=-1)
        base = os.path.join(self._job_dir(job_id), "snapshots")
        for entry in _listdir(base):
            if not entry.isdigit():
                continue
            sid = int(entry)
            # an uncommitted directory newer than the newest commit may be in progress
            if sid not in keep_ids and (sid < newest or
                                        self._read_record(os.path.join(base, entry))):
                shutil.rmtree(os.path.join(base, entry), ignore_errors=True)

    def delete_job_snapshots(self, job_id: str) -> None:
        """Deletes the job's automatic snapshots (named exports stay)."""
        if self.root is None:
            with self._lock:
                for key in [k for k in self._mem if k[0] == job_id]:
                    del self._mem[key]
            return
        shutil.rmtree(os.path.join(self._job_dir(job_id), "snapshots"), ignore_errors=True)

    # --- named exports ---------------------------------------------------------------------

    def export(self, rec: CommitRecord, name: str) -> CommitRecord:
        """Keeps a copy of a committed snapshot under ``name`` until deleted (replacing an
        export of the same name)."""
        _check_name(name)
        blobs = self._load_blobs(
            self._snap_dir(rec.job_id, rec.snapshot_id) if self.root else None, rec,
            (rec.job_id, rec.snapshot_id))
        exported = CommitRecord(**{**asdict(rec), "name": name})
        if self.root is None:
            with self._lock:
                self._mem[("export", name)] = (exported, blobs)
            return exported
        tmp = self._export_dir(name) + ".new"
        self._write_dir(tmp, exported, blobs)
        final = self._export_dir(name)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        return exported

    def get_export(self, name: str) -> CommitRecord | None:
        _check_name(name)
        if self.root is None:
            with self._lock:
                found = self._mem.get(("export", name))
            return found[0] if found else None
        return self._read_record(self._export_dir(name))

    def exports(self) -> list[CommitRecord]:
        if self.root is None:
            with self._lock:
                return sorted((r for (k, _), (r, _) in self._mem.items() if k == "export"),
                              key=lambda r: r.name or "")
        base = os.path.join(self.root, "exports")
        recs = [self._read_record(os.path.join(base, n)) for n in _listdir(base)
                if not n.endswith(".new")]
        return sorted((r for r in recs if r is not None), key=lambda r: r.name or "")

    def delete_export(self, name: str) -> bool:
        _check_name(name)
        if self.root is None:
            with self._lock:
                return self._mem.pop(("export", name), None) is not None
        path = self._export_dir(name)
        if not os.path.isdir(path):
            return False
        shutil.rmtree(path)
        return True


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _safe(vertex: str) -> str:
    """A vertex name as a directory name."""
    return vertex.replace("/", "%2F").replace("\\", "%5C")

