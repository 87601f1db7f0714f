"""The execution service: backpressure, failures, cancellation and work stealing."""

from __future__ import annotations

import threading
import time
import traceback

import pytest

from jetwake import (
    DAG, Edge, JobCancelledError, JobStatus, Member, Pipeline, Processor, Sinks, Sources,
)
from jetwake.engine.execution.execution_service import Execution, ExecutionService
from jetwake.engine.execution.tasklet import DONE_STATE, MADE_PROGRESS, NO_PROGRESS
from support.waiting import stays_true, wait_until

TIMEOUT = 20


# --- backpressure ------------------------------------------------------------------------

class CountingSource(Processor):
    """Emits 0..total-1 in chunks of ``chunk`` and tracks how far it runs ahead of the sink."""

    def __init__(self, total, chunk, stats):
        self.total = total
        self.chunk = chunk
        self.stats = stats
        self.next = 0

    def complete(self):
        stats = self.stats
        while self.next < self.total and self.outbox.has_room(0):
            end = min(self.next + self.chunk, self.total)
            self.outbox.offer_chunk(0, list(range(self.next, end)))
            self.next = end
            stats["emitted"] = end
            stats["max_ahead"] = max(stats["max_ahead"], end - stats["received"])
        return self.next >= self.total


class SlowSink(Processor):
    def __init__(self, stats, out, delay):
        self.stats = stats
        self.out = out
        self.delay = delay

    def process(self, ordinal, inbox):
        time.sleep(self.delay)
        items = inbox.drain()
        self.out.extend(items)
        self.stats["received"] += len(items)


def test_slow_sink_with_a_small_queue_holds_the_source_back():
    total, chunk = 60_000, 100
    stats = {"emitted": 0, "received": 0, "max_ahead": 0}
    out: list = []
    dag = DAG()
    src = dag.new_vertex("src", lambda: CountingSource(total, chunk, stats), 1)
    sink = dag.new_vertex("sink", lambda: SlowSink(stats, out, 0.002), 1)
    edge = Edge.between(src, sink)
    edge.queue_size = 2
    dag.edge(edge)
    with Member(local_parallelism=1) as m:
        m.new_job(dag).join(timeout=TIMEOUT)
    assert out == list(range(total))  # everything arrives, in order
    # bounded by one outbox (4096 items) plus a few queued chunks, far below the total
    assert stats["max_ahead"] <= 4096 + 10 * chunk, stats
    assert stats["max_ahead"] < total / 4


def test_slow_pipeline_sink_receives_every_item_in_order():
    # a pipeline version: a slow map stage (fused) must not lose or reorder items
    def slow_identity(x):
        if x % 1000 == 0:
            time.sleep(0.001)
        return x

    p = Pipeline()
    p.read_from(Sources.items(range(20_000))).map(slow_identity).write_to(Sinks.list("out"))
    with Member(local_parallelism=1) as m:
        m.new_job(p).join(timeout=TIMEOUT)
        assert list(m.get_list("out")) == list(range(20_000))


# --- failures ----------------------------------------------------------------------------

class UserError(Exception):
    pass


def user_function_that_fails(x):
    if x == 777:
        raise UserError(f"cannot handle {x}")
    return x


def test_processor_exception_fails_the_job_with_the_users_own_exception():
    p = Pipeline()
    p.read_from(Sources.items(range(2000))).map(user_function_that_fails) \
        .write_to(Sinks.list("out"))
    with Member(local_parallelism=2) as m:
        job = m.new_job(p)
        with pytest.raises(UserError, match="cannot handle 777") as exc_info:
            job.join(timeout=TIMEOUT)
        assert job.status is JobStatus.FAILED
        frames = [f.name for f in traceback.extract_tb(exc_info.value.__traceback__)]
        assert "user_function_that_fails" in frames


def test_failed_job_raises_the_same_error_on_every_join():
    p = Pipeline()
    p.read_from(Sources.items([777])).map(user_function_that_fails).write_to(Sinks.list("o"))
    with Member() as m:
        job = m.new_job(p)
        for _ in range(2):
            with pytest.raises(UserError):
                job.join(timeout=TIMEOUT)


def test_member_runs_another_job_after_a_failed_one():
    with Member(local_parallelism=2) as m:
        p = Pipeline()
        p.read_from(Sources.items(range(1000))).map(user_function_that_fails) \
            .write_to(Sinks.list("bad"))
        with pytest.raises(UserError):
            m.new_job(p).join(timeout=TIMEOUT)
        p2 = Pipeline()
        p2.read_from(Sources.items(range(100))).map(lambda x: x + 1).write_to(Sinks.list("ok"))
        job = m.new_job(p2)
        job.join(timeout=TIMEOUT)
        assert job.status is JobStatus.COMPLETED
        assert sorted(m.get_list("ok")) == list(range(1, 101))


