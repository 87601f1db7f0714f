"""The processor contract: Inbox, Outbox, Traverser, AbstractProcessor/FlatMapper and the
lifecycle calls the engine makes (complete, complete_edge, close, cooperative threads)."""

from __future__ import annotations

import threading

import pytest

from jetwake import (
    DAG, AbstractProcessor, BroadcastKey, Edge, Inbox, JobCancelledError, JobStatus, Member,
    Outbox, Processor, Traverser, Watermark,
)
from jetwake.engine.core.chunk_emitter import ChunkEmitter
from support.waiting import wait_until

TIMEOUT = 20


def take_items(outbox: Outbox, ordinal: int = 0) -> list:
    """What the engine would move from one outbox bucket: the data items, in order."""
    return [x for x in outbox.drain(ordinal) if not isinstance(x, Watermark)]


# --- Inbox -------------------------------------------------------------------------------

def test_inbox_peek_returns_oldest_without_removing():
    inbox = Inbox([1, 2, 3])
    assert inbox.peek() == 1
    assert inbox.peek() == 1
    assert len(inbox) == 3


def test_inbox_poll_removes_oldest_first_and_returns_none_when_empty():
    inbox = Inbox([1, 2])
    assert inbox.poll() == 1
    assert inbox.poll() == 2
    assert inbox.poll() is None
    assert inbox.peek() is None
    assert not inbox and inbox.is_empty() and len(inbox) == 0


def test_inbox_remove_drops_oldest_and_raises_when_empty():
    inbox = Inbox(["a", "b"])
    inbox.remove()
    assert list(inbox) == ["b"]
    inbox.remove()
    with pytest.raises(IndexError):
        inbox.remove()


def test_inbox_drain_returns_the_remaining_items_and_empties_it():
    inbox = Inbox([1, 2, 3, 4])
    inbox.poll()
    assert inbox.drain() == [2, 3, 4]
    assert len(inbox) == 0 and inbox.drain() == []


def test_inbox_len_and_iteration_track_the_remaining_items():
    inbox = Inbox(list(range(5)))
    inbox.poll()
    inbox.poll()
    assert len(inbox) == 3
    assert list(inbox) == [2, 3, 4]
    assert len(inbox) == 3  # iterating does not consume


def test_inbox_clear_empties_it():
    inbox = Inbox([1, 2])
    inbox.clear()
    assert not inbox and inbox.poll() is None


# --- Outbox ------------------------------------------------------------------------------

def test_outbox_refuses_offer_when_bucket_is_full():
    outbox = Outbox(1, capacity=2)
    assert outbox.offer(0, "a")
    assert outbox.offer(0, "b")
    assert not outbox.has_room(0)
    assert not outbox.offer(0, "c")
    assert take_items(outbox) == ["a", "b"]
    assert outbox.offer(0, "c")  # room again once the engine took the bucket


def test_outbox_offer_chunk_accepts_a_whole_chunk_when_the_bucket_has_room():
    outbox = Outbox(1, capacity=2)
    assert outbox.offer(0, 0)
    assert outbox.offer_chunk(0, [1, 2, 3, 4, 5])  # one slot free: the whole chunk goes in
    assert not outbox.offer_chunk(0, [6])
    assert not outbox.offer(0, 6)
    assert take_items(outbox) == [0, 1, 2, 3, 4, 5]


def test_outbox_offer_chunk_of_nothing_is_accepted_even_when_full():
    outbox = Outbox(1, capacity=1)
    outbox.offer(0, 1)
    assert outbox.offer_chunk(0, [])
    assert take_items(outbox) == [1]


def test_outbox_ordinal_minus_one_offers_to_every_ordinal():
    outbox = Outbox(3, capacity=10)
    assert outbox.offer(-1, "x")
    chunk = ["y", "z"]
    assert outbox.offer_chunk(-1, chunk)
    buckets = [take_items(outbox, o) for o in range(3)]
    assert buckets == [["x", "y", "z"]] * 3


def test_outbox_offer_chunk_to_all_ordinals_gives_each_its_own_list():
    outbox = Outbox(2, capacity=10)
    chunk = [1, 2]
    outbox.offer_chunk(-1, chunk)
    chunk.append(3)  # the outbox owns the list now: only the ordinal holding it sees this
    assert sorted([take_items(outbox, 0), take_items(outbox, 1)]) == [[1, 2], [1, 2, 3]]


