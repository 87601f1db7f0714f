"""The architecture contract: layers point one way and no module imports one that imports it
back (the contracts are in pyproject.toml, [tool.importlinter], checked by import-linter)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_import_contracts_hold(tmp_path):
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable))
    if lint is None:
        pytest.fail("lint-imports is not installed: `make test` installs the test extra "
                    "(pip install -e '.[test]')")
    # The package is assembled from three folders (package-dir mapping); import-linter walks
    # one directory per top-level package, so the test lays the installed shape out with links.
    root = tmp_path / "jetwake"
    root.mkdir()
    for name in os.listdir(os.path.join(REPO, "jetwake")):
        if name.endswith(".py"):
            os.symlink(os.path.join(REPO, "jetwake", name), root / name)
    for folder in ("engine", "snapshot", "connectors"):
        os.symlink(os.path.join(REPO, folder), root / folder)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    result = subprocess.run([lint, "--config", os.path.join(REPO, "pyproject.toml"),
                             "--no-cache"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