def test_exception_in_complete_fails_the_job():
    class Broken(Processor):
        def complete(self):
            raise KeyError("missing-config")

    dag = DAG()
    dag.new_vertex("broken", Broken, 1)
    with Member() as m:
        job = m.new_job(dag)
        with pytest.raises(KeyError, match="missing-config"):
            job.join(timeout=TIMEOUT)
        assert job.status is JobStatus.FAILED


def test_exception_in_a_non_cooperative_processor_fails_the_job():
    class BlockingBroken(Processor):
        def is_cooperative(self):
            return False

        def complete(self):
            raise UserError("io failed")

    dag = DAG()
    dag.new_vertex("io", BlockingBroken, 1)
    with Member() as m:
        job = m.new_job(dag)
        with pytest.raises(UserError, match="io failed"):
            job.join(timeout=TIMEOUT)
        assert job.status is JobStatus.FAILED


def test_join_with_timeout_raises_timeout_error_while_running():
    class Forever(Processor):
        def complete(self):
            return False

    dag = DAG()
    dag.new_vertex("forever", Forever, 1)
    with Member() as m:
        job = m.new_job(dag)
        with pytest.raises(TimeoutError):
            job.join(timeout=0.05)
        assert job.status is JobStatus.RUNNING
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(timeout=5)


# --- cancellation ------------------------------------------------------------------------

class InfiniteSource(Processor):
    def __init__(self):
        self.n = 0

    def complete(self):
        while self.outbox.has_room():
            self.outbox.offer_chunk(-1, list(range(self.n, self.n + 100)))
            self.n += 100
        return False


class Discard(Processor):
    def process(self, ordinal, inbox):
        inbox.clear()


def test_cancel_stops_an_infinite_job_promptly():
    dag = DAG()
    src = dag.new_vertex("src", InfiniteSource, 2)
    sink = dag.new_vertex("sink", Discard, 2)
    dag.edge(Edge.between(src, sink))
    with Member() as m:
        job = m.new_job(dag)
        wait_until(lambda: job.status is JobStatus.RUNNING, what="the job to run")
        start = time.monotonic()
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(timeout=2)
        assert time.monotonic() - start < 2
        assert job.status is JobStatus.FAILED


def test_cancel_stops_an_infinite_non_cooperative_processor():
    running = threading.Event()

    class BlockingForever(Processor):
        def is_cooperative(self):
            return False

        def complete(self):
            running.set()
            time.sleep(0.001)
            return False

    dag = DAG()
    dag.new_vertex("blocking", BlockingForever, 1)
    with Member() as m:
        job = m.new_job(dag)
        wait_until(running.is_set, what="the processor to run")
        start = time.monotonic()
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(timeout=2)
        assert time.monotonic() - start < 2


def test_cancel_of_a_finished_job_is_refused():
    from jetwake import JobStateError
    p = Pipeline()
    p.read_from(Sources.items([1])).write_to(Sinks.list("x"))
    with Member() as m:
        job = m.new_job(p)
        job.join(timeout=TIMEOUT)
        with pytest.raises(JobStateError, match="COMPLETED"):
            job.cancel()


def test_member_runs_another_job_after_a_cancelled_one():
    dag = DAG()
    src = dag.new_vertex("src", InfiniteSource, 1)
    sink = dag.new_vertex("sink", Discard, 1)
    dag.edge(Edge.between(src, sink))
    with Member() as m:
        job = m.new_job(dag)
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(timeout=2)
        p = Pipeline()
        p.read_from(Sources.items(range(10))).write_to(Sinks.list("after"))
        m.new_job(p).join(timeout=TIMEOUT)
        assert sorted(m.get_list("after")) == list(range(10))


def test_job_metrics_count_items_in_and_out_per_vertex():
    p = Pipeline()
    p.read_from(Sources.items(range(500))).filter(lambda x: x % 5 == 0) \
        .write_to(Sinks.list("m"))
    with Member(local_parallelism=2) as m:
        job = m.new_job(p)
        job.join(timeout=TIMEOUT)
        metrics = job.metrics()
    assert metrics["list-sink-m"]["items_in"] == 100
    # the source vertex emitted 500; the fused filter on its outgoing edge dropped 400
    assert metrics["items"]["items_out"] == 500


# --- work stealing -----------------------------------------------------------------------

class FakeTasklet:
    """A stand-in tasklet: done when its ``release`` event is set."""

    def __init__(self, name):
        self.name = name
        self.is_cooperative = True
        self.steal_to = None
        self.execution = None
        self.release = threading.Event()
        self.closed = 0
        self.threads = set()

    def call(self):
        self.threads.add(threading.current_thread().name)
        return DONE_STATE if self.release.is_set() else NO_PROGRESS

    def close(self):
        self.closed += 1