def test_outbox_ordinal_minus_one_is_refused_when_any_bucket_is_full():
    outbox = Outbox(2, capacity=1)
    assert outbox.offer(1, "only-1")
    assert not outbox.has_room(-1)
    assert not outbox.offer(-1, "all")
    assert not outbox.offer_chunk(-1, ["all"])
    assert take_items(outbox, 0) == []
    assert take_items(outbox, 1) == ["only-1"]


def test_outbox_keeps_emission_order_across_offer_and_offer_chunk():
    outbox = Outbox(1, capacity=100)
    outbox.offer(0, 1)
    outbox.offer_chunk(0, [2, 3])
    outbox.offer(0, 4)
    assert take_items(outbox) == [1, 2, 3, 4]


def test_outbox_offer_to_snapshot_saves_entries_until_its_buffer_is_full():
    outbox = Outbox(1, capacity=2)
    assert outbox.offer_to_snapshot("k1", 1)
    assert outbox.offer_to_snapshot(BroadcastKey("b"), 2)
    assert not outbox.offer_to_snapshot("k3", 3)
    assert not outbox.is_empty()
    assert outbox.drain_snapshot() == [("k1", 1), (BroadcastKey("b"), 2)]
    assert outbox.is_empty()
    assert outbox.offer_to_snapshot("k3", 3)


def test_outbox_snapshot_entries_do_not_reach_the_data_buckets():
    outbox = Outbox(1, capacity=10)
    outbox.offer_to_snapshot("k", "v")
    assert take_items(outbox) == []


def test_outbox_drain_returns_items_and_control_items_in_emission_order_and_empties_it():
    outbox = Outbox(1, capacity=10)
    outbox.offer(0, "a")
    outbox.offer_control(Watermark(5))
    outbox.offer_chunk(0, ["b", ["a list item"]])
    assert outbox.drain(0) == ["a", Watermark(5), "b", ["a list item"]]
    assert outbox.drain(0) == [] and outbox.is_empty()
    assert outbox.offer(0, "room again")


def test_outbox_snapshot_capacity_bounds_the_snapshot_buffer_apart_from_the_buckets():
    outbox = Outbox(1, capacity=100, snapshot_capacity=1)
    assert outbox.offer_to_snapshot("k1", 1)
    assert not outbox.offer_to_snapshot("k2", 2)
    assert outbox.offer_chunk(0, list(range(50)))
    assert outbox.drain_snapshot() == [("k1", 1)]
    assert outbox.offer_to_snapshot("k2", 2)


def test_outbox_of_a_sink_accepts_broadcast_offers_and_stays_empty():
    outbox = Outbox(0, capacity=2)
    assert outbox.offer(-1, "x")
    assert outbox.is_empty()


# --- Traverser ---------------------------------------------------------------------------

def test_traverser_returns_items_then_none():
    t = Traverser.over([1, 2])
    assert (t.next(), t.next(), t.next(), t.next()) == (1, 2, None, None)


def test_traverser_empty_and_singleton():
    assert Traverser.empty().next() is None
    s = Traverser.singleton("x")
    assert (s.next(), s.next()) == ("x", None)
    assert Traverser.singleton(None).next() is None


def test_traverser_map_drops_none_results():
    t = Traverser.over(range(6)).map(lambda x: x * 10 if x % 2 else None)
    assert list(t) == [10, 30, 50]


def test_traverser_filter_and_append():
    t = Traverser.over(range(6)).filter(lambda x: x > 3).append(99)
    assert list(t) == [4, 5, 99]


def test_traverser_flat_map_accepts_traversers_and_iterables():
    t = Traverser.over([1, 2, 3]).flat_map(
        lambda x: Traverser.over([x] * x) if x % 2 else [x * 100])
    assert list(t) == [1, 200, 3, 3, 3]


# --- AbstractProcessor and FlatMapper under a tiny outbox ----------------------------------

