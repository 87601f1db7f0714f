"""Conformance through SIGKILLs: a member process running a drawn spec's job exactly-once is
killed with SIGKILL at random moments and started again on its data directory; the job
resumes from its last snapshot and, once completed, every sink holds exactly what the
reference model says (tests/reference/): nothing lost, nothing twice, and every event the
model calls late routed to its late sink, also when it arrives after a restore.

The runtime is ``reference.process_runtimes.run_with_kills`` (the member process is
tests/support/conformance_process.py): the sinks are maps numbering each item's occurrences (a
named list does not survive its process), the sources ``TestSources.partitioned``'s
processor read at a pace that makes the job last about three seconds. ``late_events``
metrics are per execution: only checked to be at most the model's count for the whole run (the
late sinks are compared exactly).

The kill moments come from a session seed (random, or ``JETWAKE_KILL_SEED``) mixed with the
example; every failure message names it and ``JETWAKE_KILL_SEED=<seed>`` repeats the moments
(with hypothesis's printed example: the kills are as repeatable as timing allows). A small
budget by default (12 examples); ``JETWAKE_CONFORMANCE_EXAMPLES=N`` (``make conformance``) runs
N // 4.
"""

from __future__ import annotations

import os
import random
import zlib

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from reference.generate import scenarios
from reference.model import run_model
from reference.process_runtimes import KillRun, kill_expected, run_with_kills
from reference.result import difference

pytestmark = [pytest.mark.integration, pytest.mark.faults]

EXAMPLES = int(os.environ.get("JETWAKE_CONFORMANCE_EXAMPLES") or 0)
KILL_EXAMPLES = max(EXAMPLES // 4, 12) if EXAMPLES else 12
# no shrinking: a run takes seconds and a failure may hang on the kill moments; the failing
# example is printed as drawn
kills_budget = settings(
    max_examples=KILL_EXAMPLES, deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])

BASE_SEED = int(os.environ.get("JETWAKE_KILL_SEED") or random.SystemRandom().randrange(2**32))


def _seed(spec: dict, inputs: dict) -> int:
    """The kill seed of one example: the session's base seed and the example."""
    return BASE_SEED ^ zlib.crc32(repr((spec, inputs)).encode())


def assert_survives_kills(run: KillRun, spec: dict, inputs: dict) -> None:
    where = f"{run.describe()} (base seed {BASE_SEED}: repeat with JETWAKE_KILL_SEED={BASE_SEED})"
    assert run.resumed_mid_job >= 1, f"no start resumed the job from a snapshot mid-run: {where}"
    assert not run.gaps, f"items whose earlier occurrences are missing: {run.gaps[:5]}; {where}"
    diff = difference(kill_expected(spec, inputs), run.result)
    if diff:
        pytest.fail(f"{diff}\n{where}")
    model = run_model(spec, inputs).late_counts
    over = {k: (n, model.get(k, 0)) for k, n in run.last_late_counts.items()
            if n > model.get(k, 0)}
    assert not over, f"late_events of the last execution above the model's (got, model): " \
        f"{over}; {where}"


@pytest.mark.timeout(120 + 20 * KILL_EXAMPLES)
@kills_budget
@given(scenario=st.one_of(scenarios(), scenarios(one_partition=True)))
def test_a_member_killed_and_restarted_under_exactly_once_emits_what_the_model_says(
        tmp_path_factory, scenario):
    spec, inputs = scenario
    run = run_with_kills(spec, inputs, tmp_path_factory.mktemp("kill"), _seed(spec, inputs))
    assert_survives_kills(run, spec, inputs)


def late_after_restore() -> tuple[dict, dict]:
    """One partition read directly, so the model fixes every late verdict; hundreds of events
    beyond the lag, spread over the whole run: those after a restore must be judged late by
    the restored watermark (a tumbling window, a session window and a ttl)."""
    records = []
    for i in range(400):
        t = 1_000 + 10 * i
        if i % 7 == 3:
            t -= 200  # beyond the lag of 50: late at every stage below
        records.append((t, f"k{i % 3}", i % 10, i))
    spec = {"sources": [{"name": "a", "lag": 50}],
            "stages": [{"id": "w", "kind": "window", "inputs": ["a"],
                        "window": ["tumbling", 100], "keyed": True, "ops": ["count_sum"],
                        "late_sink": True},
                       {"id": "s", "kind": "window", "inputs": ["a"], "window": ["session", 20],
                        "keyed": False, "ops": ["count"], "late_sink": True},
                       {"id": "ms", "kind": "map_stateful", "inputs": ["a"], "ttl": 100,
                        "on_evict": False}]}
    return spec, {"partitions": {"a": [records]}, "build": []}


def test_events_late_after_a_restore_go_to_the_late_sink_exactly_once(tmp_path):
    spec, inputs = late_after_restore()
    expected = kill_expected(spec, inputs)
    assert sum(expected.late_items["w"].values()) > 50  # the example has late events
    run = run_with_kills(spec, inputs, tmp_path, _seed(spec, inputs), kills=3, order="sequential")
    assert_survives_kills(run, spec, inputs)
