"""Upgrades you can check: what a job started from an exported snapshot does with its saved
state (the dry run's plan), the refusal of a job that would drop state and its start with
allow_state_drop, and migrate= converting each saved state of map_stateful and
rolling_aggregate as it is restored (in memory and from RocksDB checkpoint files)."""

from __future__ import annotations

import pytest

from jetwake import AggregateOperation, AggregateOperations, JobConfig, Member, Pipeline, Sinks
from jetwake.engine.core.errors import StateDropRefusedError, StateMigrationError
from jetwake.engine.core.processor import BroadcastKey
from jetwake.engine.jobs.upgrade_plan import UpgradePlan
from support.snapshot_fixtures import counting_source
from support.waiting import wait_until

KEYS = 5
MORE = 200  # items the upgraded job reads after the snapshot's position


def add_to_list(state, key, x):
    """Version 1 of the totals: the state is [sum]."""
    state[0] += x
    return key, state[0]


def add_to_dict(state, key, x):
    """Version 2: the state is {"sum": ..., "since_upgrade": ...}."""
    state["sum"] += x
    state["since_upgrade"] += 1
    return key, dict(state)


def v1(limit=None, name="totals"):
    p = Pipeline()
    (p.read_from(counting_source(limit)).group_by(lambda x: x % KEYS)
      .map_stateful(lambda: [0], add_to_list).set_name(name)
      .write_to(Sinks.map("totals-v1")))
    return p


def v2(limit, migrate, name="totals"):
    p = Pipeline()
    (p.read_from(counting_source(limit)).group_by(lambda x: x % KEYS)
      .map_stateful(lambda: {"sum": 0, "since_upgrade": 0}, add_to_dict, migrate=migrate)
      .set_name(name)
      .write_to(Sinks.map("totals-v2")))
    return p


def from_list(old):
    """The migration of v1's states; a state already in v2's shape stays as it is."""
    return old if isinstance(old, dict) else {"sum": old[0], "since_upgrade": 0}


def config(**kw):
    return JobConfig(processing_guarantee="exactly_once", snapshot_interval_ms=50, **kw)


def export_v1(m, name="v1", backend="memory"):
    """Runs v1 until it committed a snapshot with every key's state, exports it as ``name``
    and cancels the job; returns (the source's saved position, each key's saved sum)."""
    job = m.new_job(v1(), config(name="totals-v1", state_backend=backend))
    wait_until(lambda: len(m.get_map("totals-v1")) == KEYS and job.last_snapshot is not None
               and job.last_snapshot.snapshot_id >= 1, what="v1's snapshot of every key")
    rec = job.cancel_and_export_snapshot(name)
    saved = m.snapshot_store.read(rec)
    position = next(v for k, v in saved["numbers"] if k == BroadcastKey("next"))
    return position, sums_up_to(position)


def sums_up_to(limit, start=0):
    out = {k: 0 for k in range(KEYS)}
    for i in range(start, limit):
        out[i % KEYS] += i
    return out


# --- the plan ----------------------------------------------------------------------------------

def test_a_dry_run_lists_the_state_taken_over_dropped_and_started_empty():
    with Member() as m:
        export_v1(m)
        p = Pipeline()
        numbers = p.read_from(counting_source(None))
        (numbers.group_by(lambda x: x % KEYS)
                .map_stateful(lambda: [0], add_to_list).set_name("renamed-totals")
                .write_to(Sinks.map("a")))
        (numbers.group_by(lambda x: x % 3).rolling_aggregate(AggregateOperations.counting())
                .set_name("counts").write_to(Sinks.map("b")))
        plan = m.new_job(p, JobConfig(initial_snapshot_name="v1", dry_run=True))
        assert isinstance(plan, UpgradePlan)
        assert plan.taken_over == ["numbers"]
        assert plan.dropped == ["totals"]
        assert plan.started_empty == ["renamed-totals", "counts"]
        assert plan.refused
        dropped = next(s for s in plan.stages if s.vertex == "totals")
        assert dropped.entries == KEYS + 1  # a state per key and the watermark
        assert "no stage of this name" in dropped.why
        text = plan.describe()
        assert "drops: 1 stage(s)" in text and "totals [map-stateful]" in text
        assert m.jobs()[-1].name == "totals-v1"  # nothing was submitted


def test_a_removed_stage_drops_its_state():
    with Member() as m:
        export_v1(m)
        p = Pipeline()
        p.read_from(counting_source(None)).map(lambda x: (x, x)).write_to(Sinks.map("raw"))
        plan = m.new_job(p, JobConfig(initial_snapshot_name="v1", dry_run=True))
        assert (plan.taken_over, plan.dropped, plan.started_empty) == (["numbers"], ["totals"],
                                                                       [])


