"""Stateless stages fused onto an edge still answer for themselves: an exception names the stage
the user wrote (with its traceback), the job's metrics count each stage's items, and each kind
of transform plans itself."""

from __future__ import annotations

import json
import traceback

import pytest
from prometheus_client import CollectorRegistry
from support.waiting import wait_until

from jetwake import (
    AggregateOperations as Ops, Member, Pipeline, PipelineError, Sinks, Sources, TestSources,
)
from jetwake.engine.core.dag import RoutingPolicy
from jetwake.engine.core.stream_items import ITEM, timestamped
from jetwake.engine.pipeline.fusion import FusedChain, stateless_function, stateless_step
from jetwake.engine.pipeline.transforms import Transform
from jetwake.engine.server.metrics import JetwakeCollector

TIMEOUT = 30


def parse_json(line):
    return json.loads(line)


def failed_job(p: Pipeline, **member_args):
    """Runs ``p`` to its failure: (the exception join() raised, the job's failure text)."""
    with Member(**member_args) as m:
        job = m.new_job(p)
        with pytest.raises(Exception) as e:
            job.join(timeout=TIMEOUT)
        return e.value, job.failure


# --- errors ----------------------------------------------------------------------------------

def test_an_exception_in_a_fused_map_names_the_stage_and_keeps_the_users_traceback():
    p = Pipeline()
    p.read_from(Sources.items(['{"a": 1}', "not json", '{"b": 2}'])) \
        .map(parse_json).set_name("parse-json").write_to(Sinks.list("out"))
    error, failure = failed_job(p)
    assert isinstance(error, json.JSONDecodeError)  # the user's own exception
    where = "in stage 'parse-json' (map) fused into vertex 'items'"
    assert where in failure
    assert any(where in note for note in error.__notes__)
    frames = [f.name for f in traceback.extract_tb(error.__traceback__)]
    assert "parse_json" in frames


def test_the_stage_that_raised_is_named_not_the_fused_stages_around_it():
    def explode(x):
        if x == 7:
            raise ZeroDivisionError("seven")
        return [x]

    p = Pipeline()
    (p.read_from(Sources.items(range(20)))
      .filter(lambda x: x % 2 == 1).set_name("odd")
      .flat_map(explode).set_name("explode")
      .map(str).set_name("format")
      .write_to(Sinks.list("out")))
    error, failure = failed_job(p)
    assert isinstance(error, ZeroDivisionError)
    assert "in stage 'explode' (flat_map) fused into vertex 'items'" in failure
    assert "'odd'" not in failure and "'format'" not in failure


def test_an_exception_in_a_fused_stage_on_timestamped_items_names_that_stage():
    def enrich(e):
        if e[1] == "bad":
            raise KeyError("no such user")
        return e

    p = Pipeline()
    (p.read_from(Sources.items([(1, "a"), (2, "bad")]))
      .with_timestamps(lambda e: e[0], allowed_lag=0)
      .map(enrich).set_name("enrich")
      .write_to(Sinks.list("out")))
    error, failure = failed_job(p)
    assert isinstance(error, KeyError)
    assert "in stage 'enrich' (map) fused into vertex 'timestamps'" in failure


# --- metrics ---------------------------------------------------------------------------------

def run_metrics(p: Pipeline, **member_args) -> dict:
    with Member(**member_args) as m:
        job = m.new_job(p)
        job.join(timeout=TIMEOUT)
        return job.metrics()


def test_job_metrics_count_items_in_and_out_of_each_fused_stage():
    p = Pipeline()
    (p.read_from(Sources.items(range(1000)))
      .map(lambda x: x + 1).set_name("plus-one")
      .filter(lambda x: x % 3 == 0).set_name("thirds")
      .flat_map(lambda x: [x, x]).set_name("twice")
      .write_to(Sinks.list("out")))
    metrics = run_metrics(p)
    assert metrics["plus-one"] == {"items_in": 1000, "items_out": 1000}
    assert metrics["thirds"] == {"items_in": 1000, "items_out": 333}
    assert metrics["twice"] == {"items_in": 333, "items_out": 666}
    # the vertices count as before: the source emitted 1000, the sink received 666
    assert metrics["items"]["items_out"] == 1000
    assert metrics["list-sink-out"]["items_in"] == 666


def test_a_fused_stage_feeding_two_sinks_is_counted_once():
    p = Pipeline()
    doubled = p.read_from(Sources.items(range(100))).map(lambda x: 2 * x).set_name("double")
    doubled.write_to(Sinks.list("a"))
    doubled.write_to(Sinks.list("b"))
    metrics = run_metrics(p)
    assert metrics["double"] == {"items_in": 100, "items_out": 100}
    assert metrics["list-sink-a"]["items_in"] == metrics["list-sink-b"]["items_in"] == 100


