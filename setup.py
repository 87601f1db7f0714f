"""The package list, found rather than written by hand.

pyproject.toml maps the three code folders below ``jetwake`` ([tool.setuptools] package-dir:
``engine/`` installs as ``jetwake.engine``, ...). setuptools' own discovery
([tool.setuptools.packages.find]) names a package after its folder and cannot apply that
renaming, so a hand list was kept instead, and a new subpackage could pass every test (they
import the folders from the working tree) and still be missing from the wheel. This file reads
the mapping and lists every folder below each mapped folder, under its installed name: the
packages, and the folders of data files such as the dashboard's ``static/`` (setuptools warns of
a folder of files that is left out of the list, as of one that would be left out of the wheel).
Everything else about the build stays in pyproject.toml.
"""
import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup

HERE = Path(__file__).resolve().parent
PACKAGE_DIR: dict[str, str] = (
    tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"])


def discovered_packages() -> list[str]:
    """Every mapped package and every folder below it, by its installed name."""
    packages = []
    for package, folder in PACKAGE_DIR.items():
        packages.append(package)
        packages += [f"{package}.{name}"
                     for name in find_namespace_packages(str(HERE / folder))]
    return sorted(packages)


setup(packages=discovered_packages())
