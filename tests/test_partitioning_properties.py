"""Property tests: stable key partitioning, partition tables, msgpack round trips, and the
two-stage aggregation against a Python reference."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import zlib
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jetwake import AggregateOperations as Ops, Member, Pipeline, Sinks, Sources
from jetwake.engine.core import serialization
from jetwake.engine.core.partitioning import (
    PARTITION_COUNT, member_partitions, partition_of, partitions_of, partitions_of_processor,
    processor_partition_table,
)

TIMEOUT = 20

# keys whose Python equality coincides with msgpack identity (no 1 == 1.0 == True mixing)
scalar_keys = st.one_of(
    st.text(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.binary(max_size=50),
    st.none(),
)
keys = st.recursive(scalar_keys, lambda inner: st.tuples(inner, inner) | st.tuples(inner),
                    max_leaves=6)


def reference_partition(key) -> int:
    return zlib.crc32(serialization.dumps(key)) % PARTITION_COUNT


# --- partition_of ----------------------------------------------------------------------------

def test_partition_count_is_271():
    assert PARTITION_COUNT == 271


@given(keys)
def test_partition_of_is_in_range(key):
    assert 0 <= partition_of(key) < PARTITION_COUNT


@given(keys)
def test_equal_keys_give_equal_partitions(key):
    copy = serialization.loads(serialization.dumps(key))
    assert copy == key
    assert partition_of(copy) == partition_of(key)


@given(st.text())
def test_str_fast_path_equals_crc32_of_the_serialized_key(key):
    assert partition_of(key) == reference_partition(key)


@pytest.mark.parametrize("length", [0, 1, 31, 32, 33, 127, 255, 256, 257, 1000, 65535, 65536])
def test_str_fast_path_at_every_msgpack_header_boundary(length):
    for char in ("a", "é", "€"):
        key = (char * length).encode()[:length].decode(errors="ignore")
        assert partition_of(key) == reference_partition(key), (char, length)


@given(st.text(alphabet=st.characters(codec="utf-8"), min_size=28, max_size=300))
def test_str_fast_path_for_multibyte_strings_around_the_boundaries(key):
    assert partition_of(key) == reference_partition(key)


@given(st.integers() | st.tuples(st.integers(), st.text()) | st.tuples(keys, keys))
def test_partition_of_ints_and_tuples_is_crc32_of_the_serialized_key(key):
    assert partition_of(key) == reference_partition(key)


def test_a_tuple_and_a_list_with_the_same_elements_may_differ_but_are_each_stable():
    assert partition_of((1, "a")) == partition_of((1, "a"))
    assert serialization.dumps((1, "a")) != serialization.dumps([1, "a"])


def test_numerically_equal_keys_of_different_types_share_a_partition():
    assert partition_of(1) == partition_of(1.0) == partition_of(True)


def test_partition_of_is_the_same_in_processes_with_different_hash_seeds():
    sample = ["", "a", "word", "x" * 40, "ünïcödé", 0, 1, -1, 2**70, (1, "a"), ("k", (2, 3))]
    here = [partition_of(k) for k in sample]
    code = (
        "import json, sys\n"
        "from jetwake.engine.core.partitioning import partition_of\n"
        "sample = ['', 'a', 'word', 'x' * 40, 'ünïcödé', 0, 1, -1, 2**70, (1, 'a'),"
        " ('k', (2, 3))]\n"
        "print(json.dumps([partition_of(k) for k in sample]))\n")
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60, check=True).stdout
        assert json.loads(out) == here, f"PYTHONHASHSEED={seed}"


# --- partition tables ------------------------------------------------------------------------


@settings(max_examples=200)
@given(st.lists(keys, max_size=30) | st.lists(st.integers(), max_size=30)
       | st.lists(st.integers(0, 50) | st.text(max_size=3), max_size=30))
def test_partitions_of_a_chunks_keys_are_each_keys_partition_seen_or_not(chunk_keys):
    # twice: the second call finds the int keys in the memo
    assert partitions_of(chunk_keys) == [partition_of(k) for k in chunk_keys]
    assert partitions_of(chunk_keys) == [partition_of(k) for k in chunk_keys]


def test_partitions_of_keys_equal_to_memoized_ints_but_of_another_type_are_their_own():
    partitions_of([1, 2, 3])  # memoized as ints
    mixed = [True, 1.0, 2.0, dt.date(2020, 1, 1), (1,), 1]
    assert partitions_of(mixed) == [partition_of(k) for k in mixed]


@given(st.integers(min_value=1, max_value=8), st.integers(min_value=1, max_value=300))
def test_partition_table_assigns_every_partition_to_exactly_one_processor(members, lp):
    table = processor_partition_table(members, lp)
    assert len(table) == PARTITION_COUNT
    total = members * lp
    assert all(0 <= owner < total for owner in table)
    owned = defaultdict(list)
    for m in range(members):
        for i in range(lp):
            for p in partitions_of_processor(m, members, i, lp):
                owned[p].append(m * lp + i)
    assert sorted(owned) == list(range(PARTITION_COUNT))
    assert all(len(o) == 1 for o in owned.values())
    assert all(table[p] == o[0] for p, o in owned.items())


@given(st.integers(min_value=1, max_value=271))
def test_every_processor_gets_partitions_when_parallelism_is_at_most_271(lp):
    table = processor_partition_table(1, lp)
    assert set(table) == set(range(lp))


@given(st.integers(min_value=1, max_value=10), st.integers(min_value=1, max_value=27))
def test_every_processor_of_every_member_gets_partitions(members, lp):
    table = processor_partition_table(members, lp)
    assert set(table) == set(range(members * lp))


@given(st.integers(min_value=1, max_value=20))
def test_members_split_the_partitions_without_overlap(members):
    parts = [member_partitions(m, members) for m in range(members)]
    assert sorted(p for ps in parts for p in ps) == list(range(PARTITION_COUNT))
    sizes = [len(ps) for ps in parts]
    assert max(sizes) - min(sizes) <= 1


def test_member_partitions_rejects_an_index_outside_the_cluster():
    with pytest.raises(ValueError, match="member_index"):
        member_partitions(3, 3)


# --- serialization ---------------------------------------------------------------------------

hashable_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**100), max_value=2**100),
    st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20),
    st.datetimes(), st.dates(), st.timedeltas(),
    st.datetimes(timezones=st.just(dt.timezone(dt.timedelta(hours=5, minutes=30)))),
)
hashables = st.recursive(hashable_leaves,
                         lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=4),
                         max_leaves=8)
values = st.recursive(
    hashable_leaves,
    lambda inner: (st.lists(inner, max_size=5) | st.tuples(inner, inner)
                   | st.sets(hashables, max_size=5)
                   | st.dictionaries(hashables, inner, max_size=5)),
    max_leaves=20)


def same(a, b) -> bool:
    """Equality that also compares the types of containers and scalars."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    return a == b


