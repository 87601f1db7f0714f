"""The package as it installs: the wheel holds every package and data file of the code folders,
and a code folder imported by its own name from the repository root fails at once.

The tests import the folders from the working tree (the editable install maps them), so only a
built wheel shows what a user's ``pip install`` gets: a subpackage or data file missing from it
passes every other test.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR: dict[str, str] = tomllib.loads(
    (ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
PACKAGES: list[str] = tomllib.loads(
    (ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
BUILD_FILES = ("pyproject.toml", "README.md")


def _expected_files() -> set[str]:
    """Every file of the mapped folders but compiled ones, at its place in the wheel."""
    expected = set()
    for package, folder in PACKAGE_DIR.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                inside = path.relative_to(ROOT / folder).as_posix()
                expected.add(package.replace(".", "/") + "/" + inside)
    return expected


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The names in a wheel built from a copy of the sources (a build in the repository would
    leave build/ behind, whose stale copies could make up for a package the build misses)."""
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    source.mkdir()
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, source / name)
    for folder in PACKAGE_DIR.values():
        shutil.copytree(ROOT / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir",
         str(work / "dist"), str(source)], capture_output=True, text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    [wheel] = (work / "dist").glob("jetwake-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_package_list_names_every_folder_of_the_code_folders() -> None:
    """pyproject.toml lists the packages (setuptools' discovery cannot install engine/ as
    jetwake.engine): every folder below a mapped one, with files, must be on the list."""
    folders = set()
    for package, folder in PACKAGE_DIR.items():
        folders.add(package)
        for path in (ROOT / folder).rglob("*"):
            if path.is_dir() and "__pycache__" not in path.parts and any(
                    p.is_file() for p in path.iterdir()):
                inside = path.relative_to(ROOT / folder).as_posix().replace("/", ".")
                folders.add(f"{package}.{inside}")
    assert sorted(folders - set(PACKAGES)) == [], (
        "add these to [tool.setuptools] packages in pyproject.toml")
    assert sorted(set(PACKAGES) - folders) == [], "no such folder: remove from the list"


def test_the_wheel_holds_every_package(wheel_files: set[str]) -> None:
    packages = {path.relative_to(ROOT).parent for folder in PACKAGE_DIR.values()
                for path in (ROOT / folder).rglob("__init__.py")}
    assert len(packages) > 20, packages      # the folders were found: engine/core, ...
    expected = {place for place in _expected_files() if place.endswith("/__init__.py")}
    assert len(expected) == len(packages)
    assert not expected - wheel_files, sorted(expected - wheel_files)


def test_the_wheel_holds_every_module_and_data_file(wheel_files: set[str]) -> None:
    expected = _expected_files()
    static = {place for place in expected if "/dashboard/static/" in place}
    assert {"index.html", "app.js", "style.css"} <= {place.rsplit("/", 1)[1] for place in static}
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


def test_the_installed_names_import() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import jetwake.engine.core.dag as d, jetwake; "
         "import jetwake.snapshot, jetwake.connectors; print(jetwake.DAG is d.DAG)"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "True", result.stderr
