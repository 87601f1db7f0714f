"""The snapshot store: snapshot data, commit records, retention and named exports.

Layout under the member's data directory::

    jobs/<job_id>/snapshots/<snapshot_id>/<vertex>/<processor>.bin   saved entries, in frames
    jobs/<job_id>/snapshots/<snapshot_id>/<vertex>/<processor>.files/ files saved as values
    jobs/<job_id>/snapshots/<snapshot_id>/COMMIT                        the commit record
    jobs/<job_id>/next-snapshot-id                                      ids are never reused
    jobs/<job_id>/staging/                                              final state of finished
                                                                        processors (see below)
    exports/<name>/...                                                  named snapshots

**A snapshot is a true cut.** Entries are serialized the moment a processor offers them, on the
processor's own thread, and appended to that processor's data file at once; nothing keeps a
reference to live state until the commit. State that a processor changes in place after its
barrier can therefore never leak into the snapshot, and a snapshot needs memory for one chunk of
entries, not for the whole state. A data file is a sequence of frames: a 4-byte big-endian
length, then one msgpack chunk ``[[key, ...], [value, ...]]``.

A value of type :class:`~jetwake.snapshot.store.snapshot_files.SnapshotFiles` (for example a RocksDB
checkpoint) is not serialized: its files are hard-linked into ``<processor>.files/<n>/`` at the
same moment and the entry keeps their manifest; a restore hands the processor a
``SnapshotFiles`` that points into the snapshot (read-only).

The commit record is written last, atomically (write, fsync, rename, fsync the directory): its
presence is the commit point of the snapshot. It holds the entry count, CRC-32 and size of every
data file, so a restore can tell a damaged snapshot from a good one. A snapshot that fails
before its commit point is removed. Without a data directory the same store lives in memory.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import struct
import threading
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO, Iterable, Iterator

from jetwake.engine.core.serialization import SerializationError, dumps, loads, register_type
from jetwake.snapshot.store.snapshot_files import SnapshotFiles, load_files, save_files

__all__ = ["SnapshotStore", "SnapshotWriter", "SnapshotReader", "CommitRecord",
           "SnapshotDamagedError", "SnapshotStoreError", "SavedFilesRef", "write_atomically",
           "encode_frame", "vertex_dir_name"]

log = logging.getLogger("jetwake.snapshot")

COMMIT_FILE = "COMMIT"
FORMAT_FRAMED = 2  # frames of chunks; format 1 was one [[keys], [values]] blob per file
_FRAME = struct.Struct(">I")
_FILES_REF_TYPE_ID = 4


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
    format: int = 1  # records written before the framed format have no such field
    # vertex -> global indices of its processors that had completed, and vertex -> its
    # processor count: a vertex all of whose processors completed is not run again on restore
    completed: dict[str, list[int]] = field(default_factory=dict)
    parallelism: dict[str, int] = field(default_factory=dict)
    # in a cluster: where each member's part of the data is kept for every member to read
    # (member id -> {relative path: location}); empty for a snapshot of one member
    data_refs: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    # vertex -> the kind of stage it belongs to (Vertex.kind), for every vertex of the job's
    # DAG that has one: a job started from this snapshot takes over a vertex's state only
    # when its vertex of that name is of the same kind; empty in records written before
    kinds: dict[str, str] = field(default_factory=dict)
    # vertex -> what its saved state's form depends on besides its kind (Vertex.shape:
    # keyed or keyless, a window's definition), for the vertices that have one
    shapes: dict[str, str] = field(default_factory=dict)

    def vertex_completed(self, vertex: str) -> bool:
        """Whether every processor of ``vertex`` had completed when this snapshot was taken."""
        total = self.parallelism.get(vertex, 0)
        return bool(total) and len(set(self.completed.get(vertex, ()))) >= total

    @property
    def entry_count(self) -> int:
        return sum(f[0] for v in self.files.values() for f in v.values())

    @property
    def size_bytes(self) -> int:
        return sum(f[2] for v in self.files.values() for f in v.values())

    def merge_part(self, part: "CommitRecord", member_id: str, refs: dict[str, list[Any]]) -> None:
        """Adds one member's part of a cluster-wide snapshot: its files, the processors that
        had completed, the parallelism, and where its data is kept (``refs``)."""
        for vertex, procs in part.files.items():
            self.files.setdefault(vertex, {}).update(procs)
        for vertex, indices in part.completed.items():
            self.completed[vertex] = sorted(set(self.completed.get(vertex, ())) | set(indices))
        self.parallelism.update(part.parallelism)
        if refs:  # a member whose part is read where it was written needs none
            self.data_refs[member_id] = refs

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CommitRecord":
        fields = json.loads(text)
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in fields.items() if k in known})


class SavedFilesRef:
    """The serialized stand-in of a SnapshotFiles value: where its files are, relative to the
    snapshot's directory, and their manifest."""

    __slots__ = ("path", "manifest")

    def __init__(self, path: str, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest


register_type(_FILES_REF_TYPE_ID, SavedFilesRef, lambda r: [r.path, r.manifest],
              lambda v: SavedFilesRef(v[0], v[1]))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes) -> None:
    """Replaces ``path`` with ``data`` so that a crash leaves the old or the new file; a failed
    write (a full disk, say) leaves no temporary file behind."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(os.path.dirname(path) or ".")


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or "/" in name or "\\" in name \
            or name in (".", ".."):
        raise ValueError(f"a snapshot name must be a non-empty string without path separators, "
                         f"got {name!r}")
    return name


def _link_tree(src: str, dest: str) -> None:
    """Copies a directory of immutable files as hard links (a real copy across devices)."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dest, copy_function=link)


