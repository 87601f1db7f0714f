"""Event time per Kafka partition against a real broker: ``with_timestamps`` right after
``Sources.kafka`` runs inside the source, each partition keeps its own highest timestamp and the
source's watermark is the lowest over its active partitions (engine/processors/
source_event_time.py). These tests read backlogs whose partitions stand seconds apart in event
time, on one member, on a three-member cluster, across a restore with another parallelism, with
a partition added while the job runs, with a partition that stays empty, and after a Spark
backfill's hand-off; every closed window must equal the brute-force result over the records
and no event may be late.

Which windows a streaming job has closed once it has read everything: the final watermark is
``min over partitions of (highest time - lag)``, rounded down to the throttling step (the gcd
of the window slides and session gaps downstream), and a window (or session) is closed when its
end is at or below it. The tests compute exactly that set and wait for exactly those windows.
"""
from __future__ import annotations

import json
import logging
import random
import sys
import uuid
from collections import Counter
from typing import Callable, NamedTuple

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from jetwake import (
    AggregateOperations as ops, JobConfig, Member, Pipeline, Sinks, Sources, WindowDefinition,
)

from support.cluster_processes import ClusterProcesses
from support.spark_fixtures import spark_runner  # noqa: F401 - a fixture
from support.waiting import wait_until
from support.window_reference import session_reference, sliding_reference, step_of

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

BASE = 1_700_000_000_000   # event times: ms, a multiple of every window size below
LAG = 100                  # allowed_lag of every test
TUMBLE = 1_000
SLIDE_SIZE, SLIDE = 2_000, 500
GAP = 40                   # session gap
STEP = step_of(TUMBLE, SLIDE, GAP)   # the throttling step of the watermarks: 20
WINDOWS = ("tumbling", "sliding", "session")


class Event(NamedTuple):
    """One record: ``(ts, key, value, ...)`` as support/window_reference.py reads events."""
    ts: int
    key: str
    v: int
    partition: int
    seq: int

    def payload(self) -> bytes:
        return json.dumps({"ts": self.ts, "k": self.key, "v": self.v, "p": self.partition,
                           "j": self.seq}).encode()


# --- data ---------------------------------------------------------------------------------------

def skewed_backlog(partitions: int = 6, per_partition: int = 2_500, spacing: int = 12,
                   skew: int = 4_000, disorder: int = 40, keys: int = 8, seed: int = 21,
                   order: tuple[int, ...] = (3, 0, 5, 1, 4, 2)) -> list[list[Event]]:
    """Each partition's records in offset order: partition ``p`` starts ``order[p] * skew``
    ms after BASE, advances ``spacing`` ms per record and each record is up to ``disorder`` ms
    behind its nominal time (so at most ``disorder`` behind its partition's highest time)."""
    rnd = random.Random(seed)
    out = []
    for p in range(partitions):
        start = BASE + order[p % len(order)] * skew
        out.append([Event(start + j * spacing - rnd.randint(0, disorder),
                          f"k{rnd.randrange(keys)}", rnd.randint(1, 100), p, j)
                    for j in range(per_partition)])
    return out


def produce(bootstrap: str, topic: str, events: list[Event]) -> None:
    """Writes ``events`` in list order, each into its own partition (order kept per
    partition: an idempotent producer)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10, "enable.idempotence": True})
    for e in events:
        while True:
            try:
                p.produce(topic, value=e.payload(), partition=e.partition)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(30) == 0


def interleave(partitions: list[list[Event]]) -> list[Event]:
    """The partitions' records round robin (the order the producer writes them in)."""
    out = []
    for i in range(max(map(len, partitions), default=0)):
        out += [p[i] for p in partitions if i < len(p)]
    return out


def throttle(wm: int, step: int = STEP) -> int:
    return wm - wm % step


def final_watermark(partitions: list[list[Event]]) -> int:
    """The watermark once every partition has been read: the lowest partition top less the
    lag, rounded down to the step."""
    return throttle(min(max(e.ts for e in p) for p in partitions if p) - LAG)