def test_fused_stage_counts_are_summed_over_the_processors_of_their_vertex():
    p = Pipeline()
    (p.read_from(Sources.items([f"k{i % 50}" for i in range(5000)]))
      .group_by(lambda k: k).aggregate(Ops.counting())
      .map(lambda kv: f"{kv[0]}={kv[1]}").set_name("format")
      .write_to(Sinks.list("out")))
    metrics = run_metrics(p, local_parallelism=2)
    # the combine vertex runs on two processors; its 50 results pass the fused stage once each
    assert metrics["format"] == {"items_in": 50, "items_out": 50}


def test_prometheus_exports_items_in_and_out_of_each_fused_stage():
    p = Pipeline()
    (p.read_from(TestSources.item_stream(2000))
      .filter(lambda e: e.sequence % 2 == 0).set_name("even")
      .write_to(Sinks.list("out")))
    registry = CollectorRegistry(auto_describe=False)
    with Member() as m:
        registry.register(JetwakeCollector(m))
        job = m.new_job(p)
        labels = {"job": job.name, "job_id": job.id, "stage": "even", "kind": "filter",
                  "vertex": "item-stream"}

        def counted():
            got_in = registry.get_sample_value("jetwake_stage_items_in_total", labels)
            got_out = registry.get_sample_value("jetwake_stage_items_out_total", labels)
            return (got_in, got_out) if got_in and got_in >= 100 else None

        items_in, items_out = wait_until(counted,
                                         what="the fused stage's counters", timeout=TIMEOUT)
        # about half pass the filter (the two samples are read a moment apart)
        assert 0 < items_out <= items_in
        # a fused stage is not a vertex: the vertex families do not list it
        assert registry.get_sample_value("jetwake_vertex_items_in_total",
                                         {"job": job.name, "job_id": job.id,
                                          "vertex": "even"}) is None
        job.cancel()


def test_a_fused_stage_named_like_a_vertex_of_another_stage_is_refused():
    p = Pipeline()
    (p.read_from(Sources.items([1]))
      .map(str).set_name("count-accumulate")
      .group_by(lambda x: x).aggregate(Ops.counting()).set_name("count")
      .write_to(Sinks.list("out")))
    with pytest.raises(PipelineError, match="'count-accumulate'.*set_name"):
        p.to_dag(2)


# --- planning --------------------------------------------------------------------------------

def test_a_stateless_stage_after_a_keyed_rebalance_gets_the_rebalanced_items():
    p = Pipeline()
    (p.read_from(Sources.items(range(1000))).rebalance(lambda x: x % 10)
      .map(lambda x: x * 2).set_name("double").write_to(Sinks.list("out")))
    dag = p.to_dag(2)
    # the map cannot run before the routing (the key reads the items before the map): it gets
    # a vertex of its own, and the rebalance's routing is on the edge into it
    (edge,) = [e for e in dag.edges if e.destination.name == "double"]
    assert edge.routing is RoutingPolicy.PARTITIONED and edge.is_distributed
    with Member(local_parallelism=2) as m:
        m.new_job(p).join(timeout=TIMEOUT)
        assert sorted(m.get_list("out")) == [2 * x for x in range(1000)]


def test_every_transform_class_must_plan_itself():
    with pytest.raises(TypeError, match="add_to_dag"):
        class Unplanned(Transform):  # noqa: F841 - defining it is the test
            pass


def test_stateless_semantics_are_the_same_on_plain_and_timestamped_items():
    fns = {"map": lambda x: None if x == 3 else x * 10,
           "filter": lambda x: x % 2 == 0,
           "flat_map": lambda x: None if x == 1 else [x] * x}
    items = [1, 2, 3, 4]
    for kind, fn in fns.items():
        plain = stateless_function(kind, fn)(items)
        stamped = stateless_function(kind, fn, timestamped=True)(
            [timestamped(100 + x, x) for x in items])
        assert [v[ITEM] for v in stamped] == plain, kind
    # each result keeps the timestamp of the item it came from
    assert stateless_function("flat_map", fns["flat_map"], True)(
        [timestamped(7, 2), timestamped(9, 3)]) == [(7, 2), (7, 2), (9, 3), (9, 3), (9, 3)]
    assert stateless_function("map", fns["map"], True)(
        [timestamped(7, 2), timestamped(8, 3)]) == [(7, 20)]


def test_a_fused_chain_called_directly_applies_its_stages_and_counts_per_chunk():
    chain = FusedChain([stateless_step("inc", "map", lambda x: x + 1, False),
                        stateless_step("even", "filter", lambda x: x % 2 == 0, False)], "src")
    assert chain([1, 2, 3]) == [2, 4]
    assert chain([5]) == [6]
    assert [(s.stage, i, o) for s, i, o in chain.stage_counts()] == [("inc", 4, 4),
                                                                    ("even", 4, 3)]
    # each processor gets an instance with its own counters
    other = chain.for_processor()
    assert other is not chain and [c for _, c, _ in other.stage_counts()] == [0, 0]
