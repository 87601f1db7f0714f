"""Sinks.postgres whose exactly-once processors kill their own process at a point of the
two-phase commit, for the kill tests (see tests/support/postgres_job_process.py). A module of
its own, so that the job's definition refers to it by name (a class defined in a script run as
``__main__`` would be pickled by value, with its lock)."""

from __future__ import annotations

import os
import signal
import threading

_spec = os.environ.get("JETWAKE_PG_DIE_AT", "")
_point, _, _n = _spec.partition(":")
_left = [int(_n or 1)]
_lock = threading.Lock()
_committed = threading.Event()  # a snapshot's phase 2 ran: a kill now leaves a snapshot


_first: set = set()   # snapshots whose part processor 0 committed


def note_first_committed(snapshot_id: int) -> None:
    _first.add(snapshot_id)


def first_committed(snapshot_id: int) -> bool:
    return snapshot_id in _first


def armed(point: str) -> bool:
    """Whether this process is to die at ``point``."""
    return point == _point


def mark_committed() -> None:
    _committed.set()


def die_at(point: str) -> None:
    if point != _point or (point == "processing" and not _committed.is_set()):
        return
    with _lock:
        _left[0] -= 1
        if _left[0] <= 0:
            os.kill(os.getpid(), signal.SIGKILL)


def dying_sink(table: str, dsn: str):
    """Sinks.postgres whose exactly-once processors call die_at() at their points."""
    from jetwake import Sinks
    from support.waiting import poll_until
    from jetwake.connectors.postgres.sink import PostgresExactlyOnceSinkProcessor
    from support.sink_processors import replace_processor_class

    class Dying(PostgresExactlyOnceSinkProcessor):
        def _send(self, rows):
            super()._send(rows)
            die_at("processing")

        def snapshot_commit_prepare(self):
            prepared = bool(self._open or self._batch)
            done = super().snapshot_commit_prepare()
            if prepared:
                die_at("after-prepare")
            return done

        def snapshot_commit_finish(self, success):
            sid = self.context.snapshot_id
            mine = success and sid in self._prepared
            if (mine and armed("during-commit") and self.context.global_processor_index == 1
                    and poll_until(lambda: first_committed(sid), timeout=2)):
                die_at("during-commit")   # processor 0 committed its part, ours is prepared
            done = super().snapshot_commit_finish(success)
            if mine and self.context.global_processor_index == 0:
                note_first_committed(sid)
            mark_committed()
            return done

    sink = Sinks.postgres(table, dsn, columns=["id", "v"], batch_size=50)
    replace_processor_class(sink, PostgresExactlyOnceSinkProcessor, Dying)
    return sink


