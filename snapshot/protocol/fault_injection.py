"""Crash points for fault-injection tests.

With ``JETWAKE_CRASH_AT=<point>[:<n>]`` in its environment, a member process kills itself with
SIGKILL the ``n``-th time (default: the first) it passes ``<point>``, so tests can stop a real
process exactly between two steps of the snapshot protocol. Without the variable every call is
a no-op. Points on the member that coordinates the snapshot: ``snapshot-phase1`` (barriers
in flight), ``after-commit-record`` (the snapshot is committed but phase 2 has not run),
``after-phase2``. Points on any member of a cluster, in its share of a snapshot:
``member-phase1`` (its processors saved their state, its part is not synced or shared yet),
``member-before-phase2`` (the snapshot is committed, phase 2 has not reached it) and
``member-phase2`` (phase 2 started on it, its sinks may be committing).
"""

from __future__ import annotations

import os
import signal

__all__ = ["crash_point", "CRASH_POINTS"]

CRASH_POINTS = ("snapshot-phase1", "after-commit-record", "after-phase2", "member-phase1",
                "member-before-phase2", "member-phase2")

_spec = os.environ.get("JETWAKE_CRASH_AT", "")
_point, _, _count = _spec.partition(":")
_remaining = int(_count) if _count.isdigit() else 1
if _point and _point not in CRASH_POINTS:
    raise ValueError(f"JETWAKE_CRASH_AT={_spec!r}: unknown crash point; use one of "
                     f"{', '.join(CRASH_POINTS)}, optionally followed by ':<n>'")


def crash_point(point: str) -> None:
    """Kills this process if ``JETWAKE_CRASH_AT`` names ``point`` and its count is reached."""
    global _remaining
    if point != _point:
        return
    _remaining -= 1
    if _remaining <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
