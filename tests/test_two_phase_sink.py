"""The two-phase-commit write-ahead log (engine/processors/two_phase_sink.py) through the
exactly-once list sink, driven by hand through the processor contract (no broker), and in
jobs of a real member.

A "crash" is a processor dropped without closing, followed by a new processor restored from
the entries the first one saved, writing into the same list (what a restarted job does)."""
from __future__ import annotations

import pytest

from jetwake import JobConfig, JobStatus, Member, Pipeline, Sinks, Sources
from jetwake.engine.core.meta_supplier import MetaSupplierContext, SupplierContext
from jetwake.engine.core.processor import Inbox, Outbox, ProcessorContext
from jetwake.snapshot.protocol.snapshot_context import SnapshotContext
from jetwake.testing import TestSources

ABORT, WAIT_FOR_SNAPSHOT = TestSources.ABORT, TestSources.WAIT_FOR_SNAPSHOT

VERTEX = "list-sink"


class HandDriven:
    """Sink processors made the way a job makes them (meta-supplier, supplier, init)."""

    def __init__(self, member: Member, name: str, job_id: str = "job1", *,
                 restored_id: int = -1, guarantee: str = "exactly_once", total: int = 1,
                 snapshot_capacity: int = 4096) -> None:
        sink = Sinks.list(name)
        meta = sink.meta_supplier
        meta.init(MetaSupplierContext(job_id, "job", VERTEX, total, total, 1, guarantee))
        supplier = meta.get([0])(0)
        supplier.init(SupplierContext(job_id, "job", VERTEX, total, total, 0, 1, guarantee,
                                      member))
        self.procs = list(supplier.get(total))
        self.snap = SnapshotContext(restored_id)
        for i, p in enumerate(self.procs):
            p.outbox = Outbox(0, snapshot_capacity)
            p.init(ProcessorContext(
                job_id=job_id, job_name="job", vertex_name=VERTEX, global_processor_index=i,
                local_processor_index=i, local_parallelism=total, total_parallelism=total,
                member_index=0, member_count=1, processing_guarantee=guarantee,
                snapshot=self.snap if guarantee != "none" else None, member=member))
        self.proc = self.procs[0]

    def process(self, items: list, index: int = 0) -> None:
        self.procs[index].process(0, Inbox(list(items)))

    def phase1(self, snapshot_id: int) -> list:
        """Every processor saves its state into ``snapshot_id`` and prepares; returns the
        saved entries (of all processors, as the snapshot holds them)."""
        self.snap.requested_id = snapshot_id
        entries = []
        for p in self.procs:
            p.context.snapshot_id = snapshot_id
            while True:
                done = p.save_to_snapshot()
                entries += p.outbox.drain_snapshot()
                if done:
                    break
            assert p.snapshot_commit_prepare()
        return entries

    def phase2(self, snapshot_id: int, success: bool = True) -> None:
        self.snap.start_phase2(snapshot_id, success)
        for p in self.procs:
            p.context.snapshot_id = snapshot_id
            while not p.snapshot_commit_finish(success):
                pass

    def restore(self, entries: list) -> None:
        """Every processor receives every entry (they are saved under broadcast keys) and
        starts."""
        for p in self.procs:
            inbox = Inbox(list(entries))
            while inbox:
                p.restore_from_snapshot(inbox)
            assert p.finish_snapshot_restore()
            p.try_process()


@pytest.fixture
def member():
    with Member() as m:
        yield m


def writer(index: int = 0, job_id: str = "job1") -> str:
    return f"{job_id}/{VERTEX}/{index}"


def test_records_wait_for_phase2_and_are_written_with_the_marker(member):
    sink = HandDriven(member, "out")
    out = member.get_list("out")
    sink.process([1, 2])
    sink.phase1(1)
    assert list(out) == []
    sink.phase2(1)
    assert list(out) == [1, 2]
    assert out.committed_snapshot(writer()) == 1


def test_a_failed_snapshot_rolls_its_records_into_the_next(member):
    sink = HandDriven(member, "out")
    out = member.get_list("out")
    sink.process([1, 2])
    sink.phase1(1)
    sink.phase2(1, success=False)
    assert list(out) == []
    sink.process([3])
    entries = sink.phase1(2)
    assert [e[1][0] for e in entries] == [2]       # one batch, saved under snapshot 2
    sink.phase2(2)
    assert list(out) == [1, 2, 3]
    assert out.committed_snapshot(writer()) == 2


def test_restore_writes_a_snapshot_whose_phase2_did_not_run(member):
    sink = HandDriven(member, "out")
    out = member.get_list("out")
    sink.process(["a", "b"])
    entries = sink.phase1(1)
    # crash before phase 2
    HandDriven(member, "out", restored_id=1).restore(entries)
    assert list(out) == ["a", "b"]
    # a second crash and restore from the same snapshot writes nothing again
    HandDriven(member, "out", restored_id=1).restore(entries)
    assert list(out) == ["a", "b"]


