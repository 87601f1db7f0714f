"""The data directory's lock: one member per data directory.

Two members on one data directory would both recover and run the same jobs, fence each other's
Kafka transactions and overwrite each other's snapshots. A member therefore holds an exclusive
``flock`` on ``<data_dir>/member.lock`` for its whole life. The lock belongs to the open file,
not to the file's existence: the operating system releases it when the member shuts down or
when its process ends in any way (SIGKILL included), so a crashed member never leaves a stale
lock behind. The file keeps the last holder's pid, host and start time, for the error message
of the member that finds it taken.

``flock`` is reliable on local file systems; on a network file system it may not exclude a
member on another host (see docs/fault-tolerance.md).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time

from jetwake.engine.core.errors import DataDirectoryLockedError

__all__ = ["DataDirectoryLock", "LOCK_FILE"]

log = logging.getLogger("jetwake.member")

LOCK_FILE = "member.lock"


class DataDirectoryLock:
    """An exclusive lock on one data directory, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, LOCK_FILE)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Takes the lock at once, or raises :class:`DataDirectoryLockedError` naming the
        member that holds it and what to do."""
        if self._fd is not None:
            return
        # O_CLOEXEC: a process this one starts must not inherit (and keep) the lock
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DataDirectoryLockedError(self._taken_message(holder)) from None
        except OSError as e:
            os.close(fd)
            raise DataDirectoryLockedError(
                f"cannot lock the data directory {self.data_dir} ({self.path}: {e}); the file "
                "system must support flock (a local disk does), so that two members never use "
                "one directory") from e
        self._fd = fd
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except OSError as e:  # a full disk: the lock holds all the same, only the name is lost
            log.warning("could not write the holder into %s (%s); the lock is held", self.path,
                        e)

    def release(self) -> None:
        """Releases the lock (the file stays: removing it could let two members lock two
        different files of the same name)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _taken_message(self, holder: dict | None) -> str:
        if holder is None:
            who = "another member (it is starting: its pid is not written yet)"
        else:
            who = (f"the member with pid {holder.get('pid')} on host {holder.get('host')}, "
                   f"started {holder.get('started_at') or holder.get('started')}")
        here = holder is not None and holder.get("pid") == os.getpid() \
            and holder.get("host") == socket.gethostname()
        fix = ("this process already runs that member: use it, or call its shutdown() before "
               "opening another" if here else
               "stop that member first (member.shutdown(), or end its process), or give this "
               "member another data_dir")
        return (f"the data directory {self.data_dir} is in use by {who}; two members on one "
                f"data directory would run the same jobs twice. To fix: {fix}. The lock "
                f"({self.path}) is released when its holder shuts down or its process ends, "
                "also when it is killed, so a crashed member never blocks a new one")


def _read_holder(fd: int) -> dict | None:
    try:
        raw = os.pread(fd, 4096, 0)
        info = json.loads(raw.decode() or "null")
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None
