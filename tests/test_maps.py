"""Named maps with an event journal, in memory and in RocksDB."""

from __future__ import annotations

import threading
import time

import pytest

from jetwake.engine.core.partitioning import partition_of
from jetwake.engine.data.named_maps import REMOVE, JournalEvent, KeyValueMap, MapStore


@pytest.fixture(params=["memory", "rocksdb"])
def store(request, tmp_path) -> MapStore:
    s = MapStore(None if request.param == "memory" else str(tmp_path), journal_capacity=100)
    yield s
    s.close()


@pytest.fixture
def m(store) -> KeyValueMap:
    return store.get_map("m")


def test_put_returns_the_previous_value(m):
    assert m.put("a", 1) is None
    assert m.put("a", 2) == 1
    assert m["a"] == 2


def test_getitem_of_missing_key_raises_key_error(m):
    with pytest.raises(KeyError):
        m["missing"]
    assert m.get("missing") is None
    assert m.get("missing", 5) == 5


def test_put_if_absent_stores_only_when_absent(m):
    assert m.put_if_absent("a", 1) is None
    assert m.put_if_absent("a", 2) == 1
    assert m["a"] == 1
    assert m.journal_next_seq() == 1


def test_remove_returns_the_old_value_and_none_when_absent(m):
    m.put("a", 1)
    assert m.remove("a") == 1
    assert m.remove("a") is None
    assert "a" not in m
    assert m.journal_next_seq() == 2


def test_del_of_missing_key_raises_key_error(m):
    with pytest.raises(KeyError):
        del m["missing"]


def test_none_is_not_a_value(m):
    with pytest.raises(ValueError):
        m.put("a", None)
    with pytest.raises(ValueError):
        m.put_all([("b", 1), ("c", None)])
    assert len(m) == 0


def test_merge_stores_value_when_absent_and_merged_value_when_present(m):
    assert m.merge("a", 3, lambda old, new: old + new) == 3
    assert m.merge("a", 4, lambda old, new: old + new) == 7
    assert m["a"] == 7


def test_merge_returning_none_removes_the_key(m):
    m.put("a", 1)
    assert m.merge("a", 0, lambda old, new: None) is None
    assert "a" not in m
    assert m.journal_read(1, 10).events[0].kind == REMOVE


def test_merge_returning_none_for_absent_key_changes_nothing(m):
    assert m.merge("a", 5, lambda old, new: None) == 5
    assert m.merge("b", 5, lambda old, new: None) == 5
    assert m.merge("b", 5, lambda old, new: None) is None
    assert m.journal_next_seq() == 3


def test_mapping_protocol(m):
    m["a"] = 1
    m.update({"b": 2}, c=3)
    assert len(m) == m.size() == 3
    assert dict(m) == {"a": 1, "b": 2, "c": 3}
    assert sorted(m.keys()) == ["a", "b", "c"]
    assert sorted(m.values()) == [1, 2, 3]
    assert sorted(m.items()) == [("a", 1), ("b", 2), ("c", 3)]
    assert "b" in m.keys() and ("c", 3) in m.items()
    assert m.pop("a") == 1 and m.pop("a", "gone") == "gone"
    assert m.setdefault("d", 4) == 4 and m.setdefault("d", 5) == 4
    assert m == {"b": 2, "c": 3, "d": 4}


def test_returned_values_are_copies(m):
    m.put("a", {"list": [1]})
    m["a"]["list"].append(2)
    assert m["a"] == {"list": [1]}


def test_tuple_and_list_keys_stay_distinct(m):
    m.put((1, 2), "tuple")
    m.put([1, 2], "list")
    assert m[(1, 2)] == "tuple" and m[[1, 2]] == "list"
    assert {type(k) for k in m} == {tuple, list}


def test_clear_removes_all_and_journals_one_remove_per_entry(m):
    m.put_all({"a": 1, "b": 2})
    m.clear()
    assert len(m) == 0
    events = m.journal_read(2, 10).events
    assert sorted((e.key, e.old_value, e.new_value, e.kind) for e in events) == [
        ("a", 1, None, "remove"), ("b", 2, None, "remove")]


def test_journal_records_every_change_with_consecutive_sequences(m):
    m.put("a", 1)
    m.put("a", 2)
    m.remove("a")
    m.put_all([("b", 1), ("b", 2)])
    batch = m.journal_read(0, 100)
    assert batch.events == [
        JournalEvent(0, "a", None, 1, "put"),
        JournalEvent(1, "a", 1, 2, "put"),
        JournalEvent(2, "a", 2, None, "remove"),
        JournalEvent(3, "b", None, 1, "put"),
        JournalEvent(4, "b", 1, 2, "put"),
    ]
    assert batch.next_seq == 5 and batch.lost == 0
    assert m["b"] == 2 and len(m) == 1