def drive(proc: Processor, items: list, capacity: int = 2, max_rounds: int = 10_000) -> list:
    """Calls process() the way the engine does, emptying the outbox between calls."""
    outbox = Outbox(1, capacity)
    proc.outbox = outbox
    inbox = Inbox(list(items))
    out: list = []
    rounds = 0
    while inbox:
        proc.process(0, inbox)
        out.extend(take_items(outbox))
        rounds += 1
        assert rounds < max_rounds, "processor made no progress"
    out.extend(take_items(outbox))
    return out


class Doubler(AbstractProcessor):
    def __init__(self):
        self.seen: list = []

    def try_process_item(self, ordinal, item):
        self.seen.append(item)
        return self.try_emit(item * 2)


def test_try_process_item_with_a_tiny_outbox_emits_everything_in_order():
    proc = Doubler()
    assert drive(proc, list(range(50))) == [x * 2 for x in range(50)]


def test_try_process_item_is_offered_a_refused_item_again():
    proc = Doubler()
    drive(proc, [1, 2, 3, 4, 5], capacity=2)
    # each item is retried once after the outbox filled up, never skipped
    assert [x for i, x in enumerate(proc.seen) if i == 0 or proc.seen[i - 1] != x] == \
        [1, 2, 3, 4, 5]
    assert len(proc.seen) > 5


def test_abstract_processor_leaves_unhandled_items_in_the_inbox():
    proc = Doubler()
    proc.outbox = Outbox(1, capacity=2)
    inbox = Inbox([1, 2, 3, 4, 5])
    proc.process(0, inbox)
    assert list(inbox) == [3, 4, 5]
    assert take_items(proc.outbox) == [2, 4]


class Repeater(AbstractProcessor):
    """Emits each item ``item`` times through a FlatMapper."""

    def __init__(self):
        self.fm = self.flat_mapper(lambda x: [x] * x)

    def try_process_item(self, ordinal, item):
        return self.fm.try_process(item)


def test_flat_mapper_emits_all_outputs_of_each_item_in_order_under_backpressure():
    out = drive(Repeater(), [3, 1, 5, 2], capacity=2)
    assert out == [3, 3, 3, 1, 5, 5, 5, 5, 5, 2, 2]


def test_flat_mapper_calls_the_function_once_per_item():
    calls: list = []

    class Counted(AbstractProcessor):
        def __init__(self):
            self.fm = self.flat_mapper(lambda x: calls.append(x) or Traverser.over([x] * 4))

        def try_process_item(self, ordinal, item):
            return self.fm.try_process(item)

    assert drive(Counted(), ["a", "b"], capacity=1) == ["a"] * 4 + ["b"] * 4
    assert calls == ["a", "b"]


def test_emit_from_traverser_keeps_the_refused_item_for_the_next_call():
    class P(AbstractProcessor):
        pass

    proc = P()
    proc.outbox = Outbox(1, capacity=2)
    t = Traverser.over(range(5))
    assert not proc.emit_from_traverser(t)
    assert take_items(proc.outbox) == [0, 1]
    assert not proc.emit_from_traverser(t)
    assert take_items(proc.outbox) == [2, 3]
    assert proc.emit_from_traverser(t)
    assert take_items(proc.outbox) == [4]


def test_chunk_emitter_resumes_where_the_outbox_refused():
    outbox = Outbox(1, capacity=3)
    em = ChunkEmitter(range(10), size=2)
    out: list = []
    rounds = 0
    while not em.emit(outbox):
        out.extend(take_items(outbox))
        rounds += 1
    out.extend(take_items(outbox))
    assert out == list(range(10)) and rounds >= 2


def test_abstract_processor_without_try_process_item_names_the_method():
    class Lazy(AbstractProcessor):
        pass

    p = Lazy()
    p.outbox = Outbox(1)
    with pytest.raises(NotImplementedError, match="try_process_item"):
        p.process(0, Inbox([1]))


# --- lifecycle in a running job ----------------------------------------------------------

class Source(Processor):
    def __init__(self, items):
        self.items = items
        self.em = None

    def init(self, context):
        super().init(context)
        self.em = ChunkEmitter(list(self.items), size=10)

    def complete(self):
        return self.em.emit(self.outbox)


class Sink(Processor):
    def __init__(self, out):
        self.out = out

    def process(self, ordinal, inbox):
        self.out.extend(inbox.drain())


def run(dag, timeout=TIMEOUT):
    with Member(local_parallelism=1) as m:
        job = m.new_job(dag)
        job.join(timeout=timeout)
        return job