def test_a_stage_whose_kind_changed_drops_its_state():
    with Member() as m:
        export_v1(m)
        p = Pipeline()
        (p.read_from(counting_source(None)).group_by(lambda x: x % KEYS)
          .rolling_aggregate(AggregateOperations.counting()).set_name("totals")
          .write_to(Sinks.map("a")))
        plan = m.plan_upgrade(p, JobConfig(initial_snapshot_name="v1"))
        assert plan.dropped == ["totals"]
        stage = next(s for s in plan.stages if s.vertex == "totals")
        assert (stage.saved_kind, stage.new_kind) == ("map-stateful", "rolling-aggregate")


def test_a_stage_whose_state_no_longer_fits_drops_it():
    with Member() as m:
        export_v1(m)
        p = Pipeline()  # the same stage, keyless now: one state for the whole stream
        (p.read_from(counting_source(None)).map_stateful(lambda: [0], lambda s, x: x)
          .set_name("totals").write_to(Sinks.noop()))
        plan = m.plan_upgrade(p, JobConfig(initial_snapshot_name="v1"))
        assert plan.dropped == ["totals"]
        why = next(s.why for s in plan.stages if s.vertex == "totals")
        assert why == "its state does not fit: it was keyed, it is keyless now"


def test_a_window_of_another_size_drops_its_frames():
    from jetwake import Sources, WindowDefinition
    from jetwake.engine.jobs.upgrade_plan import plan_upgrade, vertex_kinds
    from jetwake.snapshot.store.snapshot_store import CommitRecord

    def windows(size):
        p = Pipeline()
        (p.read_from(Sources.map_journal("events")).with_timestamps(lambda kv: kv[1], 0)
          .window(WindowDefinition.tumbling(size)).group_by(lambda kv: kv[0])
          .aggregate(AggregateOperations.counting()).set_name("per-minute")
          .write_to(Sinks.noop()))
        return p.to_dag()

    old = windows(60_000)
    kinds, shapes = vertex_kinds(old)
    # what a snapshot of the old job records: every vertex with saved entries
    rec = CommitRecord("job", "old", 3, 0.0, 0.0, name="minutes", kinds=kinds, shapes=shapes,
                       files={v.name: {"0": [2, 0, 10]} for v in old.vertices})
    assert plan_upgrade(windows(60_000), rec).dropped == []
    plan = plan_upgrade(windows(300_000), rec)
    assert plan.dropped == ["per-minute", "per-minute-accumulate"]
    why = next(s.why for s in plan.stages if s.vertex == "per-minute")
    assert why == ("its state does not fit: it was keyed, sliding size=60000 slide=60000, "
                   "it is keyed, sliding size=300000 slide=300000 now")


def test_the_same_pipeline_takes_over_every_stage():
    with Member() as m:
        export_v1(m)
        plan = m.new_job(v1(), JobConfig(initial_snapshot_name="v1", dry_run=True))
        assert plan.taken_over == ["numbers", "totals"]
        assert plan.dropped == [] and plan.started_empty == [] and not plan.refused


