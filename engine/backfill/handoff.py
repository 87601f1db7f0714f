"""The hand-off: a backfill's end state written as a jetwake snapshot under a name.

The snapshot holds, per stage (vertex), the entries the streaming job's processors would have
saved at the point where the backfill stopped: the Kafka source's offsets, the keyed state of
rolling aggregates and ``map_stateful`` stages, the accumulators of windows still open, the
window processors' watermark. ``JobConfig(initial_snapshot_name=NAME)`` restores it as it
restores any exported snapshot: each entry goes to the processor owning its key's partition,
whatever the streaming job's parallelism (snapshot/protocol/restore.py).
"""

from __future__ import annotations

from typing import Any, Iterable

from jetwake.engine.core.errors import SnapshotError

__all__ = ["snapshot_store_of", "check_snapshot_name", "write_snapshot"]


def snapshot_store_of(member: Any) -> Any:
    """The snapshot store of ``member`` when it is an embedded Member; None for a Client (the
    snapshot then goes through the member service's ``write_snapshot`` request)."""
    store = getattr(member, "snapshot_store", None)
    if store is None and not callable(getattr(member, "write_snapshot", None)):
        raise SnapshotError(
            f"export_snapshot needs the member whose streaming job will start from the "
            f"snapshot: an embedded Member or a Client of its member service (got "
            f"{type(member).__name__})")
    return store


def _taken(member: Any, name: str) -> bool:
    store = snapshot_store_of(member)
    if store is not None:
        return store.get_export(name) is not None
    return any(rec.name == name for rec in member.snapshots())


def check_snapshot_name(member: Any, name: Any) -> None:
    """Fails before any work when ``name`` is not a valid snapshot name or is taken."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name \
            or name in (".", ".."):
        raise ValueError(f"export_snapshot: a snapshot name must be a non-empty string "
                         f"without path separators, got {name!r}")
    if member is None:
        raise ValueError("export_snapshot needs member=: the Member whose streaming job will "
                         "start from the snapshot (the snapshot is written into its store)")
    if _taken(member, name):
        raise SnapshotError(f"a snapshot named {name!r} exists already on the member; delete "
                            f"it (jetwake delete-snapshot {name}) or choose another name")


def write_snapshot(member: Any, name: str, job_name: str,
                   entries: Iterable[tuple[str, Any, Any]], chunk: int = 4096) -> Any:
    """Writes ``(vertex, key, value)`` entries as a committed snapshot and exports it as
    ``name``; returns the exported CommitRecord. Through a Client the entries go to the member
    in one ``write_snapshot`` request (a hand-off holds keyed state, not the input)."""
    store = snapshot_store_of(member)
    if store is None:
        return member.write_snapshot(name, job_name, list(entries))
    return store.write_export(name, job_name, entries, chunk)
