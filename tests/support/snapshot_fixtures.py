"""Processors and pipelines shared by the snapshot tests: a throttled counting source and a
keyed running sum, both saving their state."""

from __future__ import annotations

import time

from jetwake import BroadcastKey, Pipeline, Processor, ProcessorMetaSupplier, Sinks, Source


class CountingSource(Processor):
    """Emits 0, 1, 2, ... up to ``limit`` (None: forever), ``per_call`` items per call."""

    def __init__(self, limit: int | None, per_call: int = 50, pause: float = 0.001,
                 cooperative: bool = True) -> None:
        self.limit = limit
        self.per_call = per_call
        self.pause = pause
        self.cooperative = cooperative
        self.next = 0

    def is_cooperative(self) -> bool:
        return self.cooperative

    def complete(self) -> bool:
        if self.limit is not None and self.next >= self.limit:
            return True
        if self.outbox.has_room():
            end = self.next + self.per_call
            if self.limit is not None:
                end = min(end, self.limit)
            self.outbox.offer_chunk(-1, list(range(self.next, end)))
            self.next = end
            if self.pause:
                time.sleep(self.pause)
        return False

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(BroadcastKey("next"), self.next)

    def restore_from_snapshot(self, inbox) -> None:
        for _, value in inbox.drain():
            self.next = value


def counting_source(limit: int | None, name: str = "numbers", **kwargs) -> Source:
    return Source(name, ProcessorMetaSupplier.of(lambda: CountingSource(limit, **kwargs), 1),
                  is_stream=True)


class CountingSink(Processor):
    """Counts the items it receives, on every input; the count is its snapshot state (so a
    test reads, at a snapshot, how many items had passed the barrier)."""

    def __init__(self) -> None:
        self.count = 0

    def process(self, ordinal, inbox) -> None:
        self.count += len(inbox.drain())

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot("count", self.count)

    def restore_from_snapshot(self, inbox) -> None:
        for _, value in inbox.drain():
            self.count = value


class RunningSum(Processor):
    """Keyed (sum, count), emitted on every item."""

    def __init__(self) -> None:
        self.state: dict = {}

    def process(self, ordinal, inbox) -> None:
        if not self.outbox.has_room():
            return
        out = []
        for k, v in inbox.drain():
            s, c = self.state.get(k, (0, 0))
            self.state[k] = (s + v, c + 1)
            out.append((k, self.state[k]))
        self.outbox.offer_chunk(-1, out)

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_all_to_snapshot(list(self.state.items()))

    def restore_from_snapshot(self, inbox) -> None:
        self.state.update(inbox.drain())


def running_sum_pipeline(limit: int | None, keys: int = 7, stage_name: str = "running-sum",
                         extra_map=None, **source_kwargs) -> Pipeline:
    p = Pipeline()
    stage = p.read_from(counting_source(limit, **source_kwargs)).map(lambda x: (x % keys, x))
    if extra_map is not None:
        stage = stage.map(extra_map)
    (stage.rebalance(lambda e: e[0])
          .custom_transform(stage_name, RunningSum)
          .write_to(Sinks.map("sums")))
    return p


def expected_sums(limit: int, keys: int = 7) -> dict:
    out: dict = {}
    for i in range(limit):
        s, c = out.get(i % keys, (0, 0))
        out[i % keys] = (s + i, c + 1)
    return out
