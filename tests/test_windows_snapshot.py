"""Save and restore of every event-time processor: a restored processor continues exactly like
the one that saved (state taken with save_to_snapshot, given back through
restore_from_snapshot, as the snapshot coordinator does)."""

from __future__ import annotations

import random

import pytest

from jetwake import AggregateOperations as ops, WindowDefinition
from jetwake.engine.core.stream_items import Watermark
from jetwake.engine.core.processor import BroadcastKey, Inbox, Outbox, ProcessorContext
from jetwake.engine.processors.map_stateful import MapStatefulProcessor
from jetwake.engine.processors.rolling_aggregate import RollingAggregateProcessor
from jetwake.engine.processors.session_window import SessionWindowProcessor
from jetwake.engine.processors.sliding_window import (
    FrameAccumulateProcessor, SlidingWindowProcessor, WindowCombineProcessor,
)
from jetwake.engine.core.serialization import dumps, loads


def make(factory, snapshot_capacity=7):
    p = factory()
    # a small snapshot buffer: saving must resume across calls
    p.outbox = Outbox(1, 100_000, snapshot_capacity=snapshot_capacity)
    p.init(ProcessorContext("job", "job", "v", 0, 0, 1, 1, 0, 1))
    return p


def drain(p) -> list:
    return p.outbox.drain(0)


def save(p) -> list:
    entries = []
    while not p.save_to_snapshot():
        entries += p.outbox.drain_snapshot()
    entries += p.outbox.drain_snapshot()
    # through the wire format, as a real snapshot goes
    return [tuple(loads(dumps(list(e)))) for e in entries]


def restore(factory, entries):
    q = make(factory)
    # every processor gets the broadcast entries and the keys of its partitions: here, all
    q.restore_from_snapshot(Inbox(list(entries)))
    assert q.finish_snapshot_restore()
    return q


def feed(p, steps) -> list:
    for kind, arg in steps:
        if kind == "items":
            p.process(0, Inbox(list(arg)))
        else:
            assert p.try_process_watermark(Watermark(arg))
    while not p.complete():
        pass
    return drain(p)


def pairs(n, seed, keys=5):
    rnd = random.Random(seed)
    return [(i * 3 - rnd.randint(0, 20), (f"k{rnd.randrange(keys)}", rnd.randint(1, 9)))
            for i in range(n)]


def steps_of(items, every=40, lag=10, step=10):
    steps = []
    top = None
    for i in range(0, len(items), every):
        chunk = items[i:i + every]
        steps.append(("items", chunk))
        top = max([top or -10**9] + [t for t, _ in chunk])
        steps.append(("wm", (top - lag) - (top - lag) % step))
    return steps


WDEF = WindowDefinition.sliding(30, 10)
FACTORIES = {
    "frame-accumulate": lambda: FrameAccumulateProcessor("w", WDEF, [ops.counting()],
                                                         [lambda x: x[0]]),
    "sliding-one-stage": lambda: SlidingWindowProcessor("w", WDEF, ops.to_list(),
                                                        lambda x: x[0]),
    "session": lambda: SessionWindowProcessor("w", WindowDefinition.session(15),
                                              ops.summing(lambda x: x[1]), lambda x: x[0]),
    "rolling": lambda: RollingAggregateProcessor("r", ops.counting(), lambda x: x[0], True),
    "map-stateful-ttl": lambda: MapStatefulProcessor(
        "m", lambda: [0], lambda s, k, x: (s.__setitem__(0, s[0] + x[1]), (k, s[0]))[1],
        lambda x: x[0], True, ttl=25, on_evict=lambda s, k, wm: ("evicted", k, s[0])),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_restored_processor_continues_like_the_original(name):
    factory = FACTORIES[name]
    steps = steps_of(pairs(400, seed=len(name)))
    half = len(steps) // 2
    original = make(factory)
    feed_first = steps[:half]
    for kind, arg in feed_first:
        original.process(0, Inbox(list(arg))) if kind == "items" else \
            original.try_process_watermark(Watermark(arg))
    drain(original)
    entries = save(original)
    assert any(isinstance(k, BroadcastKey) for k, _ in entries) or name == "rolling"
    restored = restore(factory, entries)
    assert feed(restored, steps[half:]) == feed(original, steps[half:])


def test_window_combine_restores_frames_and_the_next_window():
    def factory():
        return WindowCombineProcessor("w", WDEF, ops.counting(), keyed=True)
    frames = [("a", f, 1) for f in range(0, 200, 10)] + [("b", f, 2) for f in range(0, 200, 20)]
    original = make(factory)
    original.process(0, Inbox(frames[:15]))
    original.try_process_watermark(Watermark(60))
    drain(original)
    restored = restore(factory, save(original))
    rest = [("items", frames[15:]), ("wm", 120)]
    assert feed(restored, rest) == feed(original, rest)


def test_two_stage_one_state_saved_by_two_processors_merges_on_restore():
    def factory():
        return FrameAccumulateProcessor("w", WDEF, [ops.counting()], [lambda x: x[0]])
    a, b = make(factory), make(factory)
    a.process(0, Inbox([(5, ("k", 1)), (6, ("k", 1))]))
    b.process(0, Inbox([(7, ("k", 1))]))
    merged = restore(factory, save(a) + save(b))
    assert feed(merged, []) == [("k", 0, 3)]