def test_try_steal_for_marks_a_tasklet_of_the_busiest_worker():
    svc = ExecutionService(2)  # not started: the test moves nothing but marks
    thief, busy = svc._workers
    busy.tasklets = [FakeTasklet(f"t{i}") for i in range(4)]
    svc.try_steal_for(thief)
    marked = [t for t in busy.tasklets if t.steal_to is not None]
    assert len(marked) == 1 and marked[0].steal_to is thief


def test_try_steal_for_does_nothing_when_loads_differ_by_less_than_two():
    svc = ExecutionService(2)
    thief, busy = svc._workers
    busy.tasklets = [FakeTasklet("a"), FakeTasklet("b")]
    thief.tasklets = [FakeTasklet("c")]
    svc.try_steal_for(thief)
    assert all(t.steal_to is None for t in busy.tasklets + thief.tasklets)


def test_try_steal_for_does_not_steal_from_itself():
    svc = ExecutionService(2)
    busiest, other = svc._workers
    busiest.tasklets = [FakeTasklet(str(i)) for i in range(5)]
    svc.try_steal_for(busiest)
    assert all(t.steal_to is None for t in busiest.tasklets)


def test_try_steal_for_does_not_mark_a_tasklet_twice():
    svc = ExecutionService(2)
    thief, busy = svc._workers
    busy.tasklets = [FakeTasklet(str(i)) for i in range(6)]
    svc.try_steal_for(thief)
    svc.try_steal_for(thief)
    marked = [t for t in busy.tasklets if t.steal_to is thief]
    assert len(marked) == 2


def test_worker_loads_rebalance_when_tasklets_finish_at_different_times():
    svc = ExecutionService(2)
    tasklets = [FakeTasklet(f"t{i}") for i in range(12)]
    ended = threading.Event()
    execution = Execution("steal", tasklets, lambda ex: ended.set())
    try:
        svc.submit(execution)  # round-robin: even indices on worker 0, odd on worker 1
        wait_until(lambda: svc.worker_loads() == [6, 6])
        quick = tasklets[0::2]
        # worker 0's tasklets finish one at a time; after each, worker 0 may steal one
        for t in quick:
            t.release.set()
            wait_until(lambda: t.closed == 1)
            wait_until(lambda: all(x.steal_to is None for x in tasklets))
            time.sleep(0.02)
        wait_until(lambda: sorted(svc.worker_loads()) == [3, 3], what="loads of 3 and 3")
        slow = tasklets[1::2]
        moved = [t for t in slow if len(t.threads) == 2]
        assert len(moved) == 3  # three tasklets ran on both workers
        for t in slow:
            t.release.set()
        assert ended.wait(5)
        assert all(t.closed == 1 for t in tasklets)
        assert svc.worker_loads() == [0, 0]
    finally:
        for t in tasklets:
            t.release.set()
        svc.shutdown()


def test_idle_worker_steals_when_its_last_tasklet_finishes():
    svc = ExecutionService(2)
    tasklets = [FakeTasklet(f"t{i}") for i in range(6)]
    ended = threading.Event()
    execution = Execution("steal", tasklets, lambda ex: ended.set())
    try:
        svc.submit(execution)
        wait_until(lambda: svc.worker_loads() == [3, 3])
        for t in tasklets[0::2]:  # worker 0 runs out of work all at once
            t.release.set()
        # worker 0 finished its three at once and took one of worker 1's three
        wait_until(lambda: svc.worker_loads() == [1, 2], what="loads of 1 and 2")
    finally:
        for t in tasklets:
            t.release.set()
        assert ended.wait(5)
        svc.shutdown()


def test_execution_calls_on_end_once_after_every_tasklet_ended():
    calls = []
    svc = ExecutionService(1)
    tasklets = [FakeTasklet(str(i)) for i in range(3)]
    for t in tasklets:
        t.release.set()
    done = threading.Event()

    def on_end(ex):
        calls.append([t.closed for t in tasklets])
        done.set()

    try:
        svc.submit(Execution("e", tasklets, on_end))
        assert done.wait(5)
        stays_true(lambda: len(calls) == 1, seconds=0.05, what="one call of on_end")
        assert calls == [[1, 1, 1]]
    finally:
        svc.shutdown()


def test_made_progress_constant_differs_from_the_others():
    assert len({NO_PROGRESS, MADE_PROGRESS, DONE_STATE}) == 3


def test_failed_job_error_carries_a_note_naming_the_processor():
    class Exploding(Processor):
        def complete(self):
            raise UserError("kaboom")

    dag = DAG()
    dag.new_vertex("exploder", Exploding, 1)
    with Member() as m:
        with pytest.raises(UserError) as e:
            m.new_job(dag).join(timeout=TIMEOUT)
    notes = " ".join(getattr(e.value, "__notes__", []))
    assert "exploder" in notes
