"""The path rule of the file sources (``Sources.files``, ``Sources.parquet``,
``Sources.json_lines``): a directory means its visible regular files, sorted; a literal path that
does not exist fails the job when it starts, naming the path and the fix; a glob that matches
nothing is an empty input with one warning. The member and the Spark backfill share the rule
(``matching_files``)."""

from __future__ import annotations

import json
import logging

import pytest

from jetwake import Member, Pipeline, Sinks, Sources
from jetwake.connectors.record_files import matching_files

from support.spark_fixtures import spark_runner  # noqa: F401

KINDS = ["files", "parquet", "json_lines"]
SOURCES = {"files": Sources.files, "parquet": Sources.parquet,
           "json_lines": Sources.json_lines}
SUFFIX = {"files": ".txt", "parquet": ".parquet", "json_lines": ".jsonl"}


def write(path, kind: str, values: list[int]) -> None:
    """A file of ``kind`` holding ``values``: lines, JSON lines, or Parquet rows ``{"v": n}``."""
    if kind == "parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist([{"v": v} for v in values]), str(path))
    elif kind == "json_lines":
        path.write_text("".join(json.dumps({"v": v}) + "\n" for v in values))
    else:
        path.write_text("".join(f"{v}\n" for v in values))


def as_value(kind: str, item):
    return int(item) if kind == "files" else item["v"]


def run(source) -> list:
    p = Pipeline()
    p.read_from(source).write_to(Sinks.list("out"))
    with Member() as m:
        m.new_job(p).join(timeout=60)
        return list(m.get_list("out"))


def fill_directory(directory, kind: str) -> None:
    """Two visible files (written out of name order) and the files a dataset writer leaves
    beside them, which are not input: hidden, ``_SUCCESS``-style, and a subdirectory."""
    directory.mkdir()
    write(directory / f"b{SUFFIX[kind]}", kind, [3, 4])
    write(directory / f"a{SUFFIX[kind]}", kind, [1, 2])
    (directory / "_SUCCESS").write_text("")
    (directory / ".a.crc").write_text("not input\n")
    (directory / "nested").mkdir()
    write(directory / "nested" / f"c{SUFFIX[kind]}", kind, [99])


# --- matching_files --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_a_directory_means_its_visible_regular_files_sorted(tmp_path, kind):
    for name in ("b.x", "a.x", "_SUCCESS", ".hidden", "_temporary.x"):
        (tmp_path / name).write_text("")
    (tmp_path / "sub").mkdir()
    assert matching_files(str(tmp_path), kind) == [str(tmp_path / "a.x"), str(tmp_path / "b.x")]


@pytest.mark.parametrize("kind", KINDS)
def test_an_existing_file_means_that_file(tmp_path, kind):
    (tmp_path / "one.x").write_text("")
    assert matching_files(str(tmp_path / "one.x"), kind) == [str(tmp_path / "one.x")]


@pytest.mark.parametrize("kind", KINDS)
def test_a_glob_means_its_regular_matches_sorted(tmp_path, kind):
    for name in ("b.x", "a.x", "c.y"):
        (tmp_path / name).write_text("")
    (tmp_path / "d.x").mkdir()
    assert matching_files(str(tmp_path / "*.x"), kind) == \
        [str(tmp_path / "a.x"), str(tmp_path / "b.x")]


@pytest.mark.parametrize("kind", KINDS)
def test_a_glob_that_matches_nothing_is_an_empty_input(tmp_path, kind):
    assert matching_files(str(tmp_path / "*.none"), kind) == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_literal_path_raises_naming_the_source_the_path_and_the_fix(tmp_path, kind):
    missing = str(tmp_path / "missing.x")
    with pytest.raises(FileNotFoundError) as e:
        matching_files(missing, kind)
    msg = str(e.value)
    assert f"Sources.{kind}({missing!r})" in msg
    assert "no such file or directory" in msg
    assert "check the path" in msg and repr(str(tmp_path / f"*{SUFFIX[kind]}")) in msg