def test_complete_is_called_until_it_returns_true():
    calls = []

    class Slow(Processor):
        def complete(self):
            calls.append(1)
            return len(calls) >= 4

    dag = DAG()
    dag.new_vertex("slow", Slow, 1)
    assert run(dag).status is JobStatus.COMPLETED
    assert len(calls) == 4


def test_complete_of_a_processor_with_inputs_runs_after_all_items():
    events = []

    class Collect(Processor):
        def process(self, ordinal, inbox):
            events.extend(inbox.drain())

        def complete(self):
            events.append("complete")
            return True

    dag = DAG()
    src = dag.new_vertex("src", lambda: Source(range(100)), 1)
    sink = dag.new_vertex("sink", Collect, 1)
    dag.edge(Edge.between(src, sink))
    run(dag)
    assert events == list(range(100)) + ["complete"]


def test_complete_edge_is_called_once_per_input_ordinal_after_its_items():
    events = []

    class TwoInputs(Processor):
        def process(self, ordinal, inbox):
            events.extend((ordinal, x) for x in inbox.drain())

        def complete_edge(self, ordinal):
            events.append(("edge-done", ordinal))
            return True

        def complete(self):
            events.append("complete")
            return True

    dag = DAG()
    a = dag.new_vertex("a", lambda: Source(["a"] * 50), 1)
    b = dag.new_vertex("b", lambda: Source(["b"] * 70), 1)
    sink = dag.new_vertex("sink", TwoInputs, 1)
    dag.edge(Edge(a, 0, sink, 0)).edge(Edge(b, 0, sink, 1))
    run(dag)
    done = [e for e in events if isinstance(e, tuple) and e[0] == "edge-done"]
    assert sorted(done) == [("edge-done", 0), ("edge-done", 1)]
    assert events[-1] == "complete"
    for ordinal in (0, 1):
        done_at = events.index(("edge-done", ordinal))
        assert all(e[0] != ordinal for e in events[done_at + 1:] if isinstance(e, tuple))
    assert sum(1 for e in events if e == (0, "a")) == 50
    assert sum(1 for e in events if e == (1, "b")) == 70


def test_complete_edge_returning_false_is_called_again():
    calls = []

    class Retry(Processor):
        def process(self, ordinal, inbox):
            inbox.clear()

        def complete_edge(self, ordinal):
            calls.append(ordinal)
            return len(calls) >= 3

    dag = DAG()
    src = dag.new_vertex("src", lambda: Source(range(5)), 1)
    sink = dag.new_vertex("sink", Retry, 1)
    dag.edge(Edge.between(src, sink))
    run(dag)
    assert calls == [0, 0, 0]


class CloseCounting(Processor):
    def __init__(self, closes, name, fail_on=None, forever=False):
        self.closes = closes
        self.name = name
        self.fail_on = fail_on
        self.forever = forever

    def process(self, ordinal, inbox):
        items = inbox.drain()
        if self.fail_on is not None and self.fail_on in items:
            raise RuntimeError("boom")

    def complete(self):
        return not self.forever

    def close(self):
        self.closes[self.name] = self.closes.get(self.name, 0) + 1


def test_close_is_called_once_per_processor_after_success():
    closes: dict = {}
    dag = DAG()
    src = dag.new_vertex("src", lambda: Source(range(10)), 1)
    sink = dag.new_vertex("sink", lambda: CloseCounting(closes, "sink"), 1)
    dag.edge(Edge.between(src, sink))
    run(dag)
    assert closes == {"sink": 1}


def test_close_is_called_once_on_every_processor_after_a_failure():
    closes: dict = {}
    lock = threading.Lock()
    seq = iter(range(100))

    def counting(**kw):
        def make():
            with lock:
                n = next(seq)
            return CloseCounting(closes, f"{kw.get('name')}-{n}", kw.get("fail_on"),
                                 kw.get("forever", False))
        return make

    dag = DAG()
    src = dag.new_vertex("src", lambda: Source(range(100)), 1)
    bad = dag.new_vertex("bad", counting(name="bad", fail_on=42), 2)
    idle = dag.new_vertex("idle", counting(name="idle", forever=True), 1)
    dag.edge(Edge.between(src, bad))
    dag.edge(Edge(src, 1, idle, 0))
    with Member(local_parallelism=1) as m:
        job = m.new_job(dag)
        with pytest.raises(RuntimeError, match="boom"):
            job.join(timeout=TIMEOUT)
        assert job.status is JobStatus.FAILED
    assert len(closes) == 3
    assert all(v == 1 for v in closes.values()), closes


