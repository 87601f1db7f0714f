"""Crash points for fault-injection tests.

With ``JETWAKE_CRASH_AT=<point>[:<n>]`` in its environment, a member process kills itself with
SIGKILL the ``n``-th time (default: the first) it passes ``<point>``, so tests can stop a real
process exactly between two steps of the snapshot protocol. Without the variable every call is
a no-op. Points: ``snapshot-phase1`` (barriers in flight), ``after-commit-record`` (the
snapshot is committed but phase 2 has not run), ``after-phase2``.
"""

from __future__ import annotations

import os
import signal

__all__ = ["crash_point", "CRASH_POINTS"]

CRASH_POINTS = ("snapshot-phase1", "after-commit-record", "after-phase2")

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
