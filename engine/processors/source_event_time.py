"""Event time inside a partitioned source, per partition (as Jet's ``EventTimeMapper``).

When ``with_timestamps(fn, allowed_lag)`` or ``with_native_timestamps(lag)`` directly follows a
source that reads partitions (Kafka topic-partitions, a map's journal, the partitioned test
source), the planner gives the source's processors an :class:`EventTimeSpec` and each keeps a
:class:`SourceEventTime`:

- every partition has its own highest timestamp ``top``; its watermark is ``top - lag``;
- the processor's watermark is the lowest over its *active* partitions, rounded down to the
  throttling step (the frame of the windows downstream), and it only moves forward;
- a partition assigned to the processor and not read yet holds the watermark back (nothing is
  known of it) until it delivers or is idle for ``idle_timeout`` ms of wall-clock time, so a
  start on a backlog never judges one partition's records by another's progress; its idle
  clock starts again at the processor's first record, since a slow first fetch says nothing
  of the partition, and every partition of one fetch counts as active before the fetch moves
  the watermark;
- a partition without records for ``idle_timeout`` stops holding it back and holds it again
  when it delivers; a source that knows where a partition ends (Kafka's end-of-partition
  event) makes it idle only once read to its end, so a partition whose records are merely
  slow to be fetched is never idle; when every partition is idle the watermark first advances to the highest
  any partition reached, then the processor says so (the IDLE message) so that stages
  downstream stop waiting for it (the rule of a stage whose inputs all fall idle);
- each partition's ``top`` is part of the source's snapshot state and moves with the partition
  when a restart, a rescale or a member's loss gives it to another processor.

One watermark computed over the merged partitions instead makes every partition but the
fastest late whenever the partitions stand apart in event time, which is what a backlog looks
like (docs/windowing.md, "Event time per partition").
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable

from jetwake.engine.core.stream_items import IDLE_MESSAGE, NO_WATERMARK, Watermark
from jetwake.engine.operations.watermark_policy import WatermarkPolicy, throttle
from jetwake.engine.processors.event_time_base import CONTROL, DATA, SIDE, flush_pending
from jetwake.engine.processors.timestamps import NO_CAP, TimestampReader, place_watermarks

__all__ = ["EventTimeSpec", "SourceEventTime", "PartitionedSource"]


@dataclass(frozen=True)
class EventTimeSpec:
    """What the planner moves into a partitioned source: the timestamp stage's name (its
    metrics and messages), how to read a timestamp (None: the source's native time), the
    watermark policy, the throttling step (0: no window downstream, a watermark per chunk),
    the idle timeout (ms, 0: never idle) and whether unreadable items go to a side output."""
    stage_name: str
    timestamp_fn: Callable[[Any], Any] | None
    policy_factory: Callable[[], WatermarkPolicy]
    step: int
    idle_timeout: int
    side_output: bool


class _Partition:
    __slots__ = ("top", "seen", "at_end")

    def __init__(self, top: int, seen: float, at_end: bool) -> None:
        self.top = top    # highest timestamp read (NO_WATERMARK: none yet)
        self.seen = seen  # monotonic time of its last record (or of its assignment)
        # read to its end since its last record (always True when the source cannot tell):
        # only then may the idle timeout make it idle
        self.at_end = at_end


class SourceEventTime:
    """One source processor's event time over the partitions it reads (see the module
    docstring). The source hands it each partition's items in offset order
    (:meth:`add_items`), asks it for the watermark when it has nothing to read
    (:meth:`poll`) and moves the pending output to its outbox (:meth:`flush`).

    ``reports_end``: the source tells when it has read a partition to its end
    (:meth:`reached_end`); a partition is then idle only at its end."""

    def __init__(self, spec: EventTimeSpec, metrics: dict, reports_end: bool = False) -> None:
        policy = spec.policy_factory()
        if policy.is_real_time:
            raise ValueError("a wall-clock watermark policy is not run per partition")
        self.spec = spec
        self.lag = policy.lag
        self.step = spec.step
        self.idle_timeout = spec.idle_timeout / 1000
        self.reader = TimestampReader(spec.stage_name, spec.timestamp_fn, spec.side_output)
        self.metrics = metrics
        metrics.setdefault("bad_timestamps", 0)
        self.partitions: dict[Hashable, _Partition] = {}
        self.last = NO_WATERMARK   # the watermark emitted last
        self.idle = False          # the IDLE message was the last thing said
        self.delivered = False     # whether any partition has delivered a record yet
        self.reports_end = reports_end
        self.pending: deque = deque()

    # --- partitions --------------------------------------------------------------------------

    def add_partition(self, partition: Hashable, top: int | None = None) -> None:
        """Starts tracking ``partition`` (assigned now, or found by discovery), with the
        ``top`` a snapshot saved for it, if any. Until it delivers or idles it holds the
        watermark back."""
        now = time.monotonic()
        p = self.partitions.get(partition)
        top = NO_WATERMARK if top is None else top
        if p is None:
            self.partitions[partition] = _Partition(top, now, not self.reports_end)
        elif top > p.top:
            p.top = top

    def remove_partition(self, partition: Hashable) -> None:
        self.partitions.pop(partition, None)

    def reached_end(self, partition: Hashable) -> None:
        """The source read ``partition`` to its end (after its items handed in so far): from
        now the idle timeout may make it idle, until it delivers again."""
        p = self.partitions.get(partition)
        if p is not None:
            p.at_end = True

    def tops(self) -> dict[Hashable, int | None]:
        """Each partition's highest timestamp (None: no record yet), for the snapshot."""
        return {k: (None if p.top == NO_WATERMARK else p.top)
                for k, p in self.partitions.items()}

    # --- items -------------------------------------------------------------------------------

    def add_batch(self, runs: list[tuple[Hashable, list]], now: float | None = None) -> None:
        """Takes one fetch of records, as runs of ``(partition, items)`` in offset order per
        partition (see :meth:`add_items`). Every partition of the fetch counts as active
        before any run moves the watermark, so that a partition that had been quiet is not
        judged by another's records of the same fetch."""
        now = time.monotonic() if now is None else now
        self._first_delivery(now)
        for partition, _ in runs:
            p = self.partitions.get(partition)
            if p is not None:
                p.seen = now
        for partition, items in runs:
            self.add_items(partition, items, now)

    def _first_delivery(self, now: float) -> None:
        """At the first record of any partition, the partitions not read yet start their
        idle clock again: until the consumer fetches at all, a slow first fetch (a broker
        under load) must not make them idle, after which the first partition fetched would
        judge the others' records late."""
        if not self.delivered:
            self.delivered = True
            for p in self.partitions.values():
                if p.top == NO_WATERMARK:
                    p.seen = now

    def add_items(self, partition: Hashable, items: list, now: float | None = None) -> None:
        """Takes ``partition``'s next items (plain items, or ``(timestamp, item)`` pairs when
        the time is native) into the pending output as timestamped values, with the
        watermarks they advance."""
        stamped, tss, bad = self.reader.read(items)
        if bad:
            self.metrics["bad_timestamps"] += len(bad)
            self.pending.append((SIDE, bad))
        now = time.monotonic() if now is None else now
        self._first_delivery(now)
        p = self.partitions.get(partition)
        if p is None:  # a partition the source did not announce: track it from here
            self.add_partition(partition)
            p = self.partitions[partition]
        p.seen = now
        if self.reports_end:
            p.at_end = False
        if not stamped:
            return
        cap = self._others_low(partition, p.seen)
        before = self.last
        if cap is None:  # another active partition has no record yet: nothing is known
            self.pending.append((DATA, stamped))
            hi = max(tss)
            if hi > p.top:
                p.top = hi
        else:
            p.top, self.last = place_watermarks(self.pending, stamped, tss, p.top, self.last,
                                                self.lag, self.step, cap)
        if self.idle:
            self.idle = False
            if self.last == before:
                # tell the coalescers downstream that this input is active again
                self.pending.append((CONTROL, Watermark(self.last)))

    def _others_low(self, partition: Hashable, now: float) -> int | None:
        """The lowest watermark of the active partitions other than ``partition`` (NO_CAP:
        there are none); None when one of them has no record yet."""
        limit = now - self.idle_timeout if self.idle_timeout else None
        low = NO_CAP
        lag = self.lag
        for k, p in self.partitions.items():
            if k == partition or (limit is not None and p.seen < limit and p.at_end):
                continue
            if p.top == NO_WATERMARK:
                return None
            if p.top - lag < low:
                low = p.top - lag
        return low

    # --- time-driven -------------------------------------------------------------------------

    def poll(self, now: float | None = None) -> None:
        """With nothing read: the watermark may move (an idle partition stops holding it
        back), or every partition is idle (the IDLE message)."""
        now = time.monotonic() if now is None else now
        limit = now - self.idle_timeout if self.idle_timeout else None
        low = NO_CAP
        any_active = False
        for p in self.partitions.values():
            if limit is not None and p.seen < limit and p.at_end:
                continue
            any_active = True
            if p.top == NO_WATERMARK:
                return  # an active partition without a record yet: nothing is known
            if p.top - self.lag < low:
                low = p.top - self.lag
        if not any_active:  # every partition idle, or none to read: hold nothing back
            if not self.idle:
                # as when every input of a stage falls idle: event time first advances to the
                # highest watermark a partition reached, so the result does not depend on which
                # partition fell idle first
                tops = [p.top for p in self.partitions.values() if p.top != NO_WATERMARK]
                if tops:
                    high = max(tops) - self.lag
                    wm = throttle(high, self.step) if self.step > 0 else high
                    if wm > self.last:
                        self.last = wm
                        self.pending.append((CONTROL, Watermark(wm)))
                self.idle = True
                self.pending.append((CONTROL, IDLE_MESSAGE))
            return
        wm = throttle(low, self.step) if self.step > 0 else low
        if wm > self.last:
            self.last = wm
            self.idle = False
            self.pending.append((CONTROL, Watermark(wm)))
        elif self.idle:
            self.idle = False
            self.pending.append((CONTROL, Watermark(self.last)))

    def flush(self, outbox: Any) -> bool:
        """Moves the pending output into ``outbox``; True when all moved."""
        return flush_pending(self.pending, outbox, self.spec.side_output)


class PartitionedSource:
    """The contract of a source processor that reads partitions and can run the timestamp
    policy of the stage after it per partition. The planner sets :attr:`event_time_spec`
    before ``init``; the processor then makes a :class:`SourceEventTime` (see
    :meth:`make_event_time`), hands it each partition's items and saves each partition's
    ``top`` with its position."""

    event_time_spec: EventTimeSpec | None = None

    def make_event_time(self, metrics: dict,
                        partitions: Iterable[tuple[Hashable, int | None]] = (),
                        reports_end: bool = False) -> SourceEventTime | None:
        """The processor's event time per partition (None when the planner gave it none),
        tracking ``partitions`` (``(partition, restored top)`` pairs); ``reports_end``: the
        processor calls :meth:`SourceEventTime.reached_end` (see there)."""
        if self.event_time_spec is None:
            return None
        et = SourceEventTime(self.event_time_spec, metrics, reports_end)
        for partition, top in partitions:
            et.add_partition(partition, top)
        return et