@given(values)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_serialization_round_trips_nested_values_keeping_their_types(value):
    assert same(serialization.loads(serialization.dumps(value)), value)


@given(values)
def test_serialization_gives_the_same_bytes_for_the_same_value(value):
    copy = serialization.loads(serialization.dumps(value))
    if not any(isinstance(x, (set, frozenset)) for x in _walk(value)):
        assert serialization.dumps(copy) == serialization.dumps(value)


def _walk(v):
    yield v
    if isinstance(v, (list, tuple, set, frozenset)):
        for x in v:
            yield from _walk(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from _walk(k)
            yield from _walk(x)


@given(st.integers(min_value=-(2**300), max_value=2**300))
def test_serialization_round_trips_big_ints(n):
    assert serialization.loads(serialization.dumps(n)) == n


def test_serialization_keeps_tuples_inside_dict_keys_and_sets():
    value = {(1, 2): {("a", (3,))}, "l": [(1,), [2]]}
    assert same(serialization.loads(serialization.dumps(value)), value)


def test_serialization_of_an_unknown_class_names_it_and_the_fix():
    class Unknown:
        pass

    with pytest.raises(serialization.SerializationError) as e:
        serialization.dumps({"x": Unknown()})
    assert "Unknown" in str(e.value) and "register_type" in str(e.value)


def test_registered_type_round_trips():
    class Point:
        def __init__(self, x, y):
            self.x, self.y = x, y

        def __eq__(self, other):
            return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    serialization.register_type(4242, Point, lambda p: [p.x, p.y], lambda v: Point(*v))
    value = [Point(1, 2), (Point(3, 4),)]
    assert serialization.loads(serialization.dumps(value)) == value


def test_decoding_garbage_raises_serialization_error():
    with pytest.raises(serialization.SerializationError):
        serialization.loads(b"\xc1\xc1\xc1")


# --- two-stage aggregation against a Python reference ---------------------------------------

pairs_strategy = st.lists(
    st.tuples(st.one_of(st.text(max_size=3), st.integers(-5, 5)), st.integers(-100, 100)),
    max_size=60)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(pairs=pairs_strategy, lp=st.integers(min_value=1, max_value=4))
def test_grouped_counting_and_summing_match_python(pairs, lp):
    expected: dict = defaultdict(lambda: [0, 0])
    for k, v in pairs:
        expected[k][0] += 1
        expected[k][1] += v
    with Member(local_parallelism=lp) as m:
        p = Pipeline()
        p.read_from(Sources.items(pairs)).rebalance() \
            .group_by(lambda e: e[0]) \
            .aggregate(Ops.all_of(Ops.counting(), Ops.summing(lambda e: e[1]))) \
            .write_to(Sinks.list("out"))
        m.new_job(p).join(timeout=TIMEOUT)
        result = list(m.get_list("out"))
    assert len(result) == len(expected)
    assert dict(result) == {k: tuple(v) for k, v in expected.items()}
