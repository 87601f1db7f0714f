"""TestSources.items with its ABORT() and WAIT_FOR_SNAPSHOT() sentinels, in real jobs on an
embedded member: a job fails at a chosen item, restarts from its last snapshot and replays."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from jetwake.engine.core.errors import RestartableError
from jetwake import (
    AggregateOperations as ops, BroadcastKey, JobConfig, JobStateError, JobStatus, Member,
    Pipeline, Sinks, Sources,
)
from jetwake.testing import TestAbort, TestSources
from support.waiting import wait_until

TIMEOUT = 60
ABORT, WAIT_FOR_SNAPSHOT = TestSources.ABORT, TestSources.WAIT_FOR_SNAPSHOT


class Recorder:
    """Counts the items a map stage right after the source sees, and the job's restarts.

    The map runs with the source (stateless stages are fused with it), so it sees every item
    the source emits, including those emitted again after a restore.
    """

    def __init__(self) -> None:
        self.seen: Counter = Counter()
        self.events: list[str] = []
        self.job_ids: list[str] = []
        self.lock = threading.Lock()

    def see(self, x):
        with self.lock:
            self.seen[x] += 1
        return x

    def listen(self, job_id: str, _name: str, event: str) -> None:
        with self.lock:
            self.events.append(event)
            if event == "starting" and job_id not in self.job_ids:
                self.job_ids.append(job_id)

    @property
    def restarts(self) -> int:
        return sum(1 for e in self.events if e.startswith("restarting"))


def run(items, guarantee="exactly_once", sink=None, interval_ms=200, recorder=None,
        map_fn=None):
    """Runs items -> map -> sink and returns (member contents, recorder, job)."""
    rec = recorder or Recorder()
    p = Pipeline()
    stage = p.read_from(TestSources.items(items)).map(map_fn or rec.see)
    with Member() as m:
        m.add_listener(rec.listen)
        if sink == "list":
            stage.write_to(Sinks.list("out"))
        else:
            stage.map(lambda x: (x, x * 10)).write_to(Sinks.map("out"))
        job = m.new_job(p, JobConfig(processing_guarantee=guarantee,
                                     snapshot_interval_ms=interval_ms))
        job.join(timeout=TIMEOUT)
        out = list(m.get_list("out")) if sink == "list" else dict(m.get_map("out").items())
    return out, rec, job


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_abort_after_a_committed_snapshot_replays_the_items_after_it(guarantee):
    wait, abort = WAIT_FOR_SNAPSHOT(), ABORT()
    items = [*range(50), wait, *range(50, 100), abort, *range(100, 150)]
    out, rec, job = run(items, guarantee)
    assert job.status is JobStatus.COMPLETED
    assert rec.restarts == 1
    # restored from the snapshot at position 50: 0..49 never again, 50..99 emitted twice
    assert all(rec.seen[x] == 1 for x in range(50)), rec.seen
    assert all(rec.seen[x] == 2 for x in range(50, 100)), rec.seen
    assert all(rec.seen[x] == 1 for x in range(100, 150)), rec.seen
    assert out == {x: x * 10 for x in range(150)}  # the idempotent sink's output is complete


def test_the_sentinels_are_never_emitted_and_an_exactly_once_sink_writes_each_item_once():
    items = [*range(30), WAIT_FOR_SNAPSHOT(), *range(30, 60), ABORT(), *range(60, 90)]
    out, rec, _ = run(items, sink="list")
    assert rec.restarts == 1
    assert sorted(out) == list(range(90))  # no sentinel, no duplicate, nothing lost
    assert set(rec.seen) == set(range(90))


def test_each_abort_restarts_the_job_exactly_once():
    aborts = [ABORT(), ABORT(), ABORT()]
    items = [*range(10), aborts[0], *range(10, 20), aborts[1], aborts[2], *range(20, 30)]
    out, rec, job = run(items)
    assert job.status is JobStatus.COMPLETED
    assert rec.restarts == 3
    assert all(a.done for a in aborts)
    assert out == {x: x * 10 for x in range(30)}


def test_an_abort_without_a_snapshot_before_it_restarts_the_job_from_the_start():
    out, rec, _ = run([*range(20), ABORT(), *range(20, 40)], interval_ms=60_000)
    assert rec.restarts == 1
    assert all(rec.seen[x] == 2 for x in range(20))  # replayed from the start
    assert all(rec.seen[x] == 1 for x in range(20, 40))
    assert out == {x: x * 10 for x in range(40)}


def test_wait_for_snapshot_holds_the_items_after_it_until_a_snapshot_of_the_items_before_it_committed():
    rec = Recorder()
    seen_at_50: list = []

    def see(x):
        if x == 50 and not seen_at_50:
            # the source emits 50 only after the snapshot holding 0..49 committed: it is in the
            # store already, with the source's saved position at the sentinel
            store = member_box[0].snapshot_store
            latest = store.latest(rec.job_ids[0])
            seen_at_50.append(latest)
            if latest is not None:
                saved = store.read(latest)
                seen_at_50.append([v for entries in saved.values() for k, v in entries
                                   if type(k) is BroadcastKey and k.key == ("items", 0)])
        return rec.see(x)

    member_box: list = []
    p = Pipeline()
    p.read_from(TestSources.items([*range(50), WAIT_FOR_SNAPSHOT(), *range(50, 80)])) \
        .map(see).write_to(Sinks.list("out"))
    with Member() as m:
        member_box.append(m)
        m.add_listener(rec.listen)
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                     snapshot_interval_ms=300))
        job.join(timeout=TIMEOUT)
        out = list(m.get_list("out"))
    assert seen_at_50[0] is not None, "item 50 was emitted before any snapshot committed"
    assert seen_at_50[1] == [50]  # the source's saved position: the sentinel's index
    assert out == list(range(80))
    assert rec.restarts == 0


def test_abort_in_a_job_without_a_processing_guarantee_fails_at_start_naming_the_fix():
    p = Pipeline()
    p.read_from(TestSources.items([1, ABORT(), 2])).write_to(Sinks.list("out"))
    with Member() as m:
        with pytest.raises(ValueError, match=r"ABORT\(\).*processing_guarantee='none'.*"
                                             r"exactly_once"):
            m.new_job(p, JobConfig(processing_guarantee="none"))


def test_wait_for_snapshot_without_snapshots_fails_at_start_naming_the_fix():
    p = Pipeline()
    p.read_from(TestSources.items([1, WAIT_FOR_SNAPSHOT(), 2])).write_to(Sinks.list("out"))
    with Member() as m:
        with pytest.raises(ValueError, match=r"WAIT_FOR_SNAPSHOT\(\).*would wait for ever"):
            m.new_job(p)


def test_items_without_sentinels_run_like_sources_items_without_a_guarantee():
    out, rec, job = run(list(range(100)), guarantee="none", sink="list")
    assert out == list(range(100))
    assert rec.restarts == 0 and job.status is JobStatus.COMPLETED


def test_items_rejects_what_is_not_a_collection_of_items():
    with pytest.raises(TypeError, match="iterable of items"):
        TestSources.items("abc")


def test_test_abort_is_a_restartable_error():
    from jetwake.engine.core.errors import RestartableError
    assert issubclass(TestAbort, RestartableError)


def test_an_aggregation_that_finished_before_the_snapshot_is_not_counted_twice_after_an_abort():
    # one branch finishes (its aggregation emits its counts) while the other waits at the
    # sentinel; the snapshot taken then holds the finished aggregation's final state, and the
    # abort restores it
    p = Pipeline()
    (p.read_from(Sources.items([f"w{i % 5}" for i in range(100)]))
      .group_by(lambda w: w).aggregate(ops.counting()).write_to(Sinks.map("counts")))
    (p.read_from(TestSources.items([*range(10), WAIT_FOR_SNAPSHOT(), *range(10, 20), ABORT(),
                                    *range(20, 30)]))
      .map(lambda x: (x, x)).write_to(Sinks.map("other")))
    rec = Recorder()
    with Member() as m:
        m.add_listener(rec.listen)
        job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                     snapshot_interval_ms=600_000))
        counts = m.get_map("counts")
        # the aggregation has emitted every count: it has finished
        wait_until(lambda: len(counts) >= 5, timeout=TIMEOUT,
                   what="the aggregation branch to finish")
        try:
            job.take_snapshot()
        except (JobStateError, RestartableError) as e:
            # committed; the source passed the sentinel and aborted during phase 2, which the
            # snapshot reports as the job stopping (JobStateError) or, when the abort is seen
            # before the execution counts as stopped, as a phase 2 that the restart completes
            assert "committed" in str(e) or "stopped" in str(e) or "ended" in str(e), e
        job.join(timeout=TIMEOUT)
        counts = dict(counts.items())
        other = dict(m.get_map("other").items())
    assert rec.restarts == 1
    assert counts == {f"w{i}": 20 for i in range(5)}
    assert other == {x: x for x in range(30)}
