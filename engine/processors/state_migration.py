"""Converting saved state of an older shape as a job restores it (``migrate=fn`` of
``map_stateful`` and ``rolling_aggregate``).

When a job starts from a snapshot another job wrote (``JobConfig(initial_snapshot_name=...)``,
a backfill's hand-off), each restored state (a ``map_stateful`` state, a rolling aggregate's
accumulator) goes through ``fn(old)``, whose result is the key's state from then on; a None
result drops the key (counted in ``migrate_dropped_keys``). State restored entry by entry is
converted as it arrives (:func:`migrate_one`); state restored from a RocksDB checkpoint's
files is converted once the files are restored, by reading and rewriting every entry of the
processor's partitions (:func:`migrate_all`). A function that raises fails the job's start,
naming the stage, the key and the cause.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from jetwake.engine.core.errors import StateMigrationError

__all__ = ["migrate_one", "migrate_all", "DROPPED"]

DROPPED = object()
"""What :func:`migrate_one` returns for a key whose state the function dropped (None)."""


def migrate_one(fn: Callable[[Any], Any], stage: str, key: Any, old: Any,
                metrics: dict[str, Any]) -> Any:
    """``fn(old)``, the key's new state, or :data:`DROPPED` when it returned None; counts
    the key in ``metrics``; raises StateMigrationError naming ``stage`` and ``key``."""
    try:
        new = fn(old)
    except Exception as e:  # noqa: BLE001 - the user's function: its error, named
        raise StateMigrationError(
            f"stage '{stage}': migrate failed on the saved state of key {key!r} "
            f"({type(e).__name__}: {e}); fix the migrate function (it must also accept a "
            "state already in the new shape) or start the job without that "
            "snapshot") from e
    if new is None:
        metrics["migrate_dropped_keys"] = metrics.get("migrate_dropped_keys", 0) + 1
        return DROPPED
    metrics["migrated_keys"] = metrics.get("migrated_keys", 0) + 1
    return new


def migrate_all(states: Any, fn: Callable[[Any], Any], stage: str,
                partitions: Iterable[int], metrics: dict[str, Any]) -> list[Any]:
    """Converts every state of ``partitions`` in ``states`` (a dict or a keyed state store,
    just restored from saved files): each is read, converted and written back (deleted when
    dropped), one partition at a time, so that no entry is converted twice. Returns the
    keys dropped."""
    if isinstance(states, dict):
        batches: Iterable[list[tuple[Any, Any]]] = [list(states.items())]
    else:
        batches = (list(states.items([p])) for p in sorted(set(partitions)))
    dropped = []
    for batch in batches:
        for key, old in batch:
            new = migrate_one(fn, stage, key, old, metrics)
            if new is DROPPED:
                del states[key]
                dropped.append(key)
            else:
                states[key] = new
    return dropped
