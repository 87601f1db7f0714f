"""rolling_aggregate and map_stateful, keyed and keyless, with event-time TTL."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from jetwake import AggregateOperations as ops, Member, Pipeline, PipelineError, Sinks, Sources


def run(p, *names):
    with Member(local_parallelism=2) as m:
        job = m.new_job(p)
        job.join(timeout=60)
        metrics = job.metrics()
        return [list(m.get_list(n)) for n in names] + [metrics]


def events(n=5_000, keys=20, seed=1):
    rnd = random.Random(seed)
    return [(i, f"k{rnd.randrange(keys)}", rnd.randint(1, 9)) for i in range(n)]


def per_key(pairs):
    d = defaultdict(list)
    for k, v in pairs:
        d[k].append(v)
    return dict(d)


def test_rolling_aggregate_emits_the_running_result_for_every_item():
    evs = events()
    p = Pipeline()
    (p.read_from(Sources.items(evs))
      .group_by(lambda e: e[1])
      .rolling_aggregate(ops.summing(lambda e: e[2]))
      .write_to(Sinks.list("out")))
    out, _ = run(p, "out")
    assert len(out) == len(evs)
    ref: dict = defaultdict(list)
    totals: dict = defaultdict(int)
    for _, k, v in evs:
        totals[k] += v
        ref[k].append(totals[k])
    assert per_key(out) == dict(ref)  # per key, in order


def test_keyless_rolling_aggregate_emits_results_alone():
    p = Pipeline()
    p.read_from(Sources.items(list(range(1, 101)))).rolling_aggregate(ops.counting()) \
        .write_to(Sinks.list("out"))
    out, _ = run(p, "out")
    assert out == list(range(1, 101))


def test_rolling_aggregate_keeps_timestamps_for_a_window_downstream():
    from jetwake import WindowDefinition
    evs = [(t, "a", 1) for t in range(0, 300, 10)]
    p = Pipeline()
    (p.read_from(Sources.items(evs))
      .with_timestamps(lambda e: e[0], 0)
      .group_by(lambda e: e[1])
      .rolling_aggregate(ops.counting())
      .window(WindowDefinition.tumbling(100))
      .aggregate(ops.max_by(lambda kv: kv[1]))
      .write_to(Sinks.list("out")))
    out, _ = run(p, "out")
    assert sorted((r.start, r.result) for r in out) == [(0, ("a", 10)), (100, ("a", 20)),
                                                       (200, ("a", 30))]


def test_map_stateful_keeps_mutable_state_per_key_and_drops_none():
    evs = events(3_000, keys=10, seed=2)

    def running_max(state, key, e):
        if e[2] > state["max"]:
            state["max"] = e[2]
            return (key, e[0], e[2])
        return None

    p = Pipeline()
    (p.read_from(Sources.items(evs))
      .group_by(lambda e: e[1])
      .map_stateful(lambda: {"max": 0}, running_max)
      .write_to(Sinks.list("out")))
    out, _ = run(p, "out")
    ref = []
    best: dict = defaultdict(int)
    for t, k, v in evs:
        if v > best[k]:
            best[k] = v
            ref.append((k, t, v))
    assert sorted(out) == sorted(ref)


def test_keyless_map_stateful_sees_every_item_in_order():
    p = Pipeline()
    (p.read_from(Sources.items(list(range(10))))
      .map_stateful(lambda: [0], lambda s, x: (s.__setitem__(0, s[0] + x), s[0])[1])
      .write_to(Sinks.list("out")))
    out, _ = run(p, "out")
    assert out == [sum(range(i + 1)) for i in range(10)]


# Many items between the events that move the watermark and the events that check the effect:
# a processor handles the items it drained together before the watermark that came among them,
# so the test makes sure that watermark arrives in an earlier batch.
FILLER = [(1_000 + i // 1_000, "filler") for i in range(20_000)]


def without_filler(out):
    return [x for x in out if "filler" not in x]


def ttl_pipeline(evs, ttl=100, on_evict=None):
    def count(state, key, e):
        state[0] += 1
        return (key, e[0], state[0])

    p = Pipeline()
    (p.read_from(Sources.items(evs))
      .with_timestamps(lambda e: e[0], allowed_lag=0)
      .group_by(lambda e: e[1])
      .map_stateful(lambda: [0], count, ttl=ttl, on_evict=on_evict)
      .write_to(Sinks.list("out")))
    return p


def test_ttl_evicts_state_when_the_watermark_passes_last_event_plus_ttl():
    evs = [(0, "a"), (10, "a"), (20, "b"), (1_000, "c")] + FILLER + [(1_050, "a"), (1_060, "c")]
    out, metrics = run(ttl_pipeline(evs, on_evict=lambda s, k, wm: ("evicted", k, s[0])),
                       "out")
    out = without_filler(out)
    assert sorted(x for x in out if x[0] != "evicted") == sorted(
        [("a", 0, 1), ("a", 10, 2), ("b", 20, 1), ("c", 1_000, 1), ("a", 1_050, 1),
         ("c", 1_060, 2)])  # "a" starts over after its eviction
    # a and b expire when the watermark passes 1000; at the end of the stream, the rest
    assert sorted(x for x in out if x[0] == "evicted") == [
        ("evicted", "a", 1), ("evicted", "a", 2), ("evicted", "b", 1), ("evicted", "c", 2)]
    assert sum(m.get("evicted_keys", 0) for m in metrics.values()) == 5  # and the filler


def test_on_evict_may_take_only_state_and_key():
    evs = [(0, "a"), (500, "b")]
    out, _ = run(ttl_pipeline(evs, on_evict=lambda s, k: ("gone", k)), "out")
    out = without_filler(out)
    assert ("gone", "a") in out


def test_events_older_than_the_ttl_behind_the_watermark_are_late():
    evs = [(0, "a"), (1_000, "b")] + FILLER + [(5, "a"), (950, "a")]
    out, metrics = run(ttl_pipeline(evs), "out")
    assert sorted(without_filler(out)) == [("a", 0, 1), ("a", 950, 1), ("b", 1_000, 1)]
    assert sum(m.get("late_events", 0) for m in metrics.values()) == 1


def test_ttl_without_timestamps_is_rejected_naming_the_stage():
    p = Pipeline()
    stage = p.read_from(Sources.items([1])).map(lambda x: x).set_name("parse")
    with pytest.raises(PipelineError, match="parse"):
        stage.group_by(lambda x: x).map_stateful(lambda: [0], lambda s, k, x: x, ttl=10)


def test_ttl_must_be_positive():
    p = Pipeline()
    stage = p.read_from(Sources.items([(1, 1)])).with_timestamps(lambda e: e[0], 0)
    with pytest.raises(PipelineError, match="positive"):
        stage.group_by(lambda x: x).map_stateful(lambda: [0], lambda s, k, x: x, ttl=0)


def _append(acc: list, e) -> list:
    acc.append(e[2])  # a mutable accumulator, changed in place
    return acc


def test_rolling_results_do_not_change_when_the_accumulator_does_afterwards():
    from jetwake import AggregateOperation
    evs = events(n=300, keys=3)
    p = Pipeline()
    (p.read_from(Sources.items(evs))
      .group_by(lambda e: e[1])
      .rolling_aggregate(AggregateOperation(list, _append))  # default export: the accumulator
      .write_to(Sinks.list("out")))
    out, _ = run(p, "out")
    seen: dict = defaultdict(list)
    for k, result in out:
        assert len(result) == len(seen[k]) + 1, "an emitted result kept growing"
        seen[k] = result
