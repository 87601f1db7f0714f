"""The type check: mypy on every module of the package, with the settings of [tool.mypy] in
pyproject.toml (run alone: ``.venv/bin/python -m pytest tests/test_type_check.py``).

mypy finds the package from the repository's root, the code folders through their links in
jetwake/, and names a file by that path (``jetwake/engine/core/dag.py`` is engine/core/dag.py).
It keeps its cache in .mypy_cache: a first run takes a few seconds, a run after a small change
well under one. It runs in a process of its own: in this one, a first run would leave a few
hundred MB of mypy's objects alive for the rest of the session, and every full garbage
collection of the later tests would walk them (about a second each).
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from support.package_files import ROOT, package_files

PYPROJECT = ROOT / "pyproject.toml"


def test_the_code_passes_the_type_checker() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: `make test` installs the test extra "
                    "(pip install -e '.[test]')")
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT)],
                            cwd=ROOT, capture_output=True, text=True, timeout=240)
    report = result.stdout + result.stderr
    assert result.returncode == 0, "mypy (settings: [tool.mypy] in pyproject.toml):\n" + report
    # every module was checked, not only those of jetwake/ itself (the links were followed)
    checked = re.search(r"no issues found in (\d+) source files", report)
    modules = sum(1 for place in package_files() if place.endswith(".py"))
    assert checked and int(checked.group(1)) >= modules, report
