"""The NEXMark window queries (q5 hot items, q7 highest bid, q11 user sessions, q12
processing-time windows) against their plain-Python references: on generated events in
memory, in order and out of order within the allowed lag, and q5 through Kafka (the three
topics as bench.nexmark.kafka_input fills them, exactly-once with 1 s snapshots and RocksDB
state, the output read back committed)."""
from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.nexmark.generator import GeneratorConfig, generate
from bench.nexmark.kafka_input import fill
from bench.nexmark.queries import KINDS, NexmarkInputs, check_output, query
from jetwake import JobConfig, Member, Pipeline, Sinks
from support.waiting import wait_until

# 4,000 events at 100 events/s of event time: 40 s, so 4 tumbling windows of q7, about 25
# sliding windows of q5, and bidders with several sessions of q11
RATE = 100
EVENTS = 4_000
DISORDER_MS = 1_500
BASE = 1_700_000_000_000  # a multiple of every window size


def events_of(out_of_order_ms: int = 0, seed: int = 7) -> list:
    return list(generate(GeneratorConfig(events=EVENTS, rate=RATE,
                                         out_of_order_ms=out_of_order_ms, seed=seed)))


def run_in_memory(name: str, events: list, allowed_lag_ms: int = 1_000) -> tuple[list, dict]:
    """The query's outputs (JSON round-tripped, as the Kafka sink writes them) and the job's
    metrics, on an embedded member reading ``events`` from memory."""
    p = Pipeline()
    query(name).build(NexmarkInputs(p, events=events, allowed_lag_ms=allowed_lag_ms)) \
        .write_to(Sinks.list("out"))
    with Member() as m:
        job = m.new_job(p)
        job.join()
        outputs = [json.loads(json.dumps(o)) for o in m.get_list("out")]
        return outputs, job.metrics()


def late_events(metrics: dict) -> int:
    return sum(v.get("late_events", 0) for v in metrics.values())


# --- in memory ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["q5", "q7", "q11"])
def test_window_query_equals_its_reference_on_events_in_order(name):
    events = events_of()
    outputs, metrics = run_in_memory(name, events)
    assert outputs, f"{name} emitted nothing"
    assert check_output(query(name), events, outputs) == []
    assert late_events(metrics) == 0


@pytest.mark.parametrize("name", ["q5", "q7", "q11"])
def test_window_query_equals_its_reference_on_events_out_of_order_within_the_allowed_lag(name):
    events = events_of(out_of_order_ms=DISORDER_MS, seed=8)
    times = [e["date_time"] for _, e in events]
    assert any(b < a for a, b in zip(times, times[1:])), "the events must be out of order"
    outputs, metrics = run_in_memory(name, events, allowed_lag_ms=DISORDER_MS)
    assert check_output(query(name), events, outputs) == []
    assert late_events(metrics) == 0


def bid(auction: int, bidder: int, price: int, at: int) -> tuple[str, dict]:
    return ("bid", {"auction": auction, "bidder": bidder, "price": price, "channel": "Google",
                    "url": "", "date_time": BASE + at, "extra": ""})


def test_q5_outputs_every_auction_tied_for_the_most_bids_in_each_window():
    # in the frame [0 s, 2 s): auctions 1 and 2 have 3 bids each, auction 3 one
    events = [bid(a, 100 + i, 10, 100 * i) for i, a in enumerate([1, 2, 1, 3, 2, 1, 2])]
    outputs, _ = run_in_memory("q5", events)
    windows = {(r["starttime"] - BASE, r["endtime"] - BASE) for r in outputs}
    assert windows == {(s, s + 10_000) for s in range(-8_000, 2_000, 2_000)}
    for start, end in windows:
        assert sorted((r["auction"], r["num"]) for r in outputs
                      if r["starttime"] - BASE == start) == [(1, 3), (2, 3)]
    assert check_output(query("q5"), events, outputs) == []


def test_q7_outputs_every_bid_tied_for_the_highest_price_in_each_window():
    events = [bid(1, 101, 50, 1_000), bid(2, 102, 10, 2_000), bid(3, 103, 50, 9_999),
              bid(4, 104, 70, 10_000)]
    outputs, _ = run_in_memory("q7", events)
    assert sorted((r["bidder"], r["price"], r["endtime"] - BASE) for r in outputs) == [
        (101, 50, 10_000), (103, 50, 10_000), (104, 70, 20_000)]
    assert check_output(query("q7"), events, outputs) == []


