"""The bytes ``dumps`` gives are fixed: partitions (crc32 of the serialized key), state keys and
snapshots depend on them. The packers ``dumps`` keeps per thread (instead of a new Packer per
call) must give exactly what a fresh ``msgpack.packb`` with the same extension types gives,
from any thread, after an error, and after a value too large to keep its packer."""

from __future__ import annotations

import datetime as dt
import threading

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetwake.engine.core import serialization
from jetwake.engine.core.serialization import SerializationError, dumps, dumps_chunk, loads


def reference_dumps(obj):
    """The encoding written plainly: a new Packer per value and per nested tuple or set."""
    def default(o):
        if isinstance(o, tuple):
            return msgpack.ExtType(1, reference_dumps(list(o)))
        if isinstance(o, frozenset):
            return msgpack.ExtType(3, reference_dumps(serialization.sorted_if_possible(o)))
        if isinstance(o, set):
            return msgpack.ExtType(2, reference_dumps(serialization.sorted_if_possible(o)))
        raise TypeError(type(o))
    return msgpack.packb(obj, default=default, strict_types=True, use_bin_type=True)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                    st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20))
values = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.tuples(inner)
                   | st.tuples() | st.dictionaries(st.text(max_size=5), inner, max_size=3)
                   | st.frozensets(st.integers(-(2**63), 2**63 - 1), max_size=3)),
    max_leaves=12)


@settings(max_examples=300)
@given(values)
def test_dumps_gives_the_bytes_of_a_fresh_packb_with_the_same_extension_types(value):
    assert dumps(value) == reference_dumps(value)


@pytest.mark.parametrize("value, expected", [
    ((1, "a"), b"\xd6\x01\x92\x01\xa1a"),
    (("k", (2, b"x")), b"\xc7\x0b\x01\x92\xa1k\xc7\x05\x01\x92\x02\xc4\x01x"),
    ([(), {"a": (1.5, None)}],
     b"\x92\xd4\x01\x90\x81\xa1a\xc7\x0b\x01\x92\xcb?\xf8\x00\x00\x00\x00\x00\x00\xc0"),
    (frozenset({3, 1}), b"\xc7\x03\x03\x92\x01\x03"),
    (dt.datetime(2026, 1, 2, 3, 4, 5), b"\xc7\x13\x042026-01-02T03:04:05"),
    (2**70, b"\xc7\x16\x061180591620717411303424"),
    ((True, {1, 2}), b"\xd7\x01\x92\xc3\xc7\x03\x02\x92\x01\x02"),
])
def test_dumps_gives_the_same_bytes_as_before_for_every_extension_type(value, expected):
    assert dumps(value) == expected
    assert loads(expected) == value


def test_threads_serializing_at_once_each_get_their_own_values_bytes():
    per_thread = {t: [(t, i, f"v{i}", ((t, i),)) for i in range(3000)] for t in range(8)}
    got: dict[int, list[bytes]] = {}

    def work(t):
        got[t] = [dumps(v) for v in per_thread[t]]

    threads = [threading.Thread(target=work, args=(t,)) for t in per_thread]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    for t, vals in per_thread.items():
        assert got[t] == [reference_dumps(v) for v in vals]


def test_a_value_that_fails_inside_a_nested_tuple_leaves_the_next_values_bytes_right():
    with pytest.raises(SerializationError, match="object"):
        dumps([("a", (1, object()))])
    value = [("a", (1, 2)), "b"]
    assert dumps(value) == reference_dumps(value)


def test_values_larger_than_a_kept_packer_round_trip_and_the_next_small_one_is_right():
    big = [(i, "x" * 100) for i in range(20_000)]  # about 2.4 MB
    data = dumps(big)
    assert len(data) > serialization.POOLED_RESULT_MAX
    assert loads(data) == big
    assert dumps(("k", 1)) == reference_dumps(("k", 1))


@settings(max_examples=150)
@given(st.lists(st.tuples(values, values), max_size=20) | st.lists(values, max_size=8)
       | st.lists(st.tuples(values) | st.tuples(values, values, values), max_size=8))
def test_a_chunk_comes_back_from_dumps_chunk_as_it_was_with_every_type_kept(chunk):
    got = loads(dumps_chunk(chunk))
    assert got == chunk
    # == does not tell a tuple from a list: the bytes of dumps do
    assert dumps(got) == dumps(chunk)
    assert dumps_chunk(chunk) == dumps_chunk(got)


def test_a_chunk_of_pairs_is_packed_flat_and_any_other_chunk_as_dumps_packs_it():
    pairs = [(1700000000000 + i, {"bidder": i, "url": "https://x/" + str(i)}) for i in range(100)]
    flat = dumps_chunk(pairs)
    assert flat[0] == 0xC9 and flat[5] == 12  # ext 32 of the tuple rows type
    assert len(flat) < len(dumps(pairs))  # no extension header per pair
    for other in ([1, 2], [(1, 2), (3,)], [(1, 2), [3, 4]], [], [()]):
        assert dumps_chunk(other) == dumps(other)


def test_tuple_rows_whose_fields_do_not_fill_the_last_row_fail_to_decode():
    payload = dumps([3, [1, 2, 3, 4]])  # four fields in rows of three
    data = bytes((0xC9,)) + len(payload).to_bytes(4, "big") + bytes((12,)) + payload
    with pytest.raises(SerializationError, match="malformed tuple rows"):
        loads(data)
