"""Spark for the tests: one local SparkSession (two cores) shared by every Spark test of the
session, and helpers that run one pipeline on Spark and on an embedded member.

Import the fixture into a test module: ``from support.spark_fixtures import spark_runner``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import pytest

from jetwake import Member, Pipeline


@pytest.fixture(scope="session")
def spark_runner():
    """A SparkRunner on one shared ``local[2]`` session, stopped at the end of the session."""
    pytest.importorskip("pyspark")
    from jetwake import SparkRunner

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only
    runner = SparkRunner(master="local[2]", conf={
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
        "spark.driver.memory": "1g"})
    runner.spark.sparkContext.setLogLevel("ERROR")
    yield runner
    runner.stop()


def run_on_member(build: Callable[[Pipeline], None], lists: list[str]) -> dict[str, list]:
    """Builds a pipeline with ``build`` and runs it to completion on an embedded member;
    returns the contents of the named lists it wrote."""
    p = Pipeline()
    build(p)
    with Member() as m:
        m.new_job(p).join(timeout=60)
        return {name: list(m.get_list(name)) for name in lists}


def run_on_spark(runner: Any, build: Callable[[Pipeline], None],
                 lists: list[str]) -> tuple[dict[str, list], Any]:
    """The same on Spark: the lists written into an embedded member, and the run's result."""
    p = Pipeline()
    build(p)
    with Member() as m:
        result = runner.run(p, member=m)
        return {name: list(m.get_list(name)) for name in lists}, result


def canonical(items: list) -> list:
    """``items`` in a canonical order (a stage's output order across processors is not part of
    its meaning), compared by repr so that mixed types sort."""
    return sorted(items, key=repr)
