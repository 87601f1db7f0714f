"""Conformance: every runtime emits exactly what the reference model says (tests/reference/).

Hypothesis draws a pipeline spec and its inputs (partitions skewed in event time, disorder
within and beyond the lag, quiet gaps, hot keys, one or two sources), the model computes what
each stage must emit and which events are late where, and each runtime in
``reference.runners.RUNTIMES`` runs the same job: every sink's items, every late-events sink
and every ``late_events`` metric must equal the model's. Inputs whose outcome depends on
timing no test controls (an event beyond its own partition's lag whose fate depends on how
far the other partitions have been read) are not drawn; see tests/reference/model.py.

A small budget by default; ``JETWAKE_CONFORMANCE_EXAMPLES=300`` (``make conformance``) for a
thorough run.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from reference.generate import joined_backlogs, model_of, scenarios, skewed_partitions
from reference.model import expected_run
from reference.result import difference
from reference.runners import RUNTIMES, Runtime, run_on_member, run_on_member_items

EXAMPLES = int(os.environ.get("JETWAKE_CONFORMANCE_EXAMPLES") or 0)
conformance = settings(
    max_examples=EXAMPLES or 25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large])


def assert_conforms(runtime: Runtime, spec: dict, inputs: dict) -> None:
    """The run of ``spec`` on ``runtime`` equals the model's, or the test fails showing how."""
    diff = difference(expected_run(model_of(spec, inputs)), runtime(spec, inputs))
    if diff:
        pytest.fail(diff)


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@conformance
@given(scenario=scenarios())
def test_a_runtime_emits_what_the_model_says(runtime, scenario):
    assert_conforms(RUNTIMES[runtime], *scenario)


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@conformance
@given(scenario=scenarios(beyond_lag=False))
def test_an_input_that_keeps_to_the_lag_has_no_late_event(runtime, scenario):
    spec, inputs = scenario
    run = RUNTIMES[runtime](spec, inputs)
    assert run.total_late == 0 and not any(run.late_items.values())
    assert difference(expected_run(model_of(spec, inputs)), run) == ""


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@conformance
@given(scenario=scenarios(one_partition=True))
def test_a_runtime_judges_events_beyond_the_lag_of_one_partition_as_the_model_does(
        runtime, scenario):
    assert_conforms(RUNTIMES[runtime], *scenario)


@conformance
@given(scenario=scenarios(one_partition=True))
def test_sources_items_as_one_partition_per_source_emits_what_the_model_says(scenario):
    assert_conforms(run_on_member_items, *scenario)


# --- hand-written examples -----------------------------------------------------------------------

def skewed_backlog() -> tuple[dict, dict]:
    """Six partitions after downtime, each 10 s of event time behind the previous one, with
    disorder within the lag: under one watermark over all of them, every record read after a
    later partition's would be late."""
    parts = skewed_partitions(6, 60, 50_000, 10_000)
    spec = {"sources": [{"name": "a", "lag": 60}],
            "stages": [{"id": "w", "kind": "window", "inputs": ["a"],
                        "window": ["sliding", 1_000, 500], "keyed": True, "ops": ["count_sum"],
                        "late_sink": True}]}
    return spec, {"partitions": {"a": parts}, "build": []}


@pytest.mark.parametrize("order", ["round_robin", "sequential", "random"])
def test_a_skewed_backlog_of_six_partitions_has_no_late_event(order):
    spec, inputs = skewed_backlog()
    run = run_on_member(spec, inputs, order=order)
    assert run.late_counts == {"w": 0}
    assert difference(expected_run(model_of(spec, inputs)), run) == ""


@pytest.mark.parametrize("runtime", [run_on_member_items, run_on_member],
                         ids=["items", "partitioned"])
def test_one_partition_drops_exactly_the_events_behind_its_rounded_watermark(runtime):
    # tumbling 100, lag 10: after 250 the watermark is 200; 120 is late, 205 is not
    spec = {"sources": [{"name": "a", "lag": 10}],
            "stages": [{"id": "w", "kind": "window", "inputs": ["a"],
                        "window": ["tumbling", 100], "keyed": False, "ops": ["count"],
                        "late_sink": True}]}
    inputs = {"partitions": {"a": [[(0, "k", 1, 0), (250, "k", 2, 1), (120, "k", 3, 2),
                                    (205, "k", 4, 3)]]}, "build": []}
    run = runtime(spec, inputs)
    assert run.late_counts == {"w": 1}
    assert list(run.late_items["w"]) == [(120, "k", 3, 2)]
    assert difference(expected_run(model_of(spec, inputs)), run) == ""


def ttl_boundary() -> tuple[dict, dict]:
    """k0's second record comes exactly the ttl (100) behind the watermark (1100): on time, and
    its state, last touched exactly the ttl before that watermark, is kept (Jet's rule)."""
    spec = {"sources": [{"name": "a", "lag": 0}],
            "stages": [{"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": 100,
                        "on_evict": True},
                       {"id": "w", "kind": "window", "inputs": ["a"], "window": ["tumbling", 10],
                        "keyed": False, "ops": ["count"], "late_sink": False}]}
    records = [(1000, "k0", 1, 0), (1100, "k1", 1, 1), (1000, "k0", 1, 2), (1100, "k0", 1, 3)]
    return spec, {"partitions": {"a": [records]}, "build": []}


def test_a_state_exactly_the_ttl_behind_the_watermark_is_kept_for_the_keys_next_event():
    spec, inputs = ttl_boundary()
    run = run_on_member_items(spec, inputs)
    assert (1100, "k0", 3, 3) in run.outputs["ms"]  # k0's one state: the sum of its three
    assert difference(expected_run(model_of(spec, inputs)), run) == ""


@pytest.mark.parametrize("order", ["round_robin", "sequential", "random"])
def test_joins_of_two_skewed_backlogs_emit_every_pair_once_and_no_late_event(order):
    spec, inputs = joined_backlogs()
    run = run_on_member(spec, inputs, order=order)
    assert run.late_counts == {"ij": 0, "aj": 0}
    assert sum(run.outputs["ij"].values()) == 495 and sum(run.outputs["aj"].values()) == 120
    assert difference(expected_run(model_of(spec, inputs)), run) == ""