def test_close_is_called_once_after_cancel():
    closes: dict = {}
    running = threading.Event()

    class Running(CloseCounting):
        def complete(self):
            running.set()
            return super().complete()

    dag = DAG()
    dag.new_vertex("forever", lambda: Running(closes, "forever", forever=True), 1)
    with Member(local_parallelism=1) as m:
        job = m.new_job(dag)
        wait_until(running.is_set, what="the processor to run")
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(timeout=5)
    assert closes == {"forever": 1}


def test_close_is_called_on_initialized_processors_when_another_init_fails():
    closes: dict = {}

    class BadInit(Processor):
        def init(self, context):
            raise OSError("cannot open resource")

    dag = DAG()
    good = dag.new_vertex("good", lambda: CloseCounting(closes, "good"), 1)
    bad = dag.new_vertex("bad", BadInit, 1)
    dag.edge(Edge.between(good, bad))
    with Member(local_parallelism=1) as m:
        with pytest.raises(OSError, match="cannot open resource"):
            m.new_job(dag)
    assert closes == {"good": 1}


def test_non_cooperative_processor_runs_on_its_own_thread():
    threads: dict = {}

    class Blocking(Processor):
        def is_cooperative(self):
            return False

        def process(self, ordinal, inbox):
            inbox.clear()
            threads.setdefault("blocking", set()).add(threading.current_thread().name)

        def complete(self):
            threads.setdefault("blocking", set()).add(threading.current_thread().name)
            return True

    class Coop(Source):
        def complete(self):
            threads.setdefault("coop", set()).add(threading.current_thread().name)
            return super().complete()

    dag = DAG()
    src = dag.new_vertex("src", lambda: Coop(range(100)), 1)
    sink = dag.new_vertex("io", Blocking, 1)
    dag.edge(Edge.between(src, sink))
    run(dag)
    assert len(threads["blocking"]) == 1
    (blocking_thread,) = threads["blocking"]
    assert blocking_thread.startswith("jetwake-blocking-")
    assert "io" in blocking_thread
    assert all(t.startswith("jetwake-cooperative-") for t in threads["coop"])
    assert blocking_thread not in threads["coop"]


def test_init_receives_a_context_describing_the_processor():
    contexts = []

    class Ctx(Processor):
        def init(self, context):
            super().init(context)
            contexts.append(context)

    dag = DAG()
    dag.new_vertex("v", Ctx, 3)
    with Member(local_parallelism=1) as m:
        job = m.new_job(dag)
        job.join(timeout=TIMEOUT)
    assert sorted(c.global_processor_index for c in contexts) == [0, 1, 2]
    assert {c.local_parallelism for c in contexts} == {3}
    assert {c.vertex_name for c in contexts} == {"v"}
    assert {c.job_id for c in contexts} == {job.id}
    owned = [p for c in contexts for p in c.owned_partitions]
    assert sorted(owned) == list(range(271))


def test_processor_receiving_items_without_process_fails_the_job_naming_the_method():
    dag = DAG()
    src = dag.new_vertex("src", lambda: Source(range(3)), 1)
    sink = dag.new_vertex("sink", Processor, 1)
    dag.edge(Edge.between(src, sink))
    with Member(local_parallelism=1) as m:
        with pytest.raises(NotImplementedError, match="process"):
            m.new_job(dag).join(timeout=TIMEOUT)


def test_items_left_in_the_inbox_are_offered_again_in_order():
    seen = []

    class OneAtATime(Processor):
        def process(self, ordinal, inbox):
            seen.append(inbox.poll())  # handles one item per call, leaves the rest

    dag = DAG()
    src = dag.new_vertex("src", lambda: Source(range(300)), 1)
    sink = dag.new_vertex("sink", OneAtATime, 1)
    dag.edge(Edge.between(src, sink))
    run(dag)
    assert seen == list(range(300))
