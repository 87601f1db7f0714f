"""Distributed edges over TCP: every entry of a stream arrives, in order and as what it was;
entries of many streams share few packets; a receiver that does not drain holds its senders
back instead of piling up memory; and data for a released execution is dropped and counted.
Real sockets on loopback, real threads."""

from __future__ import annotations

import threading
import time

import pytest
from support.waiting import stays_true, wait_until

from jetwake.engine.cluster.flow_control import INITIAL_WINDOW_BYTES
from jetwake.engine.cluster.network_edges import FLOW_CONTROL_INTERVAL
from jetwake.engine.cluster.peer_network import PeerNetwork, PeerUnreachableError
from jetwake.engine.core.serialization import dumps_chunk
from jetwake.engine.core.stream_items import DONE, SnapshotBarrier, Watermark


@pytest.fixture
def pair():
    a = PeerNetwork("prod", "a", "s3cret").start()
    b = PeerNetwork("prod", "b", "s3cret").start()
    yield a, b
    a.stop()
    b.stop()


def offer_all(q, entries, deadline_s: float = 15.0) -> None:
    """Offers each entry until the queue takes it, as the outbound side retries a refusal."""
    deadline = time.monotonic() + deadline_s
    for entry in entries:
        wait_until(lambda: q.offer(entry), timeout=max(0.0, deadline - time.monotonic()),
                   interval=0.001, what=f"{q.name}: the window to reopen")


def drain_until_done(q, deadline_s: float = 15.0) -> list:
    """What a downstream processor would take out of the queue, up to and including DONE."""
    got = []

    def done_arrived() -> bool:
        while q:
            got.append(q.popleft())
            if got[-1] is DONE:
                return True
        return False
    wait_until(done_arrived, timeout=deadline_s, interval=0.0005, what=f"{q.name}: DONE")
    return got