class _Stream:
    """One processor's data file of one snapshot: frames appended as entries are offered."""

    __slots__ = ("file", "buffer", "count", "crc", "size", "files_saved")

    def __init__(self, file: BinaryIO | None) -> None:
        self.file = file
        self.buffer = bytearray() if file is None else None
        self.count = 0
        self.crc = 0
        self.size = 0
        self.files_saved = 0

    def append(self, frame: bytes, count: int, head: bytes = b"") -> None:
        """Appends ``head`` then ``frame`` (a frame's length prefix apart from its body saves
        a copy of the body, which for a sink's saved output is megabytes)."""
        for part in (head, frame):
            if not part:
                continue
            if self.file is not None:
                self.file.write(part)
            else:
                assert self.buffer is not None  # a stream without a file has a buffer
                self.buffer += part
            self.crc = zlib.crc32(part, self.crc)
            self.size += len(part)
        self.count += count


def encode_frame(keys: list[Any], values: list[Any]) -> bytes:
    """One chunk of entries as a length-prefixed frame."""
    blob = dumps([keys, values])
    return _FRAME.pack(len(blob)) + blob


class SnapshotWriter:
    """One snapshot being written. ``add`` serializes and appends at once (thread-safe, one
    stream per processor); ``commit()`` makes it the job's latest snapshot; ``abort()`` removes
    what was written.

    An OSError while writing (a full disk, say) does not reach the processor that offered the
    entries: it is kept in :attr:`error` and fails this snapshot at ``commit()``.
    """

    def __init__(self, store: "SnapshotStore", job_id: str, job_name: str,
                 snapshot_id: int, terminal: bool) -> None:
        self.store = store
        self.record = CommitRecord(job_id, job_name, snapshot_id, time.time(), 0.0,
                                   terminal=terminal, format=FORMAT_FRAMED)
        self.directory = store._snap_dir(job_id, snapshot_id) if store.root else None
        self.error: OSError | None = None
        self._started = time.perf_counter()
        self._streams: dict[tuple[str, int], _Stream] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _stream(self, vertex: str, processor: int) -> _Stream:
        key = (vertex, processor)
        stream = self._streams.get(key)
        if stream is None:
            file = None
            if self.directory is not None:
                vdir = os.path.join(self.directory, vertex_dir_name(vertex))
                os.makedirs(vdir, exist_ok=True)
                file = open(os.path.join(vdir, f"{processor}.bin"), "wb")
            stream = self._streams[key] = _Stream(file)
        return stream

    def add(self, vertex: str, processor: int, entries: list[tuple[Any, Any]]) -> None:
        """Serializes ``entries`` now and appends them to the processor's data file.

        Raises :class:`SerializationError` when an entry cannot be serialized (the state of the
        job cannot be saved: the caller fails the job)."""
        if not entries or self.error is not None:
            return
        keys = [e[0] for e in entries]
        values = [e[1] for e in entries]
        with self._lock:
            if self._closed:
                return  # the snapshot already failed or committed without this processor
            try:
                stream = self._stream(vertex, processor)
                if any(type(v) is SnapshotFiles for v in values):
                    values = [self._save_files(v, vertex, processor, stream)
                              if type(v) is SnapshotFiles else v for v in values]
                body = dumps([keys, values])
                stream.append(body, len(entries), _FRAME.pack(len(body)))
            except OSError as e:
                self.error = e

    def add_encoded(self, vertex: str, processor: int, frame: bytes, count: int,
                    attachments: Iterable[tuple[str, str]] = ()) -> None:
        """Appends a frame encoded earlier (a finished processor's final state), linking the
        files it refers to from their staging directories (``(relative path, source)``)."""
        if self.error is not None:
            return
        with self._lock:
            if self._closed:
                return
            try:
                stream = self._stream(vertex, processor)
                for rel, src in attachments:
                    if self.directory is None:
                        raise SnapshotStoreError("files in snapshot state need a data directory")
                    dest = os.path.join(self.directory, rel)
                    if not os.path.exists(dest):
                        _link_tree(src, dest)
                stream.append(frame, count)
            except OSError as e:
                self.error = e

    def _save_files(self, value: Any, vertex: str, processor: int, stream: _Stream) -> SavedFilesRef:
        if self.directory is None:
            raise SnapshotStoreError(
                f"{vertex}#{processor} saves files in its snapshot state, which needs a member "
                "with a data directory: Member(data_dir=...)")
        rel = os.path.join(vertex_dir_name(vertex), f"{processor}.files", str(stream.files_saved))
        stream.files_saved += 1
        manifest = save_files(value, os.path.join(self.directory, rel))
        return SavedFilesRef(rel, manifest)

    def _close_streams(self) -> None:
        """Closes every data file; a close that fails (buffered data on a full disk) does not
        keep the others open: the snapshot is already failed or about to be removed."""
        self._closed = True
        for stream in self._streams.values():
            if stream.file is not None and not stream.file.closed:
                try:
                    stream.file.close()
                except OSError as e:
                    if self.error is None:
                        self.error = e

    def commit(self) -> CommitRecord:
        """Syncs the data and writes the commit record (the commit point); raises the first
        write error (the snapshot then did not happen)."""
        with self._lock:
            rec, blobs = self._sync()
            if self.directory is None:
                self.store._put_memory(rec, blobs)
                return rec
            write_atomically(os.path.join(self.directory, COMMIT_FILE), rec.to_json().encode())
            return rec

    def finish_part(self) -> CommitRecord:
        """Syncs this member's part of a snapshot and returns its record, without a commit
        point: the job's coordinator merges the parts of every member
        (:meth:`CommitRecord.merge_part`) and commits the whole
        (:meth:`SnapshotStore.commit_record`). In memory the part's data waits in the store
        for that commit. Raises the first write error."""
        with self._lock:
            rec, blobs = self._sync()
            if self.directory is None:
                self.store.stage_memory(rec, blobs)
            return rec

    def _sync(self) -> tuple[CommitRecord, dict[str, dict[str, bytes]]]:
        if self.error is not None:
            self._close_streams()
            raise self.error
        rec = self.record
        blobs: dict[str, dict[str, bytes]] = {}
        try:
            for (vertex, proc), stream in self._streams.items():
                if stream.file is not None:
                    stream.file.flush()
                    os.fsync(stream.file.fileno())
                else:
                    assert stream.buffer is not None  # a stream without a file has a buffer
                    blobs.setdefault(vertex, {})[str(proc)] = bytes(stream.buffer)
                rec.files.setdefault(vertex, {})[str(proc)] = [stream.count, stream.crc,
                                                                stream.size]
        finally:
            self._close_streams()
        rec.duration_ms = (time.perf_counter() - self._started) * 1000
        if self.directory is not None:
            os.makedirs(self.directory, exist_ok=True)
            for vertex in {v for v, _ in self._streams}:
                _fsync_dir(os.path.join(self.directory, vertex_dir_name(vertex)))
        return rec, blobs

    def abort(self) -> None:
        """Drops everything written for this snapshot (it never committed)."""
        with self._lock:
            self._close_streams()
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
            else:
                self.store.drop_staged_memory(self.record.job_id, self.record.snapshot_id)