def closed_windows(events: list[Event], wm: int) -> dict[str, list[tuple]]:
    """Brute force: every window of the three stages whose end is at or below ``wm``."""
    return {
        "tumbling": [w for w in sliding_reference(events, TUMBLE, TUMBLE) if w[1] <= wm],
        "sliding": [w for w in sliding_reference(events, SLIDE_SIZE, SLIDE,
                                                 value=lambda e: e[2]) if w[1] <= wm],
        "session": [w for w in session_reference(events, GAP) if w[1] <= wm],
    }


# --- the pipeline -------------------------------------------------------------------------------

def kafka_source(bootstrap: str, topic: str, **props):
    return Sources.kafka(topic, {"bootstrap.servers": bootstrap, **props},
                         value_deserializer="json")


def add_windows(stamped, prefix: str) -> None:
    """Tumbling counts, sliding sums of ``v`` and session counts per key, each into the list
    ``prefix + kind``."""
    key = lambda kv: kv[1]["k"]  # noqa: E731
    (stamped.window(WindowDefinition.tumbling(TUMBLE)).group_by(key)
        .aggregate(ops.counting()).set_name("tumbling").write_to(Sinks.list(prefix + "tumbling")))
    (stamped.window(WindowDefinition.sliding(SLIDE_SIZE, SLIDE)).group_by(key)
        .aggregate(ops.summing(lambda kv: kv[1]["v"])).set_name("sliding")
        .write_to(Sinks.list(prefix + "sliding")))
    (stamped.window(WindowDefinition.session(GAP)).group_by(key)
        .aggregate(ops.counting()).set_name("session").write_to(Sinks.list(prefix + "session")))


def windows_pipeline(bootstrap: str, topic: str, prefix: str = "", idle_timeout: int | None = None,
                     **props) -> Pipeline:
    p = Pipeline()
    extra = {} if idle_timeout is None else {"idle_timeout": idle_timeout}
    stamped = p.read_from(kafka_source(bootstrap, topic, **props)) \
        .with_timestamps(lambda kv: kv[1]["ts"], allowed_lag=LAG, **extra)
    add_windows(stamped, prefix)
    return p


# --- checks -------------------------------------------------------------------------------------

def late_events(metrics: dict) -> int:
    return sum(v.get("late_events", 0) for v in metrics.values())


def records_in(metrics: dict) -> int:
    return sum(v.get("records_in", 0) for v in metrics.values())


def _diff(name: str, got: list, want: list) -> str:
    g, w = Counter(got), Counter(want)
    missing, extra = sorted((w - g).elements()), sorted((g - w).elements())
    return (f"{name}: {len(got)} windows, {len(want)} expected; missing {len(missing)} "
            f"{missing[:5]}, unexpected {len(extra)} {extra[:5]}")


def check_windows(read: Callable[[], dict[str, list]], want: dict[str, list],
                  timeout: float = 40.0) -> None:
    """Waits until every list holds as many windows as ``want`` says (at most ``timeout``
    seconds, well inside the default idle timeout of 60 s, after which a partition that
    wrongly holds the watermark back would stop doing so), then compares them, duplicates
    included."""
    def enough() -> bool:
        got = read()
        return all(len(got[n]) >= len(want[n]) for n in want)
    try:
        wait_until(enough, what="the closed windows", timeout=timeout, interval=0.2)
    except AssertionError:
        pass  # the comparison says what is missing
    got = read()
    problems = [_diff(n, got[n], want[n]) for n in want
                if sorted(got[n]) != sorted(want[n])]
    assert not problems, "\n".join(problems)


def member_lists(m: Member, prefix: str = "") -> Callable[[], dict[str, list]]:
    return lambda: {n: [tuple(r) for r in m.get_list(prefix + n)] for n in WINDOWS}


# --- 1. a skewed backlog on one member ----------------------------------------------------------

