"""The type check: mypy on every module of the package, with the settings of [tool.mypy] in
pyproject.toml (run alone: ``.venv/bin/python -m pytest tests/test_type_check.py``).

The package is assembled from three folders (the package-dir mapping of [tool.setuptools]),
which mypy cannot follow: the test lays the installed shape out with links in
.mypy_cache/package, where the configuration points mypy, and reports the errors under the
repository's own paths. mypy keeps its cache in .mypy_cache: a first run takes a few seconds, a
run after a small change well under one. It runs in a process of its own: in this one, a first
run would leave a few hundred MB of mypy's objects alive for the rest of the session, and every
full garbage collection of the later tests would walk them (about a second each).
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
LINKS = ROOT / ".mypy_cache" / "package"      # [tool.mypy] mypy_path


def _link(link: Path, target: Path) -> None:
    """Points ``link`` at ``target``, replacing another link atomically (a concurrent run of the
    test may be making the same links)."""
    relative = os.path.relpath(target, link.parent)
    if link.is_symlink() and os.readlink(link) == relative:
        return
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(relative)
    os.replace(temporary, link)


def _lay_out_package() -> dict[Path, str]:
    """Links the package's folders into their installed places below LINKS; returns each
    place with the folder's path in the repository."""
    package_dir = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-dir"]
    places = {LINKS.joinpath(*package.split(".")): folder
              for package, folder in package_dir.items()}
    for place, folder in places.items():
        if place.parent != LINKS:
            place.parent.mkdir(parents=True, exist_ok=True)
            _link(place, ROOT / folder)
            continue
        # the top-level package: a folder of links to its files, the mapped folders placed in it
        place.mkdir(parents=True, exist_ok=True)
        inner = {p.name for p in places if p.parent == place}
        own = {p.name for p in (ROOT / folder).iterdir() if p.name != "__pycache__"} - inner
        for entry in place.iterdir():
            if entry.name not in own | inner:
                entry.unlink(missing_ok=True)
        for name in own:
            _link(place / name, ROOT / folder / name)
    return places


def test_the_code_passes_the_type_checker() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: `make test` installs the test extra "
                    "(pip install -e '.[test]')")
    places = _lay_out_package()
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT)],
                            cwd=ROOT, capture_output=True, text=True, timeout=240)
    report = result.stdout + result.stderr
    # mypy names a file by the path it found it at: the links' place, relative to ROOT
    for place, folder in sorted(places.items(), key=lambda item: -len(str(item[0]))):
        report = report.replace(os.path.relpath(place, ROOT) + os.sep, folder + os.sep)
    assert result.returncode == 0, "mypy (settings: [tool.mypy] in pyproject.toml):\n" + report
    # every module was checked, not only those of jetwake/ (the links were found)
    checked = re.search(r"no issues found in (\d+) source files", report)
    modules = sum(1 for folder in places.values() for _ in (ROOT / folder).rglob("*.py"))
    assert checked and int(checked.group(1)) >= modules, report
