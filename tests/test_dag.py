"""The DAG model: validation errors that name the culprit, and the routing of each edge kind
in a job built by hand with the core API."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from jetwake import DAG, DagValidationError, Edge, Member, Processor, RoutingPolicy
from jetwake.engine.core.chunk_emitter import ChunkEmitter
from jetwake.engine.core.partitioning import partition_of

TIMEOUT = 20


# --- processors used by the jobs below -----------------------------------------------------

class TaggedSource(Processor):
    """Emits ``(upstream global index, j)`` for j in range(n)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._emitter = None

    def init(self, context) -> None:
        super().init(context)
        idx = context.global_processor_index
        self._emitter = ChunkEmitter([(idx, j) for j in range(self.n)], size=37)

    def complete(self) -> bool:
        return self._emitter.emit(self.outbox)


class ItemsSource(Processor):
    """Emits the given items, all of them from each processor."""

    def __init__(self, items: list) -> None:
        self.items = items
        self._emitter = None

    def init(self, context) -> None:
        super().init(context)
        self._emitter = ChunkEmitter(list(self.items), size=50)

    def complete(self) -> bool:
        return self._emitter.emit(self.outbox)


class DelayedSource(ItemsSource):
    """Like ItemsSource but starts emitting only after ``delay`` seconds."""

    def __init__(self, items: list, delay: float) -> None:
        super().__init__(items)
        self.delay = delay
        self._start = None

    def complete(self) -> bool:
        if self._start is None:
            self._start = time.monotonic()
        if time.monotonic() - self._start < self.delay:
            return False
        return super().complete()


class Recorder(Processor):
    """Appends ``(its global index, ordinal, item)`` to a shared list."""

    def __init__(self, out: list, lock: threading.Lock) -> None:
        self.out = out
        self.lock = lock

    def process(self, ordinal, inbox) -> None:
        idx = self.context.global_processor_index
        items = inbox.drain()
        with self.lock:
            self.out.extend((idx, ordinal, x) for x in items)


def recorder(out: list):
    lock = threading.Lock()
    return lambda: Recorder(out, lock)


def run(dag: DAG) -> None:
    with Member(local_parallelism=2) as m:
        m.new_job(dag).join(timeout=TIMEOUT)


# --- validation --------------------------------------------------------------------------

def test_cycle_between_two_vertices_is_rejected_naming_them():
    dag = DAG()
    a = dag.new_vertex("alpha", Processor)
    b = dag.new_vertex("beta", Processor)
    dag.edge(Edge.between(a, b))
    dag.edge(Edge.between(b, a))
    with pytest.raises(DagValidationError, match="cycle") as e:
        dag.validate()
    assert "alpha" in str(e.value) and "beta" in str(e.value)


def test_cycle_through_three_vertices_is_rejected():
    dag = DAG()
    a = dag.new_vertex("a", Processor)
    b = dag.new_vertex("b", Processor)
    c = dag.new_vertex("c", Processor)
    dag.edge(Edge.between(a, b)).edge(Edge.between(b, c)).edge(Edge.between(c, a))
    with pytest.raises(DagValidationError, match="cycle"):
        dag.validate()


def test_edge_from_a_vertex_to_itself_is_a_cycle():
    dag = DAG()
    a = dag.new_vertex("selfish", Processor)
    dag.edge(Edge.between(a, a))
    with pytest.raises(DagValidationError, match="cycle") as e:
        dag.validate()
    assert "selfish" in str(e.value)


def test_duplicate_vertex_name_is_rejected_naming_it():
    dag = DAG()
    dag.new_vertex("twice", Processor)
    with pytest.raises(DagValidationError, match="twice"):
        dag.new_vertex("twice", Processor)


def test_non_contiguous_input_ordinals_are_rejected_naming_the_vertex():
    dag = DAG()
    a = dag.new_vertex("src", Processor)
    b = dag.new_vertex("dst", Processor)
    dag.edge(Edge(a, 0, b, 1))  # input ordinal 1 without 0
    with pytest.raises(DagValidationError, match="dst") as e:
        dag.validate()
    assert "ordinal" in str(e.value)


def test_non_contiguous_output_ordinals_are_rejected_naming_the_vertex():
    dag = DAG()
    a = dag.new_vertex("src", Processor)
    b = dag.new_vertex("dst1", Processor)
    c = dag.new_vertex("dst2", Processor)
    dag.edge(Edge(a, 0, b, 0)).edge(Edge(a, 2, c, 0))
    with pytest.raises(DagValidationError, match="src") as e:
        dag.validate()
    assert "output ordinals" in str(e.value)


def test_two_edges_between_the_same_pair_are_rejected_naming_both_vertices():
    dag = DAG()
    a = dag.new_vertex("left", Processor)
    b = dag.new_vertex("right", Processor)
    dag.edge(Edge(a, 0, b, 0)).edge(Edge(a, 1, b, 1))
    with pytest.raises(DagValidationError, match="already an edge") as e:
        dag.validate()
    assert "'left'" in str(e.value) and "'right'" in str(e.value)


