"""Keyed state backends: the in-memory and RocksDB backends behave alike, RocksDB state may
exceed its cache, and flush makes changes durable."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jetwake.engine.core.partitioning import PARTITION_COUNT, partition_of
from jetwake.engine.core.serialization import SerializationError, dumps, loads
from jetwake.snapshot.state.keyed_state import (
    ENTRY_OVERHEAD_BYTES, InMemoryStateBackend, KeyedStateBackend, storage_key,
)
from jetwake.snapshot.state.rocksdb_backend import RocksDBStateBackend

TINY_CACHE = 4 * 1024


@pytest.fixture(params=["memory", "rocksdb"])
def backend(request, tmp_path) -> KeyedStateBackend:
    if request.param == "memory":
        b: KeyedStateBackend = InMemoryStateBackend()
    else:
        b = RocksDBStateBackend(tmp_path / "state", cache_bytes=TINY_CACHE)
    yield b
    b.destroy()


def _fill(b: KeyedStateBackend, n: int) -> dict:
    model = {}
    for i in range(n):
        key = ("user", i) if i % 2 else f"k{i}"
        b.put(key, {"count": i, "tags": [i, str(i)]})
        model[key] = {"count": i, "tags": [i, str(i)]}
    return model


def test_get_of_missing_key_returns_default(backend):
    assert backend.get("nope") is None
    assert backend.get("nope", 7) == 7
    assert "nope" not in backend


def test_put_then_get_returns_the_value(backend):
    backend.put(("a", 1), {"x": [1, 2], "when": (3, 4)})
    assert backend.get(("a", 1)) == {"x": [1, 2], "when": (3, 4)}
    assert ("a", 1) in backend


def test_put_overwrites_and_len_counts_distinct_keys(backend):
    backend.put("a", 1)
    backend.put("a", 2)
    backend.put("b", 3)
    assert backend.get("a") == 2
    assert len(backend) == 2


def test_keys_with_different_serialized_bytes_are_different_keys(backend):
    backend.put(1, "int")
    backend.put(1.0, "float")
    backend.put((1,), "tuple")
    backend.put([1], "list")
    assert [backend.get(k) for k in (1, 1.0, (1,), [1])] == ["int", "float", "tuple", "list"]
    assert len(backend) == 4


def test_delete_removes_the_key_and_ignores_missing_keys(backend):
    backend.put("a", 1)
    backend.delete("a")
    backend.delete("never-there")
    assert backend.get("a") is None
    assert "a" not in backend
    assert len(backend) == 0


def test_len_is_exact_through_puts_and_deletes_beyond_the_cache(backend):
    _fill(backend, 2_000)
    for i in range(0, 2_000, 4):
        backend.delete(f"k{i}")
        backend.delete(f"k{i}")
    assert len(backend) == 1_500


def test_items_of_partitions_returns_exactly_their_entries(backend):
    model = _fill(backend, 3_000)
    wanted = [0, 5, 77, 270]
    expected = {k: v for k, v in model.items() if partition_of(k) in wanted}
    got = list(backend.items(wanted))
    assert len(got) == len(expected)
    assert dict(got) == expected
    assert {partition_of(k) for k, _ in got} <= set(wanted)


def test_items_without_partitions_returns_every_entry(backend):
    model = _fill(backend, 1_000)
    backend.delete("k0")
    del model["k0"]
    assert dict(backend.items()) == model
    assert sorted(map(repr, backend.keys())) == sorted(map(repr, model))


def test_items_are_ordered_by_partition_then_serialized_key(backend):
    model = _fill(backend, 1_000)
    expected = sorted(model, key=storage_key)
    assert list(backend.keys()) == expected


def test_items_rejects_a_partition_out_of_range(backend):
    with pytest.raises(ValueError):
        list(backend.items([PARTITION_COUNT]))


def test_clear_removes_every_entry(backend):
    _fill(backend, 500)
    backend.clear()
    assert len(backend) == 0
    assert list(backend.items()) == []
    assert backend.get("k2") is None


def test_unserializable_value_is_rejected(backend):
    with pytest.raises(SerializationError):
        backend.put("a", object())
    assert "a" not in backend


def test_state_far_larger_than_a_tiny_cache_is_exact_after_flush_close_reopen(tmp_path):
    path = tmp_path / "big"
    b = RocksDBStateBackend(path, cache_bytes=TINY_CACHE)
    for i in range(50_000):
        b.put(i, [i, i * 2])
    for i in range(0, 50_000, 7):
        b.delete(i)
    b.flush()
    b.close()
    b = RocksDBStateBackend(path, cache_bytes=TINY_CACHE)
    try:
        assert len(b) == 50_000 - len(range(0, 50_000, 7))
        assert all(b.get(i) == (None if i % 7 == 0 else [i, i * 2]) for i in range(50_000))
    finally:
        b.close()


def test_cache_stays_within_its_byte_budget(tmp_path):
    b = RocksDBStateBackend(tmp_path / "s", cache_bytes=TINY_CACHE)
    try:
        for i in range(5_000):
            b.put(i, "v" * 50)
            assert b.cached_bytes <= TINY_CACHE
        assert b.cached_bytes > TINY_CACHE // 2
    finally:
        b.destroy()


def test_a_value_larger_than_the_cache_is_still_stored(tmp_path):
    b = RocksDBStateBackend(tmp_path / "s", cache_bytes=1_000)
    try:
        b.put("big", "x" * 10_000)
        assert b.cached_bytes == 0
        assert b.get("big") == "x" * 10_000
    finally:
        b.destroy()


def test_close_writes_unflushed_changes(tmp_path):
    path = tmp_path / "s"
    b = RocksDBStateBackend(path)
    b.put("a", 1)
    b.put("b", 2)
    b.delete("b")
    b.close()
    b = RocksDBStateBackend(path)
    try:
        assert dict(b.items()) == {"a": 1}
        assert len(b) == 1
    finally:
        b.close()


def test_destroy_deletes_the_directory(tmp_path):
    path = tmp_path / "s"
    b = RocksDBStateBackend(path)
    b.put("a", 1)
    b.destroy()
    assert not path.exists()


def _run_and_die(path: str, cache_bytes: int, body: str) -> None:
    """Run ``body`` with a RocksDBStateBackend ``b`` in a child that exits without closing."""
    script = textwrap.dedent("""
        import os, sys
        from jetwake.snapshot.state.rocksdb_backend import RocksDBStateBackend
        b = RocksDBStateBackend(sys.argv[1], cache_bytes=int(sys.argv[2]))
    """) + textwrap.dedent(body) + "\nos._exit(0)\n"
    subprocess.run([sys.executable, "-c", script, path, str(cache_bytes)], check=True,
                   timeout=60)


def test_a_crash_after_flush_keeps_exactly_the_flushed_state_when_nothing_was_evicted(
        tmp_path):
    path = str(tmp_path / "s")
    _run_and_die(path, 2**20, """
        for i in range(1000):
            b.put(i, i)
        b.delete(5)
        b.flush()
        for i in range(1000):
            b.put(i, -i)
        b.put("later", 1)
    """)
    b = RocksDBStateBackend(path)
    try:
        assert dict(b.items()) == {i: i for i in range(1000) if i != 5}
        assert len(b) == 999
    finally:
        b.close()


def test_a_crash_after_flush_keeps_flushed_state_plus_possibly_evicted_later_changes(tmp_path):
    path = str(tmp_path / "s")
    _run_and_die(path, 2_000, """
        for i in range(1000):
            b.put(i, i)
        b.flush()
        for i in range(1000):
            b.put(i, -i)
    """)
    b = RocksDBStateBackend(path)
    try:
        values = dict(b.items())
        assert set(values) == set(range(1000))
        assert all(values[i] in (i, -i) for i in range(1000))
        assert any(values[i] == -i for i in range(1, 1000))
        assert len(b) == 1000
    finally:
        b.close()


def test_a_crash_after_a_checkpoint_keeps_every_change_made_before_it(tmp_path):
    """The checkpoint writes the cache without the write-ahead log; RocksDB then writes its
    memtable out to SST files, which is what makes those changes durable."""
    path = str(tmp_path / "s")
    _run_and_die(path, 2**20, """
        for i in range(1000):
            b.put(i, i)
        b.delete(5)
        b.checkpoint()
    """)
    b = RocksDBStateBackend(path)
    try:
        assert dict(b.items()) == {i: i for i in range(1000) if i != 5}
        assert len(b) == 999
    finally:
        b.close()


def test_entry_overhead_is_part_of_the_size_estimate(tmp_path):
    b = RocksDBStateBackend(tmp_path / "s")
    try:
        b.put("k", "v")
        assert b.cached_bytes == len(storage_key("k")) + len(dumps("v")) + ENTRY_OVERHEAD_BYTES
    finally:
        b.destroy()


_keys = st.one_of(st.integers(0, 40), st.sampled_from(["a", "b", "c", ("t", 1)]))
_values = st.one_of(st.integers(), st.text(max_size=30), st.lists(st.integers(), max_size=5))
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _keys, _values),
        st.tuples(st.just("delete"), _keys),
        st.tuples(st.just("flush")),
        st.tuples(st.just("reopen")),
    ),
    max_size=120,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops, cache_bytes=st.sampled_from([0, 300, 600, 2_000]))
def test_random_puts_deletes_and_flushes_match_a_dict_model(ops, cache_bytes):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s")
        b = RocksDBStateBackend(path, cache_bytes=cache_bytes)
        model: dict = {}
        try:
            for op in ops:
                if op[0] == "put":
                    b.put(op[1], op[2])
                    model[dumps(op[1])] = op[2]
                elif op[0] == "delete":
                    b.delete(op[1])
                    model.pop(dumps(op[1]), None)
                elif op[0] == "flush":
                    b.flush()
                else:
                    b.close()
                    b = RocksDBStateBackend(path, cache_bytes=cache_bytes)
                assert len(b) == len(model)
            assert {dumps(k): v for k, v in b.items()} == model
            for kb, v in model.items():
                assert b.get(loads(kb)) == v
            b.flush()
            b.close()
            b = RocksDBStateBackend(path, cache_bytes=cache_bytes)
            assert {dumps(k): v for k, v in b.items()} == model
            assert len(b) == len(model)
        finally:
            b.destroy()