def _iter_frames(data: BinaryIO, fmt: int) -> Iterator[tuple[list[Any], list[Any]]]:
    if fmt < FORMAT_FRAMED:
        keys, values = loads(data.read())
        yield keys, values
        return
    while True:
        head = data.read(_FRAME.size)
        if not head:
            return
        if len(head) < _FRAME.size:
            raise SerializationError("a frame header is cut short")
        (length,) = _FRAME.unpack(head)
        blob = data.read(length)
        if len(blob) < length:
            raise SerializationError(f"a frame of {length} bytes is cut short at {len(blob)}")
        keys, values = loads(blob)
        if len(keys) != len(values):
            raise SerializationError(f"a frame holds {len(keys)} keys and {len(values)} values")
        yield keys, values


class SnapshotReader:
    """Reads one committed snapshot chunk by chunk, so a restore needs memory for a chunk.

    :meth:`verify` checks every data file against the commit record (size and CRC-32) without
    decoding; :meth:`chunks` then decodes, and raises :class:`SnapshotDamagedError` if a file
    does not decode or holds another number of entries than the record says.
    """

    def __init__(self, store: "SnapshotStore", rec: CommitRecord) -> None:
        self.store = store
        self.record = rec
        if rec.name is not None:
            self.directory = store._export_dir(rec.name) if store.root else None
            self._mem_key: tuple[str, Any] = ("export", rec.name)
        else:
            self.directory = store._snap_dir(rec.job_id, rec.snapshot_id) if store.root else None
            self._mem_key = (rec.job_id, rec.snapshot_id)

    def _where(self, vertex: str, proc: str) -> str:
        r = self.record
        return f"snapshot {r.snapshot_id} of job {r.job_name}, {vertex}/{proc}"

    def _open(self, vertex: str, proc: str) -> BinaryIO:
        if self.directory is None:
            found = self.store._get_memory(self._mem_key)
            data = found[1].get(vertex, {}).get(proc) if found else None
            if data is None:
                raise SnapshotDamagedError(f"{self._where(vertex, proc)}: data missing")
            return io.BytesIO(data)
        path = os.path.join(self.directory, vertex_dir_name(vertex), f"{proc}.bin")
        try:
            return open(path, "rb")
        except FileNotFoundError:
            raise SnapshotDamagedError(f"{self._where(vertex, proc)}: data file missing") \
                from None

    def verify(self) -> None:
        """Raises SnapshotDamagedError if a data file is missing or differs from the record."""
        for vertex, procs in self.record.files.items():
            for proc, (_count, crc, size) in procs.items():
                with self._open(vertex, proc) as f:
                    actual, n = 0, 0
                    while True:
                        block = f.read(1 << 20)
                        if not block:
                            break
                        actual = zlib.crc32(block, actual)
                        n += len(block)
                if n != size or actual != crc:
                    raise SnapshotDamagedError(f"{self._where(vertex, proc)}: checksum mismatch")

    def vertices(self) -> list[str]:
        return list(self.record.files)

    def chunks(self, vertex: str) -> Iterator[tuple[list[Any], list[Any]]]:
        """(keys, values) chunks of every processor of ``vertex``, in the order saved."""
        for proc, (count, _crc, _size) in self.record.files.get(vertex, {}).items():
            seen = 0
            where = self._where(vertex, proc)
            with self._open(vertex, proc) as f:
                try:
                    for keys, values in _iter_frames(f, self.record.format):
                        seen += len(keys)
                        yield keys, self._resolve_files(values)
                except (SerializationError, ValueError, TypeError) as e:
                    raise SnapshotDamagedError(f"{where}: undecodable ({e})") from e
            if seen != count:
                raise SnapshotDamagedError(f"{where}: {seen} entries, the commit record says "
                                           f"{count}")

    def _resolve_files(self, values: list[Any]) -> list[Any]:
        if not any(type(v) is SavedFilesRef for v in values):
            return values
        out = []
        for v in values:
            if type(v) is SavedFilesRef:
                if self.directory is None:
                    raise SnapshotDamagedError("files in a snapshot kept in memory")
                try:
                    v = load_files(v.manifest, os.path.join(self.directory, v.path))
                except ValueError as e:
                    raise SnapshotDamagedError(f"snapshot {self.record.snapshot_id} of job "
                                               f"{self.record.job_name}: {e}") from e
            out.append(v)
        return out


