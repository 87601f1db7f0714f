"""Which snapshots a member process's jobs were restored from, as the member's log says it, so
that a test that kills the process can check that its kills made a job restore from a
snapshot: exact output after kills that all came before the first snapshot would prove nothing
about restoring.

The process calls :func:`record_restores` before it opens its Member; the test reads what it
recorded with :func:`restored_snapshots`, and calls :func:`wait_for_a_new_snapshot` before a
kill that must leave something to restore.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys

from support.waiting import wait_until

_RESTORED = re.compile(r"restored from snapshot (\d+)")


class _RestoreRecorder(logging.Handler):
    """Appends the id of each snapshot a job's execution was restored from to a file."""

    def __init__(self, path: str) -> None:
        super().__init__(logging.INFO)
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        found = _RESTORED.search(record.getMessage())
        if found:
            with open(self.path, "a") as f:
                f.write(found.group(1) + "\n")


def restores_file(data_dir: str) -> str:
    """Where the restores of the member on ``data_dir`` are recorded: beside the directory,
    not in it (the member owns what is in it)."""
    return os.path.normpath(data_dir) + ".restores"


def record_restores(data_dir: str) -> None:
    """Records, from now on in this process, every restore of a job of the member on
    ``data_dir``; warnings of the job log still go to stderr."""
    logger = logging.getLogger("jetwake.job")
    logger.setLevel(logging.INFO)
    logger.addHandler(_RestoreRecorder(restores_file(data_dir)))
    if not logging.getLogger().handlers:  # else the root's handlers show them
        warnings = logging.StreamHandler(sys.stderr)
        warnings.setLevel(logging.WARNING)
        logger.addHandler(warnings)


def restored_snapshots(data_dir: str) -> list[int]:
    """The snapshot ids the member process(es) on ``data_dir`` restored jobs from, in order."""
    try:
        with open(restores_file(data_dir)) as f:
            return [int(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def committed_snapshots(data_dir: str) -> set[str]:
    """The committed snapshots of every job of the member on ``data_dir`` now (their COMMIT
    files; older ones are deleted as newer ones commit)."""
    return set(glob.glob(os.path.join(data_dir, "jobs", "*", "snapshots", "*", "COMMIT")))


def wait_for_a_new_snapshot(data_dir: str, *, timeout: float = 60) -> None:
    """Waits until the member on ``data_dir`` has committed a snapshot it had not committed
    when this was called: a kill after it leaves the restarted job something to restore."""
    before = committed_snapshots(data_dir)
    wait_until(lambda: committed_snapshots(data_dir) - before, timeout=timeout,
               what=f"a new committed snapshot in {data_dir}")