def test_skewed_backlog_closes_every_window_with_no_late_event(kafka_bootstrap, kafka_topic):
    """Six partitions whose event times stand 4 s apart from one another, each in order within
    40 ms: a single watermark over the merged partitions would make every partition but the
    fastest late; per partition, nothing is late and every window closed by the slowest
    partition's watermark equals the brute-force result."""
    topic = kafka_topic(partitions=6)
    parts = skewed_backlog()
    produce(kafka_bootstrap, topic, interleave(parts))
    events = [e for p in parts for e in p]
    wm = final_watermark(parts)
    want = closed_windows(events, wm)
    # the windows of every partition are among the closed ones (the partitions overlap)
    assert all(any(e.ts < wm - SLIDE_SIZE for e in p) for p in parts)
    with Member(local_parallelism=2) as m:
        job = m.new_job(windows_pipeline(kafka_bootstrap, topic))
        check_windows(member_lists(m), want)
        metrics = job.metrics()
        job.cancel()
    assert records_in(metrics) == len(events)
    assert late_events(metrics) == 0


# --- 2. level partitions, round robin -----------------------------------------------------------

@pytest.mark.parametrize("parallelism", [1, 2])
def test_round_robin_partitions_read_from_the_start_have_no_late_event(
        kafka_bootstrap, kafka_topic, parallelism):
    """Record i in partition i % 4 at time 3 * i: the partitions are level, read from the
    earliest offset by one processor or two."""
    topic = kafka_topic(partitions=4)
    rnd = random.Random(7)
    n = 8_000
    events = [Event(BASE + 3 * i, f"k{rnd.randrange(10)}", rnd.randint(1, 100), i % 4, i // 4)
              for i in range(n)]
    produce(kafka_bootstrap, topic, events)
    parts = [[e for e in events if e.partition == p] for p in range(4)]
    want = closed_windows(events, final_watermark(parts))
    with Member(local_parallelism=parallelism) as m:
        job = m.new_job(windows_pipeline(kafka_bootstrap, topic))
        check_windows(member_lists(m), want)
        metrics = job.metrics()
        job.cancel()
    assert records_in(metrics) == n
    assert late_events(metrics) == 0


# --- 3. the skewed backlog on three members -----------------------------------------------------

def test_skewed_backlog_on_a_three_member_cluster(three: ClusterProcesses, kafka_topic):
    """The same backlog read by three member processes (two partitions each): the members'
    watermarks are coalesced at the window stages, each from its own partitions."""
    import cloudpickle

    topic = kafka_topic(partitions=6)
    parts = skewed_backlog(seed=33)
    produce(three.bootstrap, topic, interleave(parts))
    events = [e for p in parts for e in p]
    want = closed_windows(events, final_watermark(parts))
    prefix = f"c{uuid.uuid4().hex[:8]}-"
    a, b, c = three.members

    def read() -> dict[str, list]:
        with b.client() as cl:
            return {n: [tuple(r) for r in cl.get_list(prefix + n).to_list()] for n in WINDOWS}

    # the pipeline's functions travel by value: the members cannot import this module
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        with a.client() as cl:
            job = cl.new_job(windows_pipeline(three.bootstrap, topic, prefix),
                             JobConfig(name=prefix + "windows"))
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    try:
        check_windows(read, want)
        # Job.metrics() on a cluster counts the processors of one member (every member answers
        # with the same share): a late event elsewhere shows as a window short of an event
        with c.client() as cl:
            metrics = cl.job(job.id).metrics()
    finally:
        with c.client() as cl:
            cl.job(job.id).cancel()
    assert late_events(metrics) == 0


# --- 4. a restore with another parallelism in the middle of the backlog -------------------------

@pytest.mark.parametrize("before, after", [(2, 3), (1, 8)])
def test_watermarks_move_with_their_partitions_on_a_restore_with_another_parallelism(
        kafka_bootstrap, kafka_topic, before, after):
    """The job reads part of a skewed backlog, is cancelled with a snapshot and resumes with
    another parallelism while the rest is written (2 -> 3 processors per vertex: partitions
    0, 2, 4 / 1, 3, 5 become 0, 3 / 1, 4 / 2, 5; 1 -> 8: one processor's six partitions are
    spread out and two processors get none): every partition's highest time goes with it to
    its new processor, so nothing is late after the restore and the windows straddling the
    cut come out whole."""
    topic = kafka_topic(partitions=6)
    parts = skewed_backlog(seed=44)
    # each partition is cut at another place: some partitions are read far ahead of others,
    # and partition 3 is read to its end: after the restore only its saved highest time
    # keeps it from holding the watermark back
    cuts = [int(len(p) * f) for p, f in zip(parts, (0.3, 0.65, 0.5, 1.0, 0.4, 0.55))]
    first = [p[:k] for p, k in zip(parts, cuts)]
    rest = [p[k:] for p, k in zip(parts, cuts)]
    produce(kafka_bootstrap, topic, interleave(first))
    events = [e for p in parts for e in p]
    wm1 = final_watermark(first)
    want1 = closed_windows([e for p in first for e in p], wm1)
    config = dict(processing_guarantee="exactly_once", snapshot_interval_ms=200)
    with Member() as m:
        job = m.new_job(windows_pipeline(kafka_bootstrap, topic),
                        JobConfig(local_parallelism=before, **config))
        check_windows(member_lists(m), want1)
        wait_until(lambda: records_in(job.metrics()) == sum(map(len, first)),
                   what="the first part read")
        late1 = late_events(job.metrics())
        job.cancel_and_export_snapshot("mid-backlog")
        produce(kafka_bootstrap, topic, interleave(rest))
        job2 = m.new_job(windows_pipeline(kafka_bootstrap, topic),
                         JobConfig(local_parallelism=after, initial_snapshot_name="mid-backlog",
                                   **config))
        check_windows(member_lists(m), closed_windows(events, final_watermark(parts)))
        metrics = job2.metrics()
        job2.cancel()
    assert late1 == 0
    assert records_in(metrics) == sum(map(len, rest))  # resumed at the saved offsets
    assert late_events(metrics) == 0


# --- 5. a partition added while the job runs ----------------------------------------------------

def test_a_discovered_partition_holds_the_watermark_until_it_delivers(
        kafka_bootstrap, kafka_topic, caplog):
    """A partition added to the topic while the job runs is not read yet when discovered, so
    it holds the watermark back: the other partitions moving far ahead close no window
    beyond the watermark they had, and the new partition's records, at or above that
    watermark, are not late."""
    caplog.set_level(logging.INFO, logger="jetwake.kafka")
    topic = kafka_topic(partitions=2)
    rnd = random.Random(5)

    def level(partitions: tuple[int, ...], start: int, n: int, spacing: int = 5) -> list[Event]:
        return [Event(start + i * spacing, f"k{rnd.randrange(6)}", rnd.randint(1, 100),
                      partitions[i % len(partitions)], i) for i in range(n)]

    old = level((0, 1), BASE, 2_000)                     # 10 s, level partitions
    produce(kafka_bootstrap, topic, old)
    wm1 = final_watermark([[e for e in old if e.partition == p] for p in (0, 1)])
    ahead = level((0, 1), BASE + 10_000, 2_000)          # 10 s more in partitions 0 and 1
    new = level((2,), wm1, 600)                          # from wm1 on: none is late
    everything = old + ahead + new
    with Member(local_parallelism=2) as m:               # partition 2 goes to processor 0
        job = m.new_job(windows_pipeline(kafka_bootstrap, topic,
                                         **{"jetwake.partition.discovery.ms": 200}))
        check_windows(member_lists(m), closed_windows(old, wm1))
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
        wait_until(lambda: any("new partitions" in r.getMessage() and topic in r.getMessage()
                               for r in caplog.records), what="the new partition discovered")
        produce(kafka_bootstrap, topic, ahead)
        wait_until(lambda: records_in(job.metrics()) == len(old) + len(ahead),
                   what="partitions 0 and 1 read ahead")
        # nothing closed beyond wm1 while partition 2 has not delivered
        beyond = {n: [w for w in ws if w[1] > wm1] for n, ws in member_lists(m)().items()}
        produce(kafka_bootstrap, topic, new)
        parts = [[e for e in everything if e.partition == p] for p in range(3)]
        check_windows(member_lists(m), closed_windows(everything, final_watermark(parts)))
        metrics = job.metrics()
        job.cancel()
    assert beyond == {n: [] for n in WINDOWS}
    assert records_in(metrics) == len(everything)
    assert late_events(metrics) == 0


# --- 6. an empty partition goes idle ------------------------------------------------------------

# librdkafka's first fetch often comes back only after fetch.wait.max.ms (500 ms by default: a
# first long poll on the empty partition alone); these settings make every fetch wait 1 s, longer
# than the idle timeout, and under load the two partitions with a backlog may come in fetches a
# second apart. A Kafka partition falls idle only once read to its end, so neither judges the
# other's records late (docs/windowing.md, "Idle partitions").
SLOW_FIRST_FETCH = {"fetch.min.bytes": 50_000_000, "fetch.wait.max.ms": 1_000}


@pytest.mark.parametrize("backlog, props, parallelism", [
    pytest.param((0,), {}, None, id="one-partition-with-a-backlog"),
    pytest.param((0, 1), SLOW_FIRST_FETCH, 1, id="two-partitions-in-one-fetch-after-the-timeout"),
])
def test_an_empty_partition_stops_holding_the_watermark_after_the_idle_timeout(
        kafka_bootstrap, kafka_topic, backlog, props, parallelism):
    """Partition 2 of three gets no records: after idle_timeout (500 ms) it no longer holds
    the watermark back and the windows of the partitions with a backlog close; records then
    written into it at or above that watermark are not late."""
    topic = kafka_topic(partitions=3)
    rnd = random.Random(6)
    n = 2_000  # one consume() batch (jetwake.poll.batch 2048)
    # the partitions with a backlog are level and end at the same time: whichever of them
    # falls idle first, the watermark is the same
    old = [Event(BASE + 5 * (i // len(backlog)), f"k{rnd.randrange(6)}", rnd.randint(1, 100),
                 backlog[i % len(backlog)], i) for i in range(n)]
    produce(kafka_bootstrap, topic, old)
    wm1 = final_watermark([[e for e in old if e.partition == p] for p in backlog])
    late_arrivals = [Event(wm1 + 7 * i, f"k{rnd.randrange(6)}", rnd.randint(1, 100), 2, i)
                     for i in range(300)]          # the first one exactly at the watermark
    everything = old + late_arrivals
    # then a record far ahead in every partition closes every window of the records above
    far = max(e.ts for e in everything) + 10 * SLIDE_SIZE
    closing = [Event(far, "closing", 0, p, -1) for p in range(3)]
    with Member(**({} if parallelism is None else {"local_parallelism": parallelism})) as m:
        job = m.new_job(windows_pipeline(kafka_bootstrap, topic, idle_timeout=500, **props))
        # (without the idle timeout, partition 2 would hold every window open for 60 s)
        check_windows(member_lists(m), closed_windows(old, wm1), timeout=20)
        produce(kafka_bootstrap, topic, late_arrivals)
        wait_until(lambda: records_in(job.metrics()) == len(everything),
                   what="the records of partition 2")
        produce(kafka_bootstrap, topic, closing)
        check_windows(member_lists(m), closed_windows(everything, far - SLIDE_SIZE))
        metrics = job.metrics()
        job.cancel()
    assert late_events(metrics) == 0


# --- 7. a Spark backfill handed over to a streaming job -----------------------------------------

@pytest.mark.spark
def test_backfill_hand_off_resumes_every_partitions_watermark(spark_runner, kafka_bootstrap,
                                                              kafka_topic):
    """A backfill on Spark reads four partitions standing 3 s apart in event time and hands
    over to a streaming job that reads what is written after it: the union of their windows is
    the brute-force result over every record, the windows straddling the hand-off come out
    whole and once, no record is counted twice or missed, and nothing is late."""
    topic = kafka_topic(partitions=4)
    parts = skewed_backlog(partitions=4, per_partition=1_500, spacing=10, skew=3_000,
                           order=(2, 0, 3, 1), seed=77)
    # partition 1 is backfilled to its end: only the highest time the hand-off saved for it
    # keeps it from holding the streaming job's watermark back
    cuts = [int(len(p) * f) for p, f in zip(parts, (0.5, 1.0, 0.35, 0.6))]
    first = [p[:k] for p, k in zip(parts, cuts)]
    rest = [p[k:] for p, k in zip(parts, cuts)]
    events = [e for p in parts for e in p]
    produce(kafka_bootstrap, topic, interleave(first))

    def pipeline() -> Pipeline:
        p = Pipeline()
        stamped = p.read_from(kafka_source(kafka_bootstrap, topic)) \
            .with_timestamps(lambda kv: kv[1]["ts"], allowed_lag=LAG)
        add_windows(stamped, "")
        stamped.group_by(lambda kv: kv[1]["k"]).rolling_aggregate(ops.counting()) \
            .set_name("counts").write_to(Sinks.list("counts"))
        return p

    with Member() as m:
        result = spark_runner.run(pipeline(), until="latest", export_snapshot="backfilled",
                                  member=m)
        assert result.offsets == {topic: {p: k for p, k in enumerate(cuts)}}
        assert len(m.get_list("counts")) == sum(cuts)
        produce(kafka_bootstrap, topic, interleave(rest))
        job = m.new_job(pipeline(), JobConfig(initial_snapshot_name="backfilled"))
        check_windows(member_lists(m), closed_windows(events, final_watermark(parts)))
        wait_until(lambda: len(m.get_list("counts")) >= len(events), what="every rolling count")
        metrics = job.metrics()
        counts = list(m.get_list("counts"))
        job.cancel()
    per_key = Counter(e.key for e in events)
    assert sorted(tuple(c) for c in counts) == \
        sorted((k, i) for k, n in per_key.items() for i in range(1, n + 1))
    assert late_events(metrics) == 0


# --- 8. a partition's end in a consumed batch ---------------------------------------------------

def _batch(*spec: str) -> list:
    """Consumed messages: ``"rP"`` a record of partition P, ``"eP"`` its end-of-partition event
    (topic ``t``, or ``u`` with a ``u`` prefix: ``"ur1"``)."""
    from confluent_kafka import KafkaError, Message

    out = []
    for s in spec:
        topic, s = ("u", s[1:]) if s.startswith("u") else ("t", s)
        error = KafkaError(KafkaError._PARTITION_EOF) if s[0] == "e" else None
        out.append(Message(topic=topic, partition=int(s[1:]), value=b"{}", error=error))
    return out


@pytest.mark.parametrize("spec, one_topic, ends", [
    (("r0", "e0", "r1"), True, {("t", 0)}),
    (("e0", "r0", "e1"), True, {("t", 1)}),             # new records of 0 came after its end
    (("e0", "r0", "r1", "e0"), True, {("t", 0)}),       # a later end of 0 follows them
    (("e1", "r0", "r0"), True, {("t", 1)}),
    (("e0", "ur0", "r1", "ue0"), False, {("t", 0), ("u", 0)}),
    (("e0", "r0", "ue0"), False, {("u", 0)}),
])
def test_a_partitions_end_counts_only_after_its_records_in_the_batch(spec, one_topic, ends):
    """The source picks a batch's events out by their errors alone (no Python step per
    record); a partition is read to its end only when no record of it follows its end event
    in the batch."""
    from confluent_kafka import Message
    from jetwake.connectors.kafka.source import _ends_after_records

    msgs = _batch(*spec)
    assert set(_ends_after_records(msgs, list(map(Message.error, msgs)), one_topic)) == ends
