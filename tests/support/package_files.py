"""The files of the jetwake package as the repository lays it out, for the tests that check
what a tool or a build finds in it."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "jetwake"


def package_files() -> list[str]:
    """Every file of the package but compiled ones, by its place in the installed package
    (``jetwake/engine/core/dag.py``), sorted.

    The code folders are links in jetwake/ (jetwake/engine -> ../engine), which ``rglob`` does
    not enter; ``os.walk`` follows them when asked.
    """
    found = []
    for folder, subfolders, files in os.walk(PACKAGE, followlinks=True):
        subfolders[:] = [name for name in subfolders if name != "__pycache__"]
        place = Path(folder).relative_to(ROOT).as_posix()
        found += [f"{place}/{name}" for name in files if not name.endswith(".pyc")]
    return sorted(found)
