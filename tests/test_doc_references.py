"""The docs and the code's docstrings and comments refer only to files in the repository.

A reader follows a path such as ``snapshot/protocol/restore.py`` or ``docs/kafka.md`` to the
file; a moved or renamed file must take its references along. Notes that live outside the
repository (a design note, numbered seed documents) cannot be followed at all: the reasoning
belongs in the text itself or in a page of docs/. docs/architecture.md draws the layers and
lists their modules: the picture follows the order of the layers contract in pyproject.toml,
and the table names every module of each layer and no other.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_FOLDERS = ("engine", "snapshot", "connectors", "jetwake", "tests", "bench", "examples")

# A path into the repository: a top-level folder, then at least one more part, ending in a file
# name with an extension or in "/" (a folder). Words such as "engine/plain" are not paths.
_PATH = re.compile(r"(?<![\w./<>-])((?:engine|snapshot|connectors|jetwake|tests|docs|bench|"
                   r"examples|docker|\.ci)/(?:[\w.-]+/)*(?:[\w-]+\.[a-z]{1,5}\b|(?=/)|))")
# References to notes that are not in the repository (spelt so that this file does not match).
_OUTSIDE = [re.compile(p) for p in (r"DESIGN\.md", "\u00a7", r"\bseeds?\s+0\d\d", r"\bthe seeds\b",
                                    r"\bseeds'")]


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _sources() -> list[Path]:
    return sorted(p for folder in CODE_FOLDERS for p in (ROOT / folder).rglob("*.py")
                  if p != Path(__file__).resolve())


def _broken_paths(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    broken = []
    for m in _PATH.finditer(text):
        ref = m.group(1)
        if ref.endswith("/") or "." in ref.rsplit("/", 1)[-1]:
            if not (ROOT / ref).exists():
                line = text.count("\n", 0, m.start()) + 1
                broken.append(f"{path.relative_to(ROOT)}:{line}: {ref}")
    return broken


def _outside_references(path: Path) -> list[str]:
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if any(p.search(line) for p in _OUTSIDE):
            found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_paths_in_the_docs_name_files_of_the_repository() -> None:
    broken = [b for page in _pages() for b in _broken_paths(page)]
    assert not broken, "paths that name no file of the repository:\n" + "\n".join(broken)


def test_paths_in_docstrings_and_comments_name_files_of_the_repository() -> None:
    broken = [b for source in _sources() for b in _broken_paths(source)]
    assert not broken, "paths that name no file of the repository:\n" + "\n".join(broken)


def test_nothing_refers_to_notes_outside_the_repository() -> None:
    found = [f for path in [*_pages(), *_sources()] for f in _outside_references(path)]
    assert not found, ("references to notes that are not in the repository; say the reasoning "
                       "or point at a file of the repository instead:\n" + "\n".join(found))


# --- docs/architecture.md against the layers contract and the folders ------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
_LAYER_IN_PICTURE = re.compile(r"(?<![\w/])(engine/\w+|snapshot/|connectors/)(?=\s|$)")
_TABLE_ROW = re.compile(r"^\| `(?P<layer>[\w/]+)` \| (?P<modules>.*) \|$")


def _contract_layers() -> list[set[str]]:
    """The layers contract of pyproject.toml, top first, as folders ("engine/server")."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in config["contracts"] if c["type"] == "layers")
    folder = {"jetwake.engine": "engine", "jetwake.snapshot": "snapshot",
              "jetwake.connectors": "connectors"}

    def to_folder(module: str) -> str:
        top = ".".join(module.split(".")[:2])
        return "/".join([folder[top], *module.split(".")[2:]])

    return [{to_folder(m.strip()) for m in re.split(r"[|:]", layer)} for layer in layers]


def _layout_section() -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index("## The layout")
    return text[start:text.index("\n## ", start + 1)]


def test_the_architecture_picture_draws_the_layers_of_the_contract_in_its_order() -> None:
    section = _layout_section()
    picture = section[section.index("```text"):section.index("```", section.index("```text") + 7)]
    drawn: list[set[str]] = []
    for line in picture.splitlines():
        names = {n.rstrip("/") for n in _LAYER_IN_PICTURE.findall(line)}
        if names and not any(names <= d for d in drawn):
            drawn.append(names)
    assert drawn == _contract_layers(), (
        "docs/architecture.md's picture and pyproject.toml's layers contract differ:\n"
        f"  picture:  {drawn}\n  contract: {_contract_layers()}")


def test_the_architecture_table_lists_every_module_of_each_layer() -> None:
    rows = {}
    for line in _layout_section().splitlines():
        m = _TABLE_ROW.match(line)
        if m and m["layer"] != "layer":
            prefix, listed = "", set()
            for name in re.findall(r"`([^`]+)`", m["modules"]):
                if name.endswith("/"):
                    prefix = name
                elif name.endswith(".py"):
                    listed.add(prefix + name)
            rows[m["layer"]] = listed
    assert set(rows) == set().union(*_contract_layers()), "one row per layer of the contract"
    problems = []
    for layer, listed in rows.items():
        folder = ROOT / layer
        present = {str(p.relative_to(folder)) for p in folder.rglob("*.py")
                   if p.name not in ("__init__.py", "__main__.py")}
        if present - listed:
            problems.append(f"{layer}: not in the table: {sorted(present - listed)}")
        if listed - present:
            problems.append(f"{layer}: no such module: {sorted(listed - present)}")
    assert not problems, "docs/architecture.md's module table:\n" + "\n".join(problems)
