"""Keys to partitions, and partitions to processors (docs/architecture.md, "Partitions").

A key belongs to one of ``PARTITION_COUNT`` partitions by a CRC-32 of its serialized bytes,
so the mapping is the same in every process and on every host (Python's ``hash()`` is salted
per process and would scatter a key's state). Partitions are spread over members, and each
member spreads its partitions over the local processors of a vertex: the result is one table
per vertex from partition id to global processor index.
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence

from jetwake.engine.core.serialization import dumps

__all__ = [
    "PARTITION_COUNT", "partition_of", "partitions_of", "member_partitions",
    "processor_partition_table", "partitions_of_processor", "owner_of_partition",
    "all_to_one_target",
]

PARTITION_COUNT = 271


def partition_of(key: Any) -> int:
    """The partition of ``key``: stable across processes, hosts and Python versions."""
    if type(key) is str:
        # the common case without msgpack: CRC-32 continued from the msgpack str header's
        # CRC gives exactly crc32(dumps(key))
        data = key.encode()
        n = len(data)
        if n < 256:
            return zlib.crc32(data, _STR_HEADER_CRC[n]) % PARTITION_COUNT
    return zlib.crc32(dumps(_canonical(key))) % PARTITION_COUNT


_MEMO_MAX = 1 << 15
_memo: dict[int, int] = {}
"""Partitions of recent int keys (an int's partition goes through msgpack, about 260 ns). Only
exact ints: two equal ints always have the same partition, while 1 == Decimal(1) holds but
their partitions differ, so a dict lookup may stand in for the CRC of an int only. Cleared
when full: at most 32,768 ints (about 2.5 MB). A str key has its own fast path already."""


def partitions_of(keys: list[Any]) -> list[int]:
    """``[partition_of(k) for k in keys]``, for a chunk's keys: int keys seen before cost a
    dict lookup in one C-level pass instead of a Python call each."""
    if set(map(type, keys)) != _INT_ONLY:
        return list(map(partition_of, keys))
    memo = _memo
    try:
        return list(map(memo.__getitem__, keys))
    except KeyError:
        pass
    if len(memo) > _MEMO_MAX:
        memo.clear()
    get = memo.get
    out = []
    for k in keys:
        p = get(k)
        if p is None:
            p = memo[k] = partition_of(k)
        out.append(p)
    return out


_INT_ONLY = {int}


def _canonical(key: Any) -> Any:
    """Keys equal in Python (1, 1.0, True) must share a partition, as they share a dict slot."""
    t = type(key)
    if t is bool:
        return int(key)
    if t is float and key.is_integer():
        return int(key)
    if t is tuple:
        return tuple(_canonical(k) for k in key)
    return key


_STR_HEADER_CRC = tuple(
    zlib.crc32(bytes((0xA0 | n,)) if n < 32 else bytes((0xD9, n))) for n in range(256))


def member_partitions(member_index: int, member_count: int) -> list[int]:
    """Partitions owned by a member: a round-robin split of all partitions."""
    if not 0 <= member_index < member_count:
        raise ValueError(f"member_index {member_index} outside [0, {member_count})")
    return list(range(member_index, PARTITION_COUNT, member_count))


def partitions_of_processor(member_index: int, member_count: int, local_index: int,
                            local_parallelism: int) -> list[int]:
    """Partitions a processor owns: its member's partitions, split among local processors."""
    owned = member_partitions(member_index, member_count)
    return owned[local_index::local_parallelism]


def processor_partition_table(member_count: int, local_parallelism: int) -> Sequence[int]:
    """Partition id -> global processor index, for a vertex of that shape.

    The global index of local processor ``i`` on member ``m`` is ``m * local_parallelism + i``.
    """
    table = [0] * PARTITION_COUNT
    for m in range(member_count):
        for i in range(local_parallelism):
            for p in partitions_of_processor(m, member_count, i, local_parallelism):
                table[p] = m * local_parallelism + i
    return tuple(table)


def owner_of_partition(topic_index: int, partition: int, topic_count: int,
                       total_parallelism: int) -> int:
    """The global processor index that reads ``partition`` of the ``topic_index``-th input of a
    partitioned source (a Kafka topic, a test source's partitions): Jet's ``StreamKafkaP``
    formula, where the inputs start at spread-out processors. Every member computes the same
    owner without talking to the others."""
    start = topic_index * max(1, total_parallelism // topic_count)
    return (start + partition) % total_parallelism


def all_to_one_target(vertex_name: str, member_count: int, local_parallelism: int) -> int:
    """The global index of the one processor of ``vertex_name`` that a distributed all-to-one
    edge feeds from the whole cluster: the owner of the vertex name's partition. A keyless
    aggregation's result comes from it alone."""
    return processor_partition_table(member_count, local_parallelism)[partition_of(vertex_name)]