def test_restore_after_phase2_writes_nothing_again(member):
    sink = HandDriven(member, "out")
    out = member.get_list("out")
    sink.process(["a", "b"])
    entries = sink.phase1(1)
    sink.phase2(1)
    HandDriven(member, "out", restored_id=1).restore(entries)
    assert list(out) == ["a", "b"]


def test_complete_waits_for_the_phase2_of_a_prepared_snapshot(member):
    """complete() between phase 1 and phase 2: it writes nothing and asks to be called
    again; after phase 2 it writes what came after the barrier."""
    sink = HandDriven(member, "out")
    out = member.get_list("out")
    sink.process(["before"])
    sink.phase1(1)
    sink.process(["after"])
    assert sink.proc.complete() is False
    assert list(out) == []
    sink.phase2(1)
    assert list(out) == ["before"]
    assert sink.proc.complete() is True
    assert list(out) == ["before", "after"]


def test_a_refused_snapshot_save_keeps_the_records(member):
    """save_to_snapshot() is called again when the snapshot buffer refused its entries: the
    second call must save the same records, not an empty batch."""
    sink = HandDriven(member, "out", snapshot_capacity=1)
    out = member.get_list("out")
    sink.process([1, 2, 3])
    sink.snap.requested_id = 1
    sink.proc.context.snapshot_id = 1
    assert sink.proc.outbox.offer_to_snapshot("someone-else", "fills the buffer")
    assert sink.proc.save_to_snapshot() is False
    sink.proc.outbox.drain_snapshot()              # the engine drains the buffer
    assert sink.proc.save_to_snapshot() is True
    entries = sink.proc.outbox.drain_snapshot()
    assert [e[1][-1] for e in entries] == [[1, 2, 3]]
    sink.phase2(1)
    assert list(out) == [1, 2, 3]


def test_restore_into_fewer_processors_settles_every_old_writer_once(member):
    three = HandDriven(member, "out", total=3)
    out = member.get_list("out")
    for i in range(3):
        three.process([f"p{i}-a", f"p{i}-b"], index=i)
    entries = three.phase1(1)
    three.phase2(1)
    for i in range(3):
        three.process([f"p{i}-c"], index=i)
    entries = three.phase1(2)                      # crash before phase 2 of snapshot 2
    two = HandDriven(member, "out", restored_id=2, total=2)
    two.restore(entries)
    assert sorted(out) == sorted(f"p{i}-{x}" for i in range(3) for x in "abc")
    assert [out.committed_snapshot(writer(i)) for i in range(3)] == [2, 2, 2]
    # the restored processors write on, each under its own marker
    two.process(["new"], index=1)
    two.phase1(3)
    two.phase2(3)
    assert out.count("new") == 1 and out.committed_snapshot(writer(1)) == 3


def test_only_the_exactly_once_list_sink_is_a_transactional_sink(member):
    exactly = HandDriven(member, "out")
    plain = HandDriven(member, "out", guarantee="at_least_once")
    assert exactly.proc.transactional_sink is True
    assert plain.proc.transactional_sink is False
    plain.process([1])
    assert list(member.get_list("out")) == [1]     # appended as it arrived


# --- in jobs ---------------------------------------------------------------------------------

def test_an_exactly_once_batch_job_writes_every_item_once(member):
    p = Pipeline()
    p.read_from(Sources.items(range(5000))).map(lambda x: x * 2).write_to(Sinks.list("once"))
    job = member.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                      snapshot_interval_ms=5))
    job.join(timeout=60)
    assert job.status == JobStatus.COMPLETED
    assert sorted(member.get_list("once")) == [x * 2 for x in range(5000)]


def test_an_exactly_once_job_restarted_around_its_snapshots_writes_every_item_once(member):
    """The job fails twice: once right after a snapshot's phase 2 (the sink appended that
    snapshot's items; the restore must not append them again) and once between snapshots
    (the items after the last snapshot are replayed and appended once)."""
    items = [*range(0, 100), WAIT_FOR_SNAPSHOT(), ABORT(), *range(100, 200), ABORT(),
             *range(200, 300), WAIT_FOR_SNAPSHOT(), *range(300, 400)]
    p = Pipeline()
    p.read_from(TestSources.items(items)).map(lambda x: x * 10).write_to(
        Sinks.list("restarted"))
    events: list[str] = []
    member.add_listener(lambda job_id, name, event: events.append(event))
    job = member.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                      snapshot_interval_ms=20))
    job.join(timeout=60)
    assert job.status == JobStatus.COMPLETED
    assert sum(e.startswith("restarting") for e in events) == 2
    assert sorted(member.get_list("restarted")) == [x * 10 for x in range(400)]