def test_unconnected_vertex_is_rejected_naming_it():
    dag = DAG()
    a = dag.new_vertex("a", Processor)
    b = dag.new_vertex("b", Processor)
    dag.new_vertex("lonely", Processor)
    dag.edge(Edge.between(a, b))
    with pytest.raises(DagValidationError, match="lonely") as e:
        dag.validate()
    assert "not connected" in str(e.value)


def test_single_vertex_dag_is_valid():
    dag = DAG()
    dag.new_vertex("only", Processor)
    dag.validate()


def test_empty_dag_is_rejected():
    with pytest.raises(DagValidationError, match="no vertices"):
        DAG().validate()


def test_isolated_edge_with_unequal_parallelism_is_rejected_naming_the_edge():
    dag = DAG()
    a = dag.new_vertex("up", Processor, 2)
    b = dag.new_vertex("down", Processor, 3)
    dag.edge(Edge.between(a, b).isolated())
    with pytest.raises(DagValidationError, match="isolated") as e:
        dag.validate()
    assert "up" in str(e.value) and "down" in str(e.value)


def test_edge_to_a_vertex_not_in_the_dag_is_rejected_naming_it():
    dag = DAG()
    other = DAG()
    a = dag.new_vertex("inside", Processor)
    stranger = other.new_vertex("stranger", Processor)
    with pytest.raises(DagValidationError, match="stranger") as e:
        dag.edge(Edge.between(a, stranger))
    assert "not in this DAG" in str(e.value)


def test_edge_from_a_same_named_vertex_of_another_dag_is_rejected():
    dag = DAG()
    dag.new_vertex("v", Processor)
    b = dag.new_vertex("w", Processor)
    impostor = DAG().new_vertex("v", Processor)
    with pytest.raises(DagValidationError, match="'v'"):
        dag.edge(Edge.between(impostor, b))


def test_vertex_rejects_invalid_local_parallelism():
    with pytest.raises(DagValidationError, match="local_parallelism"):
        DAG().new_vertex("v", Processor, 0)


def test_vertex_rejects_a_processor_instance_instead_of_a_factory():
    with pytest.raises(TypeError, match="factory"):
        DAG().new_vertex("v", Processor())


def test_partitioned_edge_needs_a_callable_key():
    dag = DAG()
    a = dag.new_vertex("a", Processor)
    b = dag.new_vertex("b", Processor)
    with pytest.raises(TypeError, match="callable"):
        Edge.between(a, b).partitioned("key")


def test_topological_order_puts_every_upstream_vertex_first():
    dag = DAG()
    c = dag.new_vertex("c", Processor)
    b = dag.new_vertex("b", Processor)
    a = dag.new_vertex("a", Processor)
    dag.edge(Edge.between(a, b)).edge(Edge.between(b, c)).edge(Edge(a, 1, c, 1))
    dag.validate()
    assert [v.name for v in dag.topological_order()] == ["a", "b", "c"]


def test_edge_builders_set_routing_distribution_and_priority():
    dag = DAG()
    a = dag.new_vertex("a", Processor)
    b = dag.new_vertex("b", Processor)
    e = Edge.from_(a, 0).to(b, 0).partitioned(str).distributed().priority(-1)
    assert e.routing is RoutingPolicy.PARTITIONED and e.is_distributed
    assert e.edge_priority == -1 and e.key_fn is str
    assert Edge.between(a, b).broadcast().routing is RoutingPolicy.BROADCAST
    assert Edge.between(a, b).all_to_one().routing is RoutingPolicy.ALL_TO_ONE
    assert Edge.between(a, b).isolated().routing is RoutingPolicy.ISOLATED
    assert Edge.between(a, b).routing is RoutingPolicy.UNICAST
    assert not Edge.between(a, b).is_distributed


def test_an_edge_without_a_destination_is_refused_naming_to():
    dag = DAG()
    a = dag.new_vertex("a", Processor)
    e = Edge.from_(a, 1)
    with pytest.raises(DagValidationError, match=r"no destination vertex; call to\(\)"):
        e.destination
    with pytest.raises(DagValidationError, match="the edge has no destination vertex"):
        dag.edge(e)
    assert repr(e) == "Edge(a[1] -> ?[0])"


# --- routing in a running job ------------------------------------------------------------

def test_unicast_edge_delivers_each_item_exactly_once():
    out: list = []
    dag = DAG()
    src = dag.new_vertex("src", lambda: TaggedSource(500), 2)
    sink = dag.new_vertex("sink", recorder(out), 3)
    dag.edge(Edge.between(src, sink))
    run(dag)
    received = sorted(x for _, _, x in out)
    assert received == sorted((u, j) for u in range(2) for j in range(500))


def test_partitioned_edge_routes_each_key_to_one_processor():
    out: list = []
    keys = [f"k{i}" for i in range(300)]
    dag = DAG()
    src = dag.new_vertex("src", lambda: TaggedSource(900), 2)
    sink = dag.new_vertex("sink", recorder(out), 3)
    dag.edge(Edge.between(src, sink).partitioned(lambda x: keys[x[1] % 300]).distributed())
    run(dag)
    owners: dict[str, set[int]] = defaultdict(set)
    for idx, _, (_, j) in out:
        owners[keys[j % 300]].add(idx)
    assert set(owners) == set(keys)
    assert all(len(o) == 1 for o in owners.values())
    assert {next(iter(o)) for o in owners.values()} == {0, 1, 2}  # every processor got keys
    assert len(out) == 2 * 900


