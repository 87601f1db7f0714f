"""The watermark coalescer: the minimum over live, non-idle inputs, never going backwards."""

from __future__ import annotations

from jetwake.engine.execution.watermark_coalescer import NO_WATERMARK, WatermarkCoalescer
from jetwake.engine.core.stream_items import IDLE_TIMESTAMP


def test_output_waits_until_every_input_has_a_watermark():
    c = WatermarkCoalescer(2)
    assert c.observe(0, 10) is None
    assert c.observe(1, 5) == 5


def test_output_is_the_minimum_over_inputs():
    c = WatermarkCoalescer(3)
    c.observe(0, 30)
    c.observe(1, 20)
    assert c.observe(2, 25) == 20
    assert c.observe(1, 40) == 25
    assert c.observe(2, 50) == 30


def test_output_never_goes_backwards():
    c = WatermarkCoalescer(2)
    c.observe(0, 10)
    assert c.observe(1, 10) == 10
    assert c.observe(0, 5) is None  # an input going back is ignored
    assert c.observe(1, 8) is None
    assert c.last_emitted == 10


def test_an_idle_input_does_not_hold_the_others_back():
    c = WatermarkCoalescer(2)
    c.observe(0, 10)
    assert c.observe(1, IDLE_TIMESTAMP) == 10
    assert c.observe(0, 20) == 20


def test_an_input_that_never_sent_a_watermark_can_go_idle():
    c = WatermarkCoalescer(2)
    assert c.observe(0, 100) is None
    assert c.observe(1, IDLE_TIMESTAMP) == 100


def test_all_inputs_idle_gives_the_idle_marker_once():
    c = WatermarkCoalescer(2)
    c.observe(0, 10)
    c.observe(1, 10)
    assert c.observe(0, IDLE_TIMESTAMP) is None
    assert c.observe(1, IDLE_TIMESTAMP) == IDLE_TIMESTAMP
    assert c.observe(1, IDLE_TIMESTAMP) is None


def test_an_input_waking_up_repeats_the_last_watermark_when_it_is_behind():
    c = WatermarkCoalescer(2)
    c.observe(0, 10)
    c.observe(1, 10)
    c.observe(0, IDLE_TIMESTAMP)
    c.observe(1, IDLE_TIMESTAMP)
    # input 1 is active again but behind: downstream hears it is no longer idle
    assert c.observe(1, 5) == 10
    assert c.observe(1, 30) == 30


def test_a_done_input_no_longer_counts():
    c = WatermarkCoalescer(2)
    c.observe(0, 50)
    assert c.observe(1, 10) == 10
    assert c.queue_done(1) == 50


def test_done_inputs_leave_only_idle_ones():
    c = WatermarkCoalescer(2)
    c.observe(0, IDLE_TIMESTAMP)
    assert c.queue_done(1) == IDLE_TIMESTAMP


def test_every_input_done_gives_nothing():
    c = WatermarkCoalescer(1)
    c.observe(0, 7)
    assert c.queue_done(0) is None


def test_random_sequences_never_go_backwards_and_never_exceed_any_live_input():
    import random
    rnd = random.Random(3)
    for _ in range(200):
        n = rnd.randint(1, 4)
        c = WatermarkCoalescer(n)
        wms = [NO_WATERMARK] * n
        idle = [False] * n
        done = [False] * n
        last = NO_WATERMARK
        top = NO_WATERMARK
        for _ in range(30):
            q = rnd.randrange(n)
            if done[q]:
                continue
            r = rnd.random()
            if r < 0.1:
                done[q] = True
                out = c.queue_done(q)
            elif r < 0.25:
                idle[q] = True
                out = c.observe(q, IDLE_TIMESTAMP)
            else:
                idle[q] = False
                wms[q] = max(wms[q], rnd.randint(0, 100))
                top = max(top, wms[q])
                out = c.observe(q, wms[q])
            if out is not None and out != IDLE_TIMESTAMP:
                if out == last:
                    continue  # the repeat that says "no longer idle"
                assert out > last
                live = [w for w, i, d in zip(wms, idle, done) if not i and not d]
                if live:
                    assert all(out <= w for w in live)
                else:  # every input fell idle: the highest watermark reached, then idle
                    assert out == top
                    assert c.take_deferred() == IDLE_TIMESTAMP
                last = out


def test_inputs_falling_idle_in_either_order_end_at_the_same_watermark():
    # one input reached 900 and one never emitted: whichever falls idle first, event time
    # reaches 900 before the idle marker goes downstream
    for first, second in ((0, 1), (1, 0)):
        c = WatermarkCoalescer(2)
        assert c.observe(0, 900) is None  # input 1 has no watermark yet
        outs = [c.observe(first, IDLE_TIMESTAMP), c.observe(second, IDLE_TIMESTAMP)]
        outs = [o for o in outs if o is not None]
        deferred = c.take_deferred()
        if deferred is not None:
            outs.append(deferred)
        assert outs == [900, IDLE_TIMESTAMP]
