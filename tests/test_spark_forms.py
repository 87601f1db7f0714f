"""Every stage and every connector of jetwake declares its form on the Spark backfill, or says
it has none: a transform class without ``add_to_spark`` fails when it is defined, a connector
that builds a Source or Sink without ``spark=`` fails here, and the backfill refuses what has
no form with the reason before any Spark session starts (no pyspark needed)."""

from __future__ import annotations

import ast
import inspect
import os

import pytest

from jetwake import Pipeline, PipelineError, Sinks, Source, Sources, TestSources
from jetwake.engine.backfill.connector_forms import SparkReader, SparkWriter
from jetwake.engine.backfill.translate import Translator, check_pipeline
from jetwake.engine.core.meta_supplier import ProcessorMetaSupplier
from jetwake.engine.pipeline import transforms
from jetwake.engine.pipeline.spark_form import NotOnSpark
from jetwake.engine.processors.pass_through import PassThroughProcessor

CONNECTORS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "connectors")


def _transform_classes() -> list[type]:
    found, todo = [], [transforms.Transform]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def test_every_transform_declares_its_spark_form():
    classes = _transform_classes()
    assert len(classes) >= 15
    for cls in classes:
        form = cls.__dict__.get("add_to_spark")
        assert form is not None, f"{cls.__qualname__} has no add_to_spark"
        if isinstance(form, NotOnSpark):
            continue
        # a method naming one of the backfill's builders, which exists
        called = [n.func.attr for n in ast.walk(ast.parse(inspect.getsource(form).strip()))
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and isinstance(n.func.value, ast.Name) and n.func.value.id == "backfill"]
        assert called and all(callable(getattr(Translator, name, None)) for name in called), \
            f"{cls.__qualname__}.add_to_spark calls {called}"


def test_a_transform_class_without_a_spark_form_fails_when_defined():
    with pytest.raises(TypeError, match="add_to_spark"):
        class NoSparkForm(transforms.Transform):  # noqa: F841 - defining it is the test
            def add_to_dag(self, planner):
                pass


def _source_and_sink_calls(path: str) -> list[ast.Call]:
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name) and n.func.id in ("Source", "Sink")]


def test_every_connector_brings_a_spark_reader_or_writer_or_says_it_has_none():
    checked = 0
    for folder, _, files in os.walk(CONNECTORS):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            for call in _source_and_sink_calls(path):
                checked += 1
                assert any(k.arg == "spark" for k in call.keywords), \
                    f"{os.path.relpath(path, CONNECTORS)}:{call.lineno}: {call.func.id}(...) " \
                    "without spark=: give it a Spark reader or writer, or NotOnSpark(reason)"
    assert checked >= 15


def test_the_catalogues_give_readers_writers_or_reasons(tmp_path):
    kafka = {"bootstrap.servers": "127.0.0.1:9"}
    sources = [Sources.items([1]), Sources.files(str(tmp_path)), Sources.parquet(str(tmp_path)),
               Sources.json_lines(str(tmp_path)), Sources.map("m"), Sources.kafka("t", kafka)]
    sinks = [Sinks.map("m"), Sinks.map_with_merging("m", lambda a, b: b), Sinks.list("l"),
             Sinks.files(str(tmp_path)), Sinks.noop(), Sinks.logger(), Sinks.kafka("t", kafka)]
    assert all(isinstance(s.spark, SparkReader) for s in sources)
    assert all(isinstance(s.spark, SparkWriter) for s in sinks)
    for s in (Sources.map_journal("m"), TestSources.items([1]), TestSources.partitioned([[1]]),
              TestSources.item_stream(10)):
        assert isinstance(s.spark, NotOnSpark), s


def test_the_backfill_refuses_what_has_no_spark_form_with_the_reason():
    p = Pipeline()
    p.read_from(TestSources.items([1])).write_to(Sinks.noop())
    with pytest.raises(PipelineError, match="cannot be read by a backfill: a test source"):
        check_pipeline(p, None)
    p = Pipeline()
    p.read_from(Source("mine", ProcessorMetaSupplier.of(lambda: PassThroughProcessor(), 1))) \
        .write_to(Sinks.noop())
    with pytest.raises(PipelineError, match=r"no Spark reader \(Source\(spark=\.\.\.\)\)"):
        check_pipeline(p, None)
    p = Pipeline()
    p.read_from(Sources.items([1])).custom_transform("mine", PassThroughProcessor) \
        .write_to(Sinks.noop())
    with pytest.raises(PipelineError, match="'mine' is a custom_transform"):
        check_pipeline(p, None)
