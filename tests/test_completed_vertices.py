"""A stage whose every processor had completed when a snapshot was taken does not run again
after a restore from it: its results, emitted before that snapshot, are not emitted twice.

This holds for any processor, including a user's own that emits its result in complete()."""

from __future__ import annotations


from jetwake import JobConfig, Member, Pipeline, Processor, Sinks, Sources, TestSources
from support.waiting import wait_until


class SumOnComplete(Processor):
    """Sums its input and emits the sum once, when its input has ended."""

    def __init__(self) -> None:
        self.total = 0

    def process(self, ordinal, inbox) -> None:
        self.total += sum(inbox.drain())

    def complete(self) -> bool:
        return self.outbox.offer(0, self.total)

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot("total", self.total)

    def restore_from_snapshot(self, inbox) -> None:
        for _, total in inbox.drain():
            self.total = total


def _pipeline() -> Pipeline:
    p = Pipeline()
    (p.read_from(Sources.items(range(10))).custom_transform("sum", SumOnComplete)
     .write_to(Sinks.list("sums")))
    # a second branch keeps the job running after the first one has completed
    p.read_from(TestSources.item_stream(100)).write_to(Sinks.noop())
    return p


def _branch_done(member: Member, job) -> bool:
    tasklets = member.find_coordinator(job.id).running_tasklets()
    return bool(tasklets) and all(t.is_done for t in tasklets if "sums" in t.name)


def test_a_completed_stage_restored_from_a_snapshot_emits_nothing_again():
    with Member() as m:
        job = m.new_job(_pipeline(), JobConfig(processing_guarantee="exactly_once",
                                               snapshot_interval_ms=3_600_000))
        sums = m.get_list("sums")
        wait_until(lambda: _branch_done(m, job))
        job.take_snapshot()  # commits the sum and records the stage as completed
        assert list(sums) == [45]
        job.restart()
        wait_until(lambda: _branch_done(m, job))
        job.take_snapshot()
        assert list(sums) == [45]
        job.cancel()


def test_a_snapshot_records_which_stages_had_completed():
    with Member() as m:
        job = m.new_job(_pipeline(), JobConfig(processing_guarantee="exactly_once",
                                               snapshot_interval_ms=3_600_000))
        wait_until(lambda: _branch_done(m, job))
        rec = job.take_snapshot()
        job.cancel()
    assert rec.vertex_completed("sum")
    assert not any(rec.vertex_completed(v) for v in rec.parallelism if "item-stream" in v)
