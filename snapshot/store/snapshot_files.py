"""Immutable files as the value of a snapshot entry.

A processor whose state already lives in files (RocksDB's SST files) does not have to read it
back and serialize it entry by entry: it offers ``(key, SnapshotFiles(...))`` to the snapshot and
the snapshot store keeps the files themselves. :func:`save_files` puts them into the snapshot's
directory as hard links, so a file shared by several snapshots (an SST file that did not change
between them) is stored once and costs nothing to save again; :func:`load_files` checks a saved
set at restore. The files must never be modified in place by anyone after they are offered:
every holder of a hard link sees the same bytes.
"""

from __future__ import annotations

import errno
import os
import shutil
from typing import Any, Iterable

__all__ = ["SnapshotFiles", "SnapshotFilesDamagedError", "save_files", "load_files",
           "checked_file_name"]

# link failures that mean "this file system cannot link here": fall back to copying
_COPY_INSTEAD = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP,
                 errno.EACCES}


class SnapshotFilesDamagedError(ValueError):
    """A saved file set does not match its manifest (a file is missing or has another size)."""


def checked_file_name(name: Any) -> str:
    """``name``, when it is a file name relative to its directory ("/" between path parts)
    that stays inside it; raises ValueError otherwise."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a snapshot file name must be a non-empty string, got {name!r}")
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or "\x00" in name \
            or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"a snapshot file name must be a relative path inside its directory "
                         f"(parts separated by '/', no '.', '..' or empty parts), got {name!r}")
    return name


class SnapshotFiles:
    """A set of immutable files saved as the VALUE of one snapshot entry.

    ``directory`` is where the files are now, ``files`` their names relative to it ("/"
    separates subdirectories), ``meta`` a small msgpack-serializable dict the owner needs to
    use them again (for RocksDB: the format and which partitions the files hold).
    """

    __slots__ = ("directory", "files", "meta")

    def __init__(self, directory: str | os.PathLike[str], files: Iterable[str],
                 meta: dict[str, Any] | None = None) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path, got {type(directory).__name__}")
        if isinstance(files, (str, bytes)):
            raise TypeError("files must be a collection of file names, not a single string")
        names = tuple(checked_file_name(f) for f in files)
        if len(set(names)) != len(names):
            raise ValueError(f"file names repeat in {names!r}")
        if meta is not None and not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict or None, got {type(meta).__name__}")
        self.directory: str = os.fspath(directory)
        self.files: tuple[str, ...] = names
        self.meta: dict[str, Any] = {} if meta is None else meta

    def path(self, name: str) -> str:
        """The current path of the file ``name``."""
        return os.path.join(self.directory, *name.split("/"))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, SnapshotFiles) and other.directory == self.directory
                and other.files == self.files and other.meta == self.meta)

    def __hash__(self) -> int:
        return hash((self.directory, self.files))

    def __repr__(self) -> str:
        meta = repr(self.meta)
        if len(meta) > 120:
            meta = meta[:117] + "..."
        return f"SnapshotFiles({self.directory!r}, {len(self.files)} files, meta={meta})"


def _fsync(path: str, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(src: str, dst: str) -> None:
    tmp = f"{dst}.{os.getpid()}.copy"
    shutil.copyfile(src, tmp)
    _fsync(tmp)
    os.replace(tmp, dst)


def save_files(value: SnapshotFiles, dest_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Hard-links (copying when linking fails, e.g. EXDEV) every file into ``dest_dir``
    (created), fsyncs, and returns a msgpack-serializable manifest:
    ``{"files": [[name, size], ...], "meta": meta}``.

    A file already in ``dest_dir`` under the same name (a retried save) is replaced. Raises
    FileNotFoundError naming the file when one of ``value``'s files is gone.
    """
    if not isinstance(value, SnapshotFiles):
        raise TypeError(f"save_files takes a SnapshotFiles, got {type(value).__name__}")
    dest = os.fspath(dest_dir)
    os.makedirs(dest, exist_ok=True)
    dirs = {dest}
    listed = []
    for name in value.files:
        src = value.path(name)
        dst = os.path.join(dest, *name.split("/"))
        parent = os.path.dirname(dst)
        if parent not in dirs:
            os.makedirs(parent, exist_ok=True)
            dirs.add(parent)
        if not os.path.exists(src):
            raise FileNotFoundError(f"snapshot file {name!r} is missing from {value.directory}")
        if os.path.lexists(dst):
            if os.path.samefile(src, dst):
                listed.append([name, os.stat(dst).st_size])
                continue
            os.unlink(dst)
        try:
            os.link(src, dst)
        except OSError as e:
            if e.errno not in _COPY_INSTEAD:
                raise
            _copy(src, dst)
        else:
            # a linked file shares its data with the source: make sure that data is on disk
            # (RocksDB syncs its files; syncing an already synced file costs nearly nothing)
            _fsync(dst)
        listed.append([name, os.stat(dst).st_size])
    for d in sorted(dirs, key=len, reverse=True):
        _fsync(d)
    return {"files": listed, "meta": value.meta}


def load_files(manifest: dict[str, Any], directory: str | os.PathLike[str]) -> SnapshotFiles:
    """The :class:`SnapshotFiles` of a saved ``manifest`` whose files are in ``directory``;
    checks that every file exists with the recorded size, else raises
    :class:`SnapshotFilesDamagedError` naming the file."""
    where = os.fspath(directory)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise SnapshotFilesDamagedError(
            f"the file manifest of {where} is not a dict with a 'files' list: {manifest!r:.200}")
    meta = manifest.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise SnapshotFilesDamagedError(f"the file manifest of {where} has a meta that is not a "
                                        f"dict: {meta!r:.200}")
    names = []
    for entry in manifest["files"]:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2
                and isinstance(entry[1], int)):
            raise SnapshotFilesDamagedError(
                f"the file manifest of {where} has a malformed entry {entry!r:.200} "
                "(expected [name, size])")
        name, size = entry
        try:
            checked_file_name(name)
        except ValueError as e:
            raise SnapshotFilesDamagedError(f"the file manifest of {where}: {e}") from None
        path = os.path.join(where, *name.split("/"))
        try:
            actual = os.stat(path).st_size
        except FileNotFoundError:
            raise SnapshotFilesDamagedError(
                f"snapshot file {name!r} is missing from {where}") from None
        if actual != size:
            raise SnapshotFilesDamagedError(
                f"snapshot file {name!r} in {where} has {actual} bytes, its manifest says "
                f"{size}")
        names.append(name)
    return SnapshotFiles(where, names, meta)
