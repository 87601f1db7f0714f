"""The docs and the code's docstrings and comments refer only to files in the repository.

A reader follows a path such as ``snapshot/protocol/restore.py`` or ``docs/kafka.md`` to the
file; a moved or renamed file must take its references along. Notes that live outside the
repository (a design note, numbered seed documents) cannot be followed at all: the reasoning
belongs in the text itself or in a page of docs/.
"""
from __future__ import annotations

import re
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