def test_partitioned_edge_sends_a_key_to_the_processor_owning_its_partition():
    out: list = []
    owned: dict[int, tuple] = {}

    class OwnerRecorder(Recorder):
        def init(self, context):
            super().init(context)
            owned[context.global_processor_index] = tuple(context.owned_partitions)

    lock = threading.Lock()
    dag = DAG()
    src = dag.new_vertex("src", lambda: ItemsSource(list(range(1000))), 1)
    sink = dag.new_vertex("sink", lambda: OwnerRecorder(out, lock), 3)
    dag.edge(Edge.between(src, sink).partitioned(lambda x: x).distributed())
    run(dag)
    assert sorted(x for _, _, x in out) == list(range(1000))
    for idx, _, x in out:
        assert partition_of(x) in owned[idx]


def test_broadcast_edge_delivers_every_item_to_every_processor():
    out: list = []
    dag = DAG()
    src = dag.new_vertex("src", lambda: TaggedSource(300), 2)
    sink = dag.new_vertex("sink", recorder(out), 3)
    dag.edge(Edge.between(src, sink).broadcast())
    run(dag)
    expected = sorted((u, j) for u in range(2) for j in range(300))
    for idx in range(3):
        assert sorted(x for i, _, x in out if i == idx) == expected


def test_all_to_one_edge_delivers_every_item_to_a_single_processor():
    out: list = []
    dag = DAG()
    src = dag.new_vertex("src", lambda: TaggedSource(300), 2)
    sink = dag.new_vertex("sink", recorder(out), 3)
    dag.edge(Edge.between(src, sink).all_to_one().distributed())
    run(dag)
    receivers = {idx for idx, _, _ in out}
    assert len(receivers) == 1
    assert sorted(x for _, _, x in out) == sorted((u, j) for u in range(2) for j in range(300))


def test_isolated_edge_connects_upstream_i_to_downstream_i_only():
    out: list = []
    dag = DAG()
    src = dag.new_vertex("src", lambda: TaggedSource(400), 3)
    sink = dag.new_vertex("sink", recorder(out), 3)
    dag.edge(Edge.between(src, sink).isolated())
    run(dag)
    for idx in range(3):
        got = [x for i, _, x in out if i == idx]
        assert got == [(idx, j) for j in range(400)]  # all of upstream idx, in order


def test_lower_priority_number_edge_is_consumed_completely_before_the_other():
    out: list = []
    dag = DAG()
    fast = dag.new_vertex("fast", lambda: ItemsSource(["f"] * 3000), 1)
    slow = dag.new_vertex("slow", lambda: DelayedSource(["s"] * 3000, 0.05), 1)
    sink = dag.new_vertex("sink", recorder(out), 1)
    dag.edge(Edge(fast, 0, sink, 0))
    dag.edge(Edge(slow, 0, sink, 1).priority(-1))
    run(dag)
    ordinals = [o for _, o, _ in out]
    assert len(ordinals) == 6000
    assert ordinals == [1] * 3000 + [0] * 3000
    assert [x for _, o, x in out if o == 1] == ["s"] * 3000


def test_edge_with_two_output_ordinals_feeds_two_vertices():
    out_a: list = []
    out_b: list = []

    class Splitter(Processor):
        def process(self, ordinal, inbox):
            items = inbox.drain()
            self.outbox.offer_chunk(0, [x for x in items if x % 2 == 0])
            self.outbox.offer_chunk(1, [x for x in items if x % 2 == 1])

    dag = DAG()
    src = dag.new_vertex("src", lambda: ItemsSource(list(range(100))), 1)
    split = dag.new_vertex("split", Splitter, 1)
    even = dag.new_vertex("even", recorder(out_a), 1)
    odd = dag.new_vertex("odd", recorder(out_b), 1)
    dag.edge(Edge.between(src, split))
    dag.edge(Edge(split, 0, even, 0)).edge(Edge(split, 1, odd, 0))
    run(dag)
    assert [x for _, _, x in out_a] == list(range(0, 100, 2))
    assert [x for _, _, x in out_b] == list(range(1, 100, 2))


def test_an_edge_pickled_with_its_destination_under_the_old_name_reads_back():
    import cloudpickle  # as a job record keeps its definition

    from jetwake.engine.core.dag import Vertex

    a, b = Vertex("a", lambda: None), Vertex("b", lambda: None)
    edge = Edge.between(a, b)
    state = dict(edge.__dict__)
    state["destination"] = state.pop("_destination")  # as an older version pickled it
    old = Edge.__new__(Edge)
    old.__setstate__(state)
    again = cloudpickle.loads(cloudpickle.dumps(old))
    assert again.destination.name == "b" and again.source.name == "a"