def test_q7_outputs_the_highest_price_of_each_tumbling_window_with_the_window_end():
    events = events_of()
    outputs, _ = run_in_memory("q7", events)
    for r in outputs:
        end = r["endtime"]
        assert end % 10_000 == 0 and end - 10_000 <= r["date_time"] < end
        assert r["price"] == max(e["price"] for k, e in events
                                 if k == "bid" and end - 10_000 <= e["date_time"] < end)


def test_q11_sessions_of_a_bidder_are_at_least_the_gap_apart():
    events = events_of()
    outputs, _ = run_in_memory("q11", events)
    by_bidder: dict = {}
    for r in outputs:
        by_bidder.setdefault(r["bidder"], []).append((r["starttime"], r["endtime"]))
    assert any(len(s) > 1 for s in by_bidder.values()), "some bidder must have two sessions"
    for sessions in by_bidder.values():
        sessions.sort()
        # a session ends 10 s after its last bid: the next starts at or after that end
        assert all(b[0] >= a[1] for a, b in zip(sessions, sessions[1:]))


def test_q12_counts_every_bid_in_ten_second_processing_time_windows():
    events = events_of()
    outputs, _ = run_in_memory("q12", events)
    assert outputs
    assert check_output(query("q12"), events, outputs) == []


def test_q12_check_reports_a_window_not_aligned_and_counts_that_do_not_add_up():
    events = events_of()
    outputs, _ = run_in_memory("q12", events)
    shifted = [dict(outputs[0], starttime=outputs[0]["starttime"] + 1,
                    endtime=outputs[0]["endtime"] + 1)] + outputs[1:]
    short = [dict(outputs[0], bid_count=outputs[0]["bid_count"] + 1)] + outputs[1:]
    assert any("aligned" in p for p in check_output(query("q12"), events, shifted))
    assert any("do not add up" in p for p in check_output(query("q12"), events, short))


# --- through Kafka -----------------------------------------------------------------------------

def committed_records(bootstrap: str, topic: str, count: int) -> list:
    """The records a read_committed reader sees in ``topic`` once it has ``count`` of them (it
    waits for them, then reads a little longer to see any record too many), decoded from JSON."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    c.subscribe([topic])
    got: list = []
    try:
        def enough() -> bool:
            got.extend(json.loads(m.value()) for m in c.consume(500, 0.2) if not m.error())
            return len(got) >= count
        wait_until(enough, timeout=60, interval=0,
                   what=lambda: f"{count} committed records in {topic}, {len(got)} so far")
        got.extend(json.loads(m.value()) for m in c.consume(500, 1.0) if not m.error())
        return got
    finally:
        c.close()


@pytest.mark.integration
@pytest.mark.kafka
def test_q5_through_kafka_exactly_once_with_rocksdb_state_equals_its_reference(
        kafka_bootstrap, tmp_path):
    """The events in the three topics (3 partitions each, out of order within the lag, ended
    by kafka_input's end markers), q5 read from and written to Kafka under exactly-once with
    1 s snapshots and RocksDB state: the committed output is the reference, each record once."""
    prefix = f"nxw{uuid.uuid4().hex[:8]}-"
    out = prefix + "q5-out"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(out, 1, 1)])[out].result(60)
    inp = fill(kafka_bootstrap, GeneratorConfig(events=EVENTS, rate=RATE,
                                                out_of_order_ms=DISORDER_MS, seed=9),
               prefix=prefix, partitions=3)
    want = query("q5").reference(inp.events)

    p = Pipeline()
    inputs = NexmarkInputs(p, kafka={"bootstrap.servers": kafka_bootstrap,
                                     "group.id": prefix + "q5"},
                           allowed_lag_ms=DISORDER_MS, topic_prefix=prefix)
    query("q5").build(inputs).write_to(
        Sinks.kafka(out, {"bootstrap.servers": kafka_bootstrap}, value_serializer="json"))
    try:
        with Member(str(tmp_path / "member")) as m:
            job = m.new_job(p, JobConfig(processing_guarantee="exactly_once",
                                         snapshot_interval_ms=1_000, state_backend="rocksdb"))
            try:
                outputs = committed_records(kafka_bootstrap, out, sum(want.values()))
                metrics = job.metrics()
            finally:
                job.cancel()
    finally:
        admin.delete_topics([out] + [inp.topic(k) for k in KINDS])
    assert check_output(query("q5"), inp.events, outputs) == []
    assert late_events(metrics) == 0