def test_items_of_several_streams_arrive_complete_and_in_order_in_few_packets(pair):
    a, b = pair
    streams = [(0, s, 10 + s) for s in range(4)]
    per_stream = 25_000  # 100k items in all
    inbound = {s: b.edges.inbound_queue("exec-1", s, f"in-{s}") for s in streams}
    remote = {s: a.edges.remote_queue("exec-1", s, "b", b.address) for s in streams}

    def produce(s):
        items = [(s[1], i, f"v{i}") for i in range(per_stream)]
        # chunks of varying sizes, as outboxes produce them
        chunks, i, size = [], 0, 1
        while i < per_stream:
            chunks.append(items[i:i + size])
            i += size
            size = size * 3 % 997 + 1
        offer_all(remote[s], [*chunks, DONE])

    got = {}

    def consume(s):
        got[s] = drain_until_done(inbound[s])

    threads = [threading.Thread(target=f, args=(s,)) for s in streams for f in (produce, consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    for s in streams:
        assert got[s][-1] is DONE
        items = [item for chunk in got[s][:-1] for item in chunk]
        assert items == [(s[1], i, f"v{i}") for i in range(per_stream)]
    stats = b.edges.stats()["peers"]["a"]
    assert stats["items_received"] == 4 * per_stream
    sent = a.edges.stats()["peers"]["b"]
    assert sent["entries_sent"] == stats["entries_received"]
    # many entries per packet: the writer batches what queued while it was writing
    assert sent["packets_sent"] * 5 < sent["entries_sent"], sent


def test_watermarks_barriers_and_done_arrive_as_themselves_in_stream_order(pair):
    a, b = pair
    q = b.edges.inbound_queue("exec-1", (2, 0, 1), "in")
    rq = a.edges.remote_queue("exec-1", (2, 0, 1), "b", b.address)
    sent = [[(1, "a")], Watermark(100), [(2, "b"), (3, "c")], SnapshotBarrier(7),
            Watermark(2**63 - 1), SnapshotBarrier(8, is_terminal=True), [], [(4, None)], DONE]
    offer_all(rq, sent)
    got = drain_until_done(q)
    assert got[-1] is DONE
    assert [type(e) for e in got] == [type(e) for e in sent]
    assert got[0] == [(1, "a")] and got[2] == [(2, "b"), (3, "c")] and got[7] == [(4, None)]
    assert got[1] == Watermark(100) and got[4] == Watermark(2**63 - 1)
    assert (got[3].snapshot_id, got[3].is_terminal) == (7, False)
    assert (got[5].snapshot_id, got[5].is_terminal) == (8, True)


def test_a_receiver_that_does_not_drain_stops_its_sender_within_one_window(pair):
    a, b = pair
    q = b.edges.inbound_queue("exec-1", (0, 0, 1), "in")
    rq = a.edges.remote_queue("exec-1", (0, 0, 1), "b", b.address)
    chunk = [(i, "x" * 20) for i in range(1000)]
    chunk_bytes = len(dumps_chunk(chunk))
    accepted = 0
    while rq.offer(chunk):
        accepted += 1
        assert accepted * chunk_bytes < 10 * INITIAL_WINDOW_BYTES, "the sender was never stopped"
    # the sender stopped after one window, overrun by at most one chunk
    assert INITIAL_WINDOW_BYTES <= accepted * chunk_bytes < INITIAL_WINDOW_BYTES + chunk_bytes
    wait_until(lambda: len(q) == accepted, what="the accepted chunks to reach the receiver")
    # for many flow-control intervals, nothing more gets through and memory stays bounded
    stays_true(lambda: not rq.offer(chunk), seconds=15 * FLOW_CONTROL_INTERVAL,
               interval=FLOW_CONTROL_INTERVAL / 4, what="the sender held back")
    assert len(q) == accepted
    assert b.edges.queued_bytes() == accepted * chunk_bytes
    assert b.edges.queued_bytes() < INITIAL_WINDOW_BYTES + chunk_bytes
    # draining resumes the flow, and everything arrives
    total = accepted + 300
    producer = threading.Thread(target=offer_all, args=(rq, [chunk] * 300 + [DONE]))
    producer.start()
    got = drain_until_done(q)
    producer.join(10)
    assert len(got) == total + 1 and all(e == chunk for e in got[:-1])
    assert b.edges.queued_bytes() == 0


def test_a_slow_receiver_bounds_what_is_queued_at_any_time(pair):
    """A processor that drains at its own slow pace keeps its queue within about a window: the
    sender runs only as fast as the receiver consumes."""
    a, b = pair
    q = b.edges.inbound_queue("exec-1", (0, 0, 1), "in")
    rq = a.edges.remote_queue("exec-1", (0, 0, 1), "b", b.address)
    chunk = [(i, "y" * 30) for i in range(500)]
    chunk_bytes = len(dumps_chunk(chunk))
    refusals = []

    def produce() -> None:
        refused = 0
        for entry in [chunk] * 150 + [DONE]:
            while not rq.offer(entry):
                refused += 1
                time.sleep(0.001)
        refusals.append(refused)

    producer = threading.Thread(target=produce)
    producer.start()
    worst = 0
    got = 0
    deadline = time.monotonic() + 30
    while True:
        worst = max(worst, b.edges.queued_bytes())
        if q:
            entry = q.popleft()
            if entry is DONE:
                break
            got += 1
            time.sleep(0.004)  # the slow processor's work: at most 250 chunks (5 MB) a second
        else:
            time.sleep(0.0005)
        assert time.monotonic() < deadline
    producer.join(10)
    assert got == 150
    assert refusals and refusals[0] > 0  # the sender was held back
    assert worst <= 2 * INITIAL_WINDOW_BYTES + chunk_bytes, worst


def test_data_for_a_released_execution_is_dropped_and_counted(pair):
    a, b = pair
    q = b.edges.inbound_queue("exec-1", (0, 0, 1), "in")
    rq = a.edges.remote_queue("exec-1", (0, 0, 1), "b", b.address)
    offer_all(rq, [[1, 2, 3]])
    wait_until(lambda: len(q) == 1, what="the first chunk")
    b.edges.release("exec-1")
    offer_all(rq, [[4, 5], Watermark(9), DONE])
    wait_until(lambda: b.edges.stats()["dropped_entries"] == 3,
               what="the late entries to be dropped")
    assert b.edges.stats()["dropped_packets"] >= 1
    assert len(q) == 1 and q.popleft() == [1, 2, 3]
    # the stream's key may be used again by a new execution once released
    q2 = b.edges.inbound_queue("exec-1", (0, 0, 1), "in")
    a.edges.release("exec-1")
    rq2 = a.edges.remote_queue("exec-1", (0, 0, 1), "b", b.address)
    offer_all(rq2, [[6], DONE])
    assert drain_until_done(q2) == [[6], DONE]


def test_a_sender_whose_connection_broke_fails_instead_of_losing_items_silently(pair):
    a, b = pair
    q = b.edges.inbound_queue("exec-1", (0, 0, 1), "in")
    rq = a.edges.remote_queue("exec-1", (0, 0, 1), "b", b.address)
    offer_all(rq, [[1]])
    wait_until(lambda: len(q) == 1, what="the first chunk to arrive")
    b.stop()

    def offers_go_on() -> bool:
        rq.offer([2])  # raises once the stream knows its connection is gone for good
        return False
    with pytest.raises(PeerUnreachableError, match="stream exec-1/0:0->1 needs the connection "
                                                   "to member b"):
        wait_until(offers_go_on, timeout=10, interval=0.001, what="an offer to be refused")


def test_streams_both_ways_between_two_members(pair):
    a, b = pair
    qa = a.edges.inbound_queue("exec-1", (1, 1, 0), "at-a")
    qb = b.edges.inbound_queue("exec-1", (0, 0, 1), "at-b")
    to_b = a.edges.remote_queue("exec-1", (0, 0, 1), "b", b.address)
    to_a = b.edges.remote_queue("exec-1", (1, 1, 0), "a", a.address)
    offer_all(to_b, [[("to b", i)] for i in range(100)] + [DONE])
    offer_all(to_a, [[("to a", i)] for i in range(100)] + [DONE])
    assert drain_until_done(qb) == [[("to b", i)] for i in range(100)] + [DONE]
    assert drain_until_done(qa) == [[("to a", i)] for i in range(100)] + [DONE]


def test_bad_entries_and_registrations_fail_with_a_clear_message(pair):
    a, b = pair
    b.edges.inbound_queue("exec-1", (0, 0, 1), "in")
    rq = a.edges.remote_queue("exec-1", (0, 0, 1), "b", b.address)
    with pytest.raises(TypeError, match="a chunk .*, a Watermark, a SnapshotBarrier or DONE"):
        rq.offer((1, 2))
    with pytest.raises(TypeError, match="cannot serialize"):
        rq.offer([object()])
    with pytest.raises(ValueError, match="already registered"):
        b.edges.inbound_queue("exec-1", (0, 0, 1), "in")
    with pytest.raises(ValueError, match="already has a sending end"):
        a.edges.remote_queue("exec-1", (0, 0, 1), "b", b.address)
    with pytest.raises(ValueError, match="stream must be a tuple"):
        b.edges.inbound_queue("exec-1", [0, 0, 1], "in")
    with pytest.raises(ValueError, match="exec_key must be a non-empty string"):
        a.edges.remote_queue("", (0, 0, 1), "b", b.address)
