"""A source that knows its event time per partition emits its own watermarks, and
with_native_timestamps follows them: a partition that lags behind holds windows open
instead of having its events dropped as late."""

from __future__ import annotations

from collections import Counter

from jetwake import (
    AggregateOperations, JobConfig, Member, Pipeline, Processor, ProcessorMetaSupplier, Sinks,
    Source, Watermark, WindowDefinition,
)
from jetwake.engine.pipeline.event_time import native_pair_timestamp

FAST = [(ts, "fast") for ts in range(0, 10_000, 10)]
SLOW = [(ts, "slow") for ts in range(0, 1_000, 10)]


class TwoPartitionSource(Processor):
    """Emits (timestamp, item) pairs of a fast and a slow partition, the fast one far ahead;
    with ``watermarks`` it also emits min(top of each partition), as a Kafka source does."""

    def __init__(self, watermarks: bool) -> None:
        self.watermarks = watermarks
        self.i = 0

    def complete(self) -> bool:
        if self.i >= len(FAST):
            return True
        if not self.outbox.has_room():
            return False
        # the slow partition gets one record for every ten of the fast one
        chunk = [FAST[self.i]]
        slow = self.i // 10
        if self.i % 10 == 0:
            chunk.append(SLOW[slow])
        self.outbox.offer_chunk(-1, chunk)
        if self.watermarks:
            top = min(FAST[self.i][0], SLOW[slow][0])
            self.outbox.offer_control(Watermark(top))
        self.i += 1
        return False


def run(watermarks: bool) -> tuple[Counter, int]:
    source = Source("two-partitions",
                    ProcessorMetaSupplier.of(lambda: TwoPartitionSource(watermarks), 1),
                    is_stream=True, timestamp_fn=native_pair_timestamp,
                    emits_watermarks=watermarks)
    p = Pipeline()
    (p.read_from(source)
      .with_native_timestamps(allowed_lag=0)
      .window(WindowDefinition.tumbling(100))
      .group_by(lambda e: e)
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.list("out")))
    with Member(local_parallelism=1) as m:
        job = m.new_job(p, JobConfig(name="w"))
        job.join(60)
        late = sum(v.get("late_events", 0) for v in job.metrics().values())
        got = Counter()
        for r in m.get_list("out"):
            got[(r.start, r.key)] += r.result
    return got, late


def expected() -> Counter:
    return Counter(((ts // 100) * 100, name) for ts, name in FAST + SLOW)


def test_source_watermarks_keep_a_lagging_partition_on_time():
    got, late = run(watermarks=True)
    assert late == 0
    assert got == expected()


def test_without_source_watermarks_the_lagging_partition_is_late():
    # the contrast: one watermark from the highest timestamp seen runs ahead of the slow
    # partition, whose events then arrive behind it
    got, late = run(watermarks=False)
    assert late > 0
    assert sum(got.values()) == len(FAST) + len(SLOW) - late
