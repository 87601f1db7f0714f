"""The adaptive receive window: a receiver that keeps up lets its sender run, a slow one holds
it back, and the window follows the rate at which the receiver really drains."""

from __future__ import annotations

import pytest

from jetwake.engine.cluster.flow_control import ReceiveWindow, SendWindow

KB = 1024


def test_the_window_moves_halfway_to_three_times_what_was_processed():
    rw = ReceiveWindow(initial_window=100 * KB, min_window=1 * KB, max_window=10_000 * KB)
    rw.on_processed(200 * KB)
    limit = rw.next_ack()
    assert rw.window == 100 * KB + (600 * KB - 100 * KB) // 2
    assert limit == 200 * KB + rw.window


def test_a_receiver_that_processes_nothing_shrinks_the_window_to_its_minimum():
    rw = ReceiveWindow(initial_window=1024 * KB, min_window=64 * KB, max_window=4096 * KB)
    for _ in range(20):
        rw.next_ack()
    assert rw.window == 64 * KB


def test_the_window_never_grows_past_its_maximum():
    rw = ReceiveWindow(initial_window=64 * KB, min_window=64 * KB, max_window=512 * KB)
    for _ in range(20):
        rw.on_processed(100_000 * KB)
        rw.next_ack()
    assert rw.window == 512 * KB


def test_a_sender_stops_at_the_acked_limit_and_goes_on_after_the_next_ack():
    rw = ReceiveWindow(initial_window=64 * KB, min_window=64 * KB, max_window=1024 * KB)
    sw = SendWindow(rw.initial_limit())
    packets = 0
    while sw.can_send():
        sw.on_sent(16 * KB)
        packets += 1
    assert packets == 4
    rw.on_processed(64 * KB)  # the receiver drained what came
    sw.on_ack(rw.next_ack())
    assert sw.can_send()


def test_a_slow_receiver_bounds_what_is_in_flight():
    """The sender can never be more than one window plus one packet ahead of the receiver."""
    rw = ReceiveWindow(initial_window=256 * KB, min_window=64 * KB, max_window=4096 * KB)
    sw = SendWindow(rw.initial_limit())
    received = 0
    packet = 8 * KB
    worst = 0
    for step in range(2000):
        if sw.can_send():
            sw.on_sent(packet)
        in_flight = sw.sent - rw.processed
        worst = max(worst, in_flight)
        if step % 10 == 0:  # the receiver drains one packet per 10 steps: slow
            if received < sw.sent:
                rw.on_processed(packet)
                received += packet
        if step % 50 == 0:
            sw.on_ack(rw.next_ack())
    assert worst <= 256 * KB + packet
    assert rw.window < 256 * KB  # the window shrank to the slow rate


def test_an_out_of_date_ack_never_takes_the_limit_back():
    sw = SendWindow(100)
    sw.on_ack(500)
    sw.on_ack(300)
    assert sw.limit == 500


def test_window_bounds_are_checked():
    with pytest.raises(ValueError):
        ReceiveWindow(initial_window=10, min_window=100, max_window=1000)