def test_a_job_that_would_drop_state_is_refused_then_starts_with_allow_state_drop():
    with Member() as m:
        position, _ = export_v1(m)
        renamed = v2(position + MORE, from_list, name="new-totals")
        with pytest.raises(StateDropRefusedError) as e:
            m.new_job(renamed, config(name="upgraded", initial_snapshot_name="v1"))
        msg = str(e.value)
        assert "'totals'" in msg and "set_name('totals')" in msg and "allow_state_drop" in msg
        assert m.get_job("upgraded") is None  # refused at submission: nothing left behind
        job = m.new_job(renamed, config(name="upgraded", initial_snapshot_name="v1",
                                        allow_state_drop=True))
        job.join(60)
        # the source's position was taken over, the totals started empty
        assert dict(m.get_map("totals-v2").items()) == {
            k: {"sum": s, "since_upgrade": MORE // KEYS}
            for k, s in sums_up_to(position + MORE, position).items()}


# --- migrate= ----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_migrate_converts_every_saved_state_of_map_stateful(tmp_path, backend):
    with Member(tmp_path) as m:
        position, saved = export_v1(m, backend=backend)
        # what the upgrade starts from, as inspection shows it (RocksDB: read out of its files)
        totals = next(s for s in m.inspect_snapshot("v1")["stages"] if s["vertex"] == "totals")
        assert totals["keys"] == KEYS
        assert dict(totals["sample"]) == {k: [saved[k]] for k in range(KEYS)}
        assert ("checkpoint_files" in totals) == (backend == "rocksdb")
        job = m.new_job(v2(position + MORE, from_list),
                        config(initial_snapshot_name="v1", state_backend=backend))
        job.join(60)
        new = sums_up_to(position + MORE, position)
        assert dict(m.get_map("totals-v2").items()) == {
            k: {"sum": saved[k] + new[k], "since_upgrade": MORE // KEYS} for k in range(KEYS)}
        assert job.metrics()["totals"]["migrated_keys"] == KEYS


def test_migrate_returning_none_drops_the_key_and_counts_it(tmp_path):
    with Member(tmp_path) as m:
        position, saved = export_v1(m, backend="rocksdb")
        job = m.new_job(v2(position + MORE, lambda old: None if old[0] == saved[0]
                           else from_list(old)),
                        config(initial_snapshot_name="v1", state_backend="rocksdb"))
        job.join(60)
        new = sums_up_to(position + MORE, position)
        totals = dict(m.get_map("totals-v2").items())
        assert totals[0]["sum"] == new[0]  # key 0 started again from create_fn
        assert all(totals[k]["sum"] == saved[k] + new[k] for k in range(1, KEYS))
        metrics = job.metrics()["totals"]
        assert (metrics["migrated_keys"], metrics["migrate_dropped_keys"]) == (KEYS - 1, 1)


def test_a_migrate_that_raises_fails_the_start_naming_the_stage_the_key_and_the_cause():
    def broken(old):
        raise KeyError("sum")

    with Member() as m:
        position, _ = export_v1(m)
        with pytest.raises(StateMigrationError) as e:
            m.new_job(v2(position + MORE, broken), config(name="v2", initial_snapshot_name="v1"))
        msg = str(e.value)
        assert "stage 'totals'" in msg and "of key " in msg and "KeyError" in msg
        assert m.get_job("v2").status.value == "FAILED"


def test_a_job_restoring_its_own_snapshot_does_not_migrate_again():
    with Member() as m:
        position, saved = export_v1(m)
        # this migration fails on a state of the new shape: a second pass would fail the job
        job = m.new_job(v2(None, lambda old: {"sum": old[0], "since_upgrade": 0}),
                        config(initial_snapshot_name="v1"))
        wait_until(lambda: job.last_snapshot is not None, what="the upgraded job's snapshot")
        own = job.last_snapshot.snapshot_id
        job.restart()  # restores snapshot `own` (or a newer one) of this job
        wait_until(lambda: job.last_snapshot.snapshot_id > own + 1,
                   what="a snapshot after the restart")
        assert job.status.value == "RUNNING"
        job.cancel()


def test_migrate_converts_rolling_aggregate_accumulators_keyed_and_keyless():
    def pipeline(op, limit=None, migrate=None):
        p = Pipeline()
        numbers = p.read_from(counting_source(limit))
        (numbers.group_by(lambda x: x % KEYS).rolling_aggregate(op, migrate=migrate)
                .set_name("keyed").write_to(Sinks.map("keyed")))
        (numbers.rolling_aggregate(op, migrate=migrate).set_name("keyless")
                .map(lambda total: ("all", total)).write_to(Sinks.map("keyless")))
        return p

    def accumulate(acc, x):
        acc["sum"] += x
        acc["n"] += 1
        return acc

    v2_op = AggregateOperation(create=lambda: {"sum": 0, "n": 0}, accumulate=accumulate,
                               export=lambda acc: (acc["sum"], acc["n"]))
    with Member() as m:
        job = m.new_job(pipeline(AggregateOperations.summing(lambda x: x)),
                        config(name="sums-v1"))
        wait_until(lambda: len(m.get_map("keyed")) == KEYS and job.last_snapshot is not None
                   and job.last_snapshot.snapshot_id >= 1, what="a snapshot of every key")
        rec = job.cancel_and_export_snapshot("sums")
        position = next(v for k, v in m.snapshot_store.read(rec)["numbers"]
                        if k == BroadcastKey("next"))
        job = m.new_job(pipeline(v2_op, position + MORE,
                                 lambda old: old if isinstance(old, dict)
                                 else {"sum": old, "n": 0}),
                        config(initial_snapshot_name="sums"))
        job.join(60)
        new = sums_up_to(position + MORE, position)
        before = sums_up_to(position)
        assert dict(m.get_map("keyed").items()) == {
            k: (before[k] + new[k], MORE // KEYS) for k in range(KEYS)}
        assert m.get_map("keyless")["all"] == (sum(range(position + MORE)), MORE)
        metrics = job.metrics()
        assert metrics["keyed"]["migrated_keys"] == KEYS
        assert metrics["keyless"]["migrated_keys"] == 1


def test_migrate_must_be_callable():
    p = Pipeline()
    stage = p.read_from(counting_source(10))
    with pytest.raises(TypeError, match="migrate expects a callable"):
        stage.group_by(lambda x: x).map_stateful(lambda: 0, add_to_list, migrate="v2")
    with pytest.raises(TypeError, match="migrate expects a callable"):
        stage.rolling_aggregate(AggregateOperations.counting(), migrate=1)


def test_dry_run_needs_a_snapshot_to_plan_from():
    with pytest.raises(ValueError, match="initial_snapshot_name"):
        JobConfig(dry_run=True)
