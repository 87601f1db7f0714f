"""A partitioned edge splits each chunk by the owner of every item's key partition: every item
reaches the processor owning its key, each processor's items keep the chunk's order, and a
chunk whose items all belong to one processor goes to it whole. Real queues, real partition
tables."""

from __future__ import annotations

import pytest

from jetwake.engine.core.dag import RoutingPolicy
from jetwake.engine.core.partitioning import partition_of, processor_partition_table
from jetwake.engine.execution.conveyor import ChunkQueue
from jetwake.engine.execution.outbound import OutboundEdgeStream


def edge(targets: int) -> tuple[OutboundEdgeStream, list[ChunkQueue]]:
    queues = [ChunkQueue(1 << 20, f"q{i}") for i in range(targets)]
    return (OutboundEdgeStream(0, queues, RoutingPolicy.PARTITIONED, lambda v: v[1]["k"],
                               processor_partition_table(targets, 1)), queues)


@pytest.mark.parametrize("targets", [2, 3, 16])  # one pass per owner, and a loop over items
def test_every_item_reaches_its_keys_owner_in_the_chunks_order(targets):
    out, queues = edge(targets)
    table = processor_partition_table(targets, 1)
    chunk = [(t, {"k": key}) for t, key in enumerate([*range(300), "a", "b", "a", -5, 2**70])]
    assert out.send(chunk)
    got = {i: [item for entry in q._dq for item in entry] for i, q in enumerate(queues)}
    expected = {i: [v for v in chunk if table[partition_of(v[1]["k"])] == i]
                for i in range(targets)}
    assert got == expected
    assert sum(map(len, got.values())) == len(chunk)


def test_a_chunk_whose_items_share_one_owner_goes_to_it_whole():
    out, queues = edge(2)
    chunk = [(t, {"k": "same"}) for t in range(50)]
    assert out.send(chunk)
    (full,) = [q for q in queues if q]
    assert full.popleft() is chunk
    assert not any(queues)


def test_the_part_a_full_queue_refuses_stays_pending_and_goes_when_retried():
    out, queues = edge(2)
    queues[0].capacity = 0
    chunk = [(t, {"k": t}) for t in range(100)]
    assert not out.send(chunk)
    assert out.has_pending
    queues[0].capacity = 10
    assert out.flush_pending()
    got = sorted(item for q in queues for entry in q._dq for item in entry)
    assert got == chunk