def test_journal_read_returns_at_most_max_count_and_continues_from_next_seq(m):
    m.put_all((i, i) for i in range(10))
    first = m.journal_read(0, 4)
    second = m.journal_read(first.next_seq, 100)
    assert [e.sequence for e in first.events] == [0, 1, 2, 3]
    assert [e.sequence for e in second.events] == list(range(4, 10))
    assert second.next_seq == 10
    assert m.journal_read(10, 5).events == []


def test_journal_overrun_reports_lost_events(m):
    for i in range(250):
        m.put("k", i)
    assert m.journal_oldest_seq() == 150
    assert m.journal_next_seq() == 250
    batch = m.journal_read(120, 10)
    assert batch.lost == 30
    assert [e.sequence for e in batch.events] == list(range(150, 160))
    assert batch.events[0].new_value == 150
    assert batch.next_seq == 160


def test_put_all_larger_than_the_capacity_keeps_the_newest_events(m):
    m.put_all((i, i) for i in range(130))
    assert m.journal_oldest_seq() == 30
    batch = m.journal_read(0, 1000)
    assert batch.lost == 30 and [e.key for e in batch.events] == list(range(30, 130))
    assert len(m) == 130


def test_journal_read_past_the_next_sequence_is_an_error(m):
    m.put("a", 1)
    with pytest.raises(ValueError):
        m.journal_read(5, 10)


def test_entries_of_partitions_returns_exactly_their_entries(m):
    m.put_all((f"k{i}", i) for i in range(500))
    wanted = {3, 100, 200}
    got = dict(m.entries(wanted))
    assert got == {f"k{i}": i for i in range(500) if partition_of(f"k{i}") in wanted}


def test_wait_for_events_wakes_up_on_a_put(m):
    def writer():
        time.sleep(0.05)
        m.put("a", 1)

    t = threading.Thread(target=writer)
    t.start()
    started = time.monotonic()
    assert m.wait_for_events(0, 5.0) is True
    assert time.monotonic() - started < 2.0
    t.join()
    assert m.wait_for_events(1, 0.01) is False


def test_concurrent_writers_lose_no_update(m):
    def add(n):
        for _ in range(200):
            m.merge("counter", 1, lambda old, new: old + new)
            m.put(("w", n), n)

    threads = [threading.Thread(target=add, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert m["counter"] == 800
    assert len(m) == 5
    assert m.journal_next_seq() == 1600


@pytest.mark.parametrize("name", ["", "a/b", "..", ".", "a\\b", "x\0y", 5, None])
def test_invalid_map_names_are_rejected(store, name):
    with pytest.raises(ValueError, match="map name"):
        store.get_map(name)


def test_get_map_returns_the_same_map_and_lists_names(store):
    assert store.get_map("a") is store.get_map("a")
    store.get_map("b")
    assert store.map_names() == ["a", "b"]


def test_maps_are_independent(store):
    store.get_map("a").put("k", 1)
    assert "k" not in store.get_map("b")
    assert store.get_map("b").journal_next_seq() == 0


def test_reopen_keeps_contents_and_journal_and_continues_sequences(tmp_path):
    with MapStore(str(tmp_path), journal_capacity=10) as s:
        m = s.get_map("orders")
        for i in range(15):
            m.put(i % 4, i)
        m.remove(0)
    with MapStore(str(tmp_path), journal_capacity=10) as s:
        assert s.map_names() == ["orders"]
        m = s.get_map("orders")
        assert dict(m) == {1: 13, 2: 14, 3: 11}
        assert len(m) == 3
        assert (m.journal_oldest_seq(), m.journal_next_seq()) == (6, 16)
        assert m.journal_read(15, 1).events == [JournalEvent(15, 0, 12, None, "remove")]
        m.put("new", 1)
        assert m.journal_read(16, 5).events == [JournalEvent(16, "new", None, 1, "put")]
        assert m.journal_read(0, 100).lost == 7


def test_reopen_with_a_smaller_capacity_trims_the_journal(tmp_path):
    with MapStore(str(tmp_path), journal_capacity=10) as s:
        s.get_map("m").put_all((i, i) for i in range(10))
    with MapStore(str(tmp_path), journal_capacity=3) as s:
        m = s.get_map("m")
        assert m.journal_oldest_seq() == 7
        assert [e.sequence for e in m.journal_read(7, 10).events] == [7, 8, 9]


def test_map_is_stored_under_data_dir_maps_name(tmp_path):
    with MapStore(str(tmp_path)) as s:
        s.get_map("orders").put("a", 1)
    assert (tmp_path / "maps" / "orders").is_dir()


def test_closed_map_rejects_writes(store):
    m = store.get_map("m")
    store.close()
    with pytest.raises(RuntimeError):
        m.put("a", 1)
    with pytest.raises(RuntimeError):
        store.get_map("m")
