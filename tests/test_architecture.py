"""The architecture contract: layers point one way and no module imports one that imports it
back (the contracts are in pyproject.toml, [tool.importlinter], checked by import-linter)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from support.package_files import ROOT, package_files


def test_the_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable))
    if lint is None:
        pytest.fail("lint-imports is not installed: `make test` installs the test extra "
                    "(pip install -e '.[test]')")
    # import-linter finds the package in its working directory, the code folders through their
    # links in jetwake/
    result = subprocess.run([lint, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    # every module was analysed, not only those of jetwake/ itself
    analysed = re.search(r"Analyzed (\d+) files", result.stdout)
    modules = sum(1 for place in package_files() if place.endswith(".py"))
    assert analysed and int(analysed.group(1)) == modules, result.stdout[-2000:]
