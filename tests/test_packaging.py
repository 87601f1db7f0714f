"""The package as it installs: jetwake/ is the package, with the code folders linked into it;
the wheel holds every package and data file, and a code folder imported by its own name from
the repository root fails at once.

The tests import the package from the working tree (the editable install maps it), so only a
built wheel shows what a user's ``pip install`` gets: a subpackage or data file that the build
misses passes every other test.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.package_files import PACKAGE, ROOT, package_files

BUILD_FILES = ("pyproject.toml", "README.md")


def _links() -> dict[str, str]:
    """The links in jetwake/, each name with its target."""
    return {path.name: os.readlink(path) for path in PACKAGE.iterdir() if path.is_symlink()}


def test_the_code_folders_are_linked_into_the_package() -> None:
    # relative links, so that they hold in any checkout, a worktree or a copy of the repository
    assert _links() == {name: f"../{name}" for name in ("engine", "snapshot", "connectors")}
    assert (PACKAGE / "engine" / "core" / "dag.py").is_file()


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The names in a wheel built from a copy of the sources (a build in the repository would
    leave build/ behind, whose stale copies could make up for a package the build misses)."""
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    source.mkdir()
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE, source / PACKAGE.name, symlinks=True, ignore=ignore)
    for folder in _links():
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir",
         str(work / "dist"), str(source)], capture_output=True, text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    [wheel] = (work / "dist").glob("jetwake-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_wheel_holds_every_package(wheel_files: set[str]) -> None:
    packages = {place for place in package_files() if place.endswith("/__init__.py")}
    # the links were followed: jetwake/, engine/core, snapshot/store, connectors/kafka, ...
    assert {"jetwake/__init__.py", "jetwake/engine/core/__init__.py",
            "jetwake/snapshot/store/__init__.py",
            "jetwake/connectors/kafka/__init__.py"} <= packages
    assert len(packages) > 20, packages
    assert not packages - wheel_files, sorted(packages - wheel_files)


def test_the_wheel_holds_every_module_and_data_file(wheel_files: set[str]) -> None:
    expected = set(package_files())
    static = {place.rsplit("/", 1)[1] for place in expected if "/dashboard/static/" in place}
    assert {"index.html", "app.js", "style.css"} <= static
    assert not expected - wheel_files, sorted(expected - wheel_files)


def test_the_wheel_installs_only_below_jetwake(wheel_files: set[str]) -> None:
    tops = {name.split("/", 1)[0] for name in wheel_files}
    assert tops == {"jetwake", "jetwake-0.1.0.dist-info"}, tops


@pytest.mark.parametrize("folder", ["engine", "snapshot", "connectors"])
def test_a_code_folder_imported_by_its_own_name_fails_naming_the_right_import(
        folder: str) -> None:
    # from the repository root the folder is importable by its name: the import must fail,
    # rather than load a second copy of every module (a second DAG class, unequal to jetwake's)
    result = subprocess.run([sys.executable, "-c", f"import {folder}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ImportError:"), result.stderr
    assert f"'jetwake.{folder}'" in last_line, last_line


def test_the_installed_names_import_one_copy_of_each_module() -> None:
    code = ("import sys, jetwake, jetwake.engine.core.dag as dag, jetwake.snapshot, "
            "jetwake.connectors; print(jetwake.DAG is dag.DAG, "
            "sorted({name.split('.')[0] for name in sys.modules} & set(sys.argv[1:])))")
    result = subprocess.run([sys.executable, "-c", code, *_links()], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    # none of the code folders was loaded by its own name too, through the link or beside it
    assert result.stdout.strip() == "True []", result.stdout + result.stderr