class SnapshotStore:
    """Snapshots of every job of a member, on disk under ``root`` or in memory (None)."""

    def __init__(self, root: str | None, keep: int = 2) -> None:
        self.root = root
        self.keep = keep  # committed automatic snapshots kept per job: the latest and a spare
        self._mem: dict[tuple[str, Any], tuple[CommitRecord, dict[str, dict[str, bytes]]]] = {}
        self._mem_next: dict[str, int] = {}
        # parts of in-memory snapshots written but not committed yet: (job id, id) -> data
        self._mem_staged: dict[tuple[str, int], dict[str, dict[str, bytes]]] = {}
        self._lock = threading.RLock()

    # --- paths -----------------------------------------------------------------------------

    def _disk_root(self) -> str:
        """The root folder, for the paths below: only a store on disk has them."""
        assert self.root is not None, "a snapshot store in memory has no files"
        return self.root

    def _job_dir(self, job_id: str) -> str:
        return os.path.join(self._disk_root(), "jobs", job_id)

    def _snap_dir(self, job_id: str, sid: int) -> str:
        return os.path.join(self._job_dir(job_id), "snapshots", str(sid))

    def _export_dir(self, name: str) -> str:
        return os.path.join(self._disk_root(), "exports", name)

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

    def staging_dir(self, job_id: str, execution: int) -> str | None:
        """Where an execution keeps files of finished processors' final state (None in memory);
        removed with :meth:`remove_staging`."""
        if self.root is None:
            return None
        return os.path.join(self._job_dir(job_id), "staging", str(execution))

    def remove_staging(self, job_id: str) -> None:
        if self.root is not None:
            shutil.rmtree(os.path.join(self._job_dir(job_id), "staging"), ignore_errors=True)

    def _put_memory(self, rec: CommitRecord, blobs: dict[str, dict[str, bytes]]) -> None:
        with self._lock:
            self._mem[(rec.job_id, rec.snapshot_id)] = (rec, blobs)

    def stage_memory(self, part: CommitRecord, blobs: dict[str, dict[str, bytes]]) -> None:
        """Keeps an in-memory snapshot part's data until :meth:`commit_record` commits it."""
        with self._lock:
            staged = self._mem_staged.setdefault((part.job_id, part.snapshot_id), {})
            for vertex, procs in blobs.items():
                staged.setdefault(vertex, {}).update(procs)

    def drop_staged_memory(self, job_id: str, snapshot_id: int) -> None:
        """Drops an in-memory snapshot part that will not be committed."""
        with self._lock:
            self._mem_staged.pop((job_id, snapshot_id), None)

    def commit_record(self, rec: CommitRecord) -> None:
        """Writes the commit record of a snapshot whose parts are written: the commit point
        (on disk next to the data; in memory the staged parts become the snapshot)."""
        if self.root is None:
            with self._lock:
                blobs = self._mem_staged.pop((rec.job_id, rec.snapshot_id), {})
                self._mem[(rec.job_id, rec.snapshot_id)] = (rec, blobs)
            return
        directory = self._snap_dir(rec.job_id, rec.snapshot_id)
        os.makedirs(directory, exist_ok=True)
        write_atomically(os.path.join(directory, COMMIT_FILE), rec.to_json().encode())

    def _get_memory(self, key: tuple[str, Any]
                    ) -> tuple[CommitRecord, dict[str, dict[str, bytes]]] | None:
        with self._lock:
            return self._mem.get(key)

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

    def reader(self, rec: CommitRecord) -> SnapshotReader:
        """A reader of ``rec``'s data, chunk by chunk."""
        return SnapshotReader(self, rec)

    def read(self, rec: CommitRecord) -> dict[str, list[tuple[Any, Any]]]:
        """Every saved entry per vertex, all in memory (for tools and tests; a restore streams
        through :meth:`reader`); raises SnapshotDamagedError if data is damaged."""
        reader = self.reader(rec)
        reader.verify()
        out: dict[str, list[tuple[Any, Any]]] = {}
        for vertex in reader.vertices():
            entries = out.setdefault(vertex, [])
            for keys, values in reader.chunks(vertex):
                entries.extend(zip(keys, values))
        return out

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

    def remove_local_before(self, job_id: str, snapshot_id: int) -> None:
        """Drops this member's local copies of the job's snapshots older than
        ``snapshot_id``, once a newer one committed. A store whose snapshots are only its own
        has no copies besides the snapshots themselves, which :meth:`prune` keeps in check."""

    def remove_local_job(self, job_id: str) -> None:
        """Drops this member's local copies of a job's snapshots once the job ended for good
        (see :meth:`remove_local_before`)."""

    def delete_job_snapshots(self, job_id: str) -> None:
        """Deletes the job's automatic snapshots (named exports stay)."""
        if self.root is None:
            with self._lock:
                for key in [k for k in self._mem if k[0] == job_id]:
                    del self._mem[key]
                for key in [k for k in self._mem_staged if k[0] == job_id]:
                    del self._mem_staged[key]
            return
        shutil.rmtree(os.path.join(self._job_dir(job_id), "snapshots"), ignore_errors=True)

    # --- named exports ---------------------------------------------------------------------

    def export(self, rec: CommitRecord, name: str) -> CommitRecord:
        """Keeps a copy of a committed snapshot under ``name`` until deleted (replacing an
        export of the same name). On disk the copy is made of hard links: committed data
        files are never changed."""
        _check_name(name)
        exported = CommitRecord(**{**asdict(rec), "name": name})
        if self.root is None:
            found = self._get_memory((rec.job_id, rec.snapshot_id))
            if found is None:
                raise SnapshotDamagedError(f"snapshot {rec.snapshot_id} of job {rec.job_name} "
                                           "is gone")
            with self._lock:
                self._mem[("export", name)] = (exported, found[1])
            return exported
        src = self._snap_dir(rec.job_id, rec.snapshot_id)
        if not os.path.isdir(src):
            raise SnapshotDamagedError(f"snapshot {rec.snapshot_id} of job {rec.job_name} is "
                                       "gone")
        tmp = self._export_dir(name) + ".new"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.dirname(tmp), exist_ok=True)
        try:
            _link_tree(src, tmp)
            os.unlink(os.path.join(tmp, COMMIT_FILE))
            write_atomically(os.path.join(tmp, COMMIT_FILE), exported.to_json().encode())
            final = self._export_dir(name)
            if os.path.exists(final):
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return exported

    def write_export(self, name: str, job_name: str,
                     entries: Iterable[tuple[str, Any, Any]], chunk: int = 4096) -> CommitRecord:
        """Writes ``(vertex, key, value)`` entries as a committed snapshot of a job of its own
        and exports it as ``name``: a snapshot made outside a job (a Spark backfill's
        hand-off), which ``JobConfig(initial_snapshot_name=name)`` restores as any export.
        The entries are written ``chunk`` at a time per vertex; the job's automatic snapshot
        is removed once exported."""
        job_id = f"written-{uuid.uuid4().hex}"
        writer = self.writer(job_id, job_name, self.next_snapshot_id(job_id), terminal=False)
        buffers: dict[str, list[Any]] = {}
        try:
            for vertex, key, value in entries:
                buf = buffers.setdefault(vertex, [])
                buf.append((key, value))
                if len(buf) >= chunk:
                    writer.add(vertex, 0, buf)
                    buffers[vertex] = []
            for vertex, buf in buffers.items():
                writer.add(vertex, 0, buf)
            rec = writer.commit()
        except BaseException:
            writer.abort()
            raise
        try:
            return self.export(rec, name)
        finally:
            self.delete_job_snapshots(job_id)

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


def vertex_dir_name(vertex: str) -> str:
    """A vertex name as a directory name."""
    return vertex.replace("/", "%2F").replace("\\", "%5C")