# --- on a member -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_a_directory_source_reads_its_visible_files_in_path_order_on_a_member(tmp_path, kind):
    fill_directory(tmp_path / "data", kind)
    items = run(SOURCES[kind](str(tmp_path / "data")))
    assert [as_value(kind, i) for i in items] == [1, 2, 3, 4]


@pytest.mark.parametrize("kind", KINDS)
def test_a_single_file_source_reads_that_file_on_a_member(tmp_path, kind):
    write(tmp_path / f"one{SUFFIX[kind]}", kind, [5, 6])
    items = run(SOURCES[kind](str(tmp_path / f"one{SUFFIX[kind]}")))
    assert [as_value(kind, i) for i in items] == [5, 6]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["missing.data", "missing-dir"])
def test_a_missing_path_fails_the_job_when_it_starts_naming_the_path(tmp_path, kind, name):
    missing = str(tmp_path / name)
    p = Pipeline()
    p.read_from(SOURCES[kind](missing)).write_to(Sinks.list("out"))
    with Member() as m:
        with pytest.raises(FileNotFoundError) as e:
            m.new_job(p).join(timeout=60)
        assert list(m.get_list("out")) == []
    assert repr(missing) in str(e.value) and "check the path" in str(e.value)


@pytest.mark.parametrize("kind", KINDS)
def test_a_glob_that_matches_nothing_completes_empty_with_one_warning(tmp_path, kind, caplog):
    pattern = str(tmp_path / "*.none")
    with caplog.at_level(logging.WARNING, logger="jetwake"):
        assert run(SOURCES[kind](pattern)) == []
    warnings = [r for r in caplog.records
                if r.levelno == logging.WARNING and "no file matches" in r.getMessage()]
    assert len(warnings) == 1
    assert f"Sources.{kind}({pattern!r})" in warnings[0].getMessage()


@pytest.mark.parametrize("kind", KINDS)
def test_an_empty_directory_completes_empty_with_a_warning(tmp_path, kind, caplog):
    (tmp_path / "empty").mkdir()
    with caplog.at_level(logging.WARNING, logger="jetwake"):
        assert run(SOURCES[kind](str(tmp_path / "empty"))) == []
    assert any("no file matches" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_parent_directory_fails_when_the_source_is_created(tmp_path, kind):
    with pytest.raises(FileNotFoundError, match="does not exist") as e:
        SOURCES[kind](str(tmp_path / "no-such-dir" / "x.data"))
    assert str(tmp_path / "no-such-dir") in str(e.value)


def test_a_missing_file_in_an_existing_directory_is_checked_when_the_job_starts(tmp_path):
    later = tmp_path / "written-later.txt"
    source = Sources.files(str(later))
    later.write_text("1\n")
    assert run(source) == ["1"]


# --- in the Spark backfill -------------------------------------------------------------------

@pytest.mark.spark
@pytest.mark.integration
def test_a_missing_path_fails_the_backfill_naming_the_path(spark_runner, tmp_path):  # noqa: F811
    missing = str(tmp_path / "missing.jsonl")
    p = Pipeline()
    p.read_from(Sources.json_lines(missing)).write_to(Sinks.list("out"))
    with Member() as m:
        with pytest.raises(FileNotFoundError) as e:
            spark_runner.run(p, member=m)
    assert repr(missing) in str(e.value) and "check the path" in str(e.value)


@pytest.mark.spark
@pytest.mark.integration
def test_a_directory_source_reads_the_same_files_in_the_backfill(spark_runner,  # noqa: F811
                                                                    tmp_path):
    fill_directory(tmp_path / "data", "json_lines")
    p = Pipeline()
    p.read_from(Sources.json_lines(str(tmp_path / "data"))).write_to(Sinks.list("out"))
    with Member() as m:
        spark_runner.run(p, member=m)
        assert [r["v"] for r in m.get_list("out")] == [1, 2, 3, 4]
