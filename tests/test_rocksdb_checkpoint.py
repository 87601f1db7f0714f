"""Snapshots of RocksDB state as RocksDB's own files: saving and checking file sets, checkpoints
of the state backend (incremental through hard links), and restores into new processors with
the same or another parallelism, with every key exactly once. All on real files."""

from __future__ import annotations

import hashlib
import os

import pytest

from jetwake import (
    AggregateOperations, BroadcastKey, JobConfig, Member, Pipeline, Processor,
    ProcessorMetaSupplier, Sinks, Source,
)
from jetwake.engine.core.partitioning import PARTITION_COUNT, partition_of, partitions_of_processor
from jetwake.engine.core.serialization import dumps, loads
from jetwake.snapshot.state.rocksdb_files import read_checkpoint_entries
from jetwake.snapshot.state.state_snapshots import restore_keyed_state
from jetwake.snapshot.store.snapshot_files import (
    SnapshotFiles, SnapshotFilesDamagedError, load_files, save_files,
)
from jetwake.snapshot.state.rocksdb_backend import RocksDBStateBackend

from support.waiting import wait_until

# --- SnapshotFiles, save_files, load_files ------------------------------------------------------


def _file_set(tmp_path) -> SnapshotFiles:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.sst").write_bytes(b"a" * 100)
    (src / "CURRENT").write_bytes(b"MANIFEST-1\n")
    (src / "sub" / "b.blob").write_bytes(b"b" * 7)
    return SnapshotFiles(src, ["a.sst", "CURRENT", "sub/b.blob"], {"format": "test", "n": 3})


def test_save_files_hard_links_every_file_and_lists_names_with_sizes(tmp_path):
    files = _file_set(tmp_path)
    dest = tmp_path / "snap" / "p0"
    manifest = save_files(files, dest)
    assert manifest == {"files": [["a.sst", 100], ["CURRENT", 11], ["sub/b.blob", 7]],
                        "meta": {"format": "test", "n": 3}}
    for name in files.files:
        assert os.path.samefile(files.path(name), os.path.join(dest, *name.split("/")))
    assert loads(dumps(manifest)) == manifest, "the manifest must be msgpack-serializable"


def test_save_files_copies_when_the_destination_is_on_another_file_system(tmp_path):
    if not os.path.isdir("/dev/shm") or \
            os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system other than the test's temporary directory")
    import tempfile
    files = _file_set(tmp_path)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        manifest = save_files(files, os.path.join(other, "p0"))
        copied = os.path.join(other, "p0", "a.sst")
        assert not os.path.samefile(files.path("a.sst"), copied)
        with open(copied, "rb") as f:
            assert f.read() == b"a" * 100
        assert manifest["files"][0] == ["a.sst", 100]


def test_save_files_again_into_the_same_directory_replaces_leftovers(tmp_path):
    files = _file_set(tmp_path)
    dest = tmp_path / "snap"
    dest.mkdir()
    (dest / "a.sst").write_bytes(b"left over from an attempt that failed")
    save_files(files, dest)
    assert os.path.samefile(files.path("a.sst"), dest / "a.sst")
    assert save_files(files, dest)["files"][0] == ["a.sst", 100]


def test_save_files_names_a_source_file_that_is_gone(tmp_path):
    files = _file_set(tmp_path)
    os.unlink(files.path("CURRENT"))
    with pytest.raises(FileNotFoundError, match="CURRENT"):
        save_files(files, tmp_path / "snap")


def test_load_files_gives_the_saved_set_in_its_new_directory(tmp_path):
    files = _file_set(tmp_path)
    dest = str(tmp_path / "snap")
    loaded = load_files(loads(dumps(save_files(files, dest))), dest)
    assert loaded == SnapshotFiles(dest, files.files, files.meta)


def test_load_files_names_a_missing_file(tmp_path):
    files = _file_set(tmp_path)
    dest = tmp_path / "snap"
    manifest = save_files(files, dest)
    os.unlink(dest / "sub" / "b.blob")
    with pytest.raises(SnapshotFilesDamagedError, match="sub/b.blob"):
        load_files(manifest, dest)


def test_load_files_names_a_file_whose_size_changed(tmp_path):
    files = _file_set(tmp_path)
    dest = tmp_path / "snap"
    manifest = save_files(files, dest)
    os.unlink(dest / "a.sst")
    (dest / "a.sst").write_bytes(b"short")
    with pytest.raises(SnapshotFilesDamagedError, match=r"a\.sst.*5 bytes.*100"):
        load_files(manifest, dest)


@pytest.mark.parametrize("manifest", [None, {}, {"files": [["a", "x"]]}, {"files": [["/etc/x", 1]]},
                                      {"files": [], "meta": [1]}])
def test_load_files_rejects_a_malformed_manifest(tmp_path, manifest):
    with pytest.raises(SnapshotFilesDamagedError):
        load_files(manifest, tmp_path)


def test_a_damaged_file_set_is_a_value_error():
    assert issubclass(SnapshotFilesDamagedError, ValueError)


@pytest.mark.parametrize("name", ["/abs", "../up", "a/../b", "", "a//b", "a\\b"])
def test_snapshot_files_refuses_names_outside_their_directory(tmp_path, name):
    with pytest.raises(ValueError, match="relative|non-empty"):
        SnapshotFiles(tmp_path, [name])


def test_snapshot_files_refuses_a_single_string_as_its_file_list(tmp_path):
    with pytest.raises(TypeError, match="collection"):
        SnapshotFiles(tmp_path, "CURRENT")


# --- checkpoints of the RocksDB backend ---------------------------------------------------------


def _backend(path, cache_bytes: int = 64 * 2**20) -> RocksDBStateBackend:
    return RocksDBStateBackend(path, cache_bytes)


@pytest.fixture
def backends(tmp_path):
    made: list[RocksDBStateBackend] = []

    def make(name: str, cache_bytes: int = 64 * 2**20) -> RocksDBStateBackend:
        b = _backend(tmp_path / "state" / name, cache_bytes)
        made.append(b)
        return b

    yield make
    for b in made:
        b.destroy()


def _digest(directory) -> dict[str, str]:
    """name -> sha256 of every file under ``directory``."""
    out = {}
    for root, _, files in os.walk(directory):
        for f in files:
            path = os.path.join(root, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, directory)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _saved(b: RocksDBStateBackend, dest) -> SnapshotFiles:
    """A checkpoint saved the way the snapshot store saves it, as the store hands it back."""
    manifest = save_files(b.checkpoint(), dest)
    return load_files(loads(dumps(manifest)), dest)


def test_a_restored_checkpoint_holds_every_entry_and_the_exact_count(backends, tmp_path):
    b = backends("a", cache_bytes=4096)  # most entries evicted to RocksDB, the rest cached
    model = {}
    for i in range(5000):
        b.put(("k", i), {"n": i})
        model[("k", i)] = {"n": i}
    for i in range(0, 5000, 7):
        b.delete(("k", i))
        del model[("k", i)]
    saved = _saved(b, tmp_path / "snap")
    r = backends("r")
    r.restore_checkpoints([saved], range(PARTITION_COUNT))
    assert len(r) == len(model)
    assert dict(r.items()) == model
    assert r.get(("k", 7)) is None and r.get(("k", 8)) == {"n": 8}


def test_a_checkpoint_includes_changes_still_in_the_write_back_cache(backends, tmp_path):
    b = backends("a")  # a big cache: nothing has reached RocksDB before the checkpoint
    for i in range(100):
        b.put(i, i)
    saved = _saved(b, tmp_path / "snap")
    r = backends("r")
    r.restore_checkpoints([saved], range(PARTITION_COUNT))
    assert dict(r.items()) == {i: i for i in range(100)}


def _sst_inodes(directory) -> dict[int, int]:
    out = {}
    for root, _, files in os.walk(directory):
        for f in files:
            if f.endswith(".sst"):
                st = os.stat(os.path.join(root, f))
                out[st.st_ino] = st.st_size
    return out


def test_a_second_checkpoint_shares_unchanged_sst_files_with_the_first(backends, tmp_path):
    b = backends("a", cache_bytes=2**20)
    for i in range(50_000):
        b.put(i, i)
    _saved(b, tmp_path / "snap1")
    for i in range(0, 50_000, 100):  # 1% of the keys change
        b.put(i, -i)
    second = _saved(b, tmp_path / "snap2")
    first_ssts = _sst_inodes(tmp_path / "snap1")
    second_ssts = _sst_inodes(tmp_path / "snap2")
    shared = {i for i in second_ssts if i in first_ssts}
    new_bytes = sum(s for i, s in second_ssts.items() if i not in shared)
    assert shared, "no SST file of the first snapshot is reused by the second"
    assert new_bytes < 0.1 * sum(second_ssts.values())
    r = backends("r")
    r.restore_checkpoints([second], range(PARTITION_COUNT))
    assert dict(r.items()) == {i: (-i if i % 100 == 0 else i) for i in range(50_000)}


def test_the_previous_checkpoint_directory_is_deleted_by_the_next_and_by_destroy(tmp_path):
    b = _backend(tmp_path / "s")
    b.put("k", 1)
    first = b.checkpoint()
    second = b.checkpoint()
    assert not os.path.exists(first.directory) and os.path.isdir(second.directory)
    b.destroy()
    assert not os.path.exists(second.directory)


def _owned(processor: int, parallelism: int) -> list[int]:
    return partitions_of_processor(0, 1, processor, parallelism)


def _filled(backends, name: str, keys, cache_bytes: int = 8192) -> RocksDBStateBackend:
    b = backends(name, cache_bytes)
    for k in keys:
        b.put(k, f"v{k}")
    return b


def test_restore_keeps_only_the_partitions_the_processor_owns(backends, tmp_path):
    b = _filled(backends, "a", range(3000))
    saved = _saved(b, tmp_path / "snap")
    owned = _owned(1, 3)
    r = backends("r")
    r.restore_checkpoints([saved], owned)
    want = {k: f"v{k}" for k in range(3000) if partition_of(k) in owned}
    assert dict(r.items()) == want
    assert len(r) == len(want)
    assert r.get(next(k for k in range(3000) if partition_of(k) not in owned)) is None
    assert list(r.items([p for p in range(PARTITION_COUNT) if p not in owned])) == []


def test_restore_from_one_processor_into_three_gives_every_key_exactly_once(backends, tmp_path):
    b = _filled(backends, "old0", range(6000))
    saved = _saved(b, tmp_path / "snap")
    seen: list = []
    for i in range(3):
        r = backends(f"new{i}")
        r.restore_checkpoints([saved], _owned(i, 3))
        keys = list(r.keys())
        assert len(r) == len(keys)
        assert all(partition_of(k) in _owned(i, 3) for k in keys)
        seen.extend(keys)
    assert sorted(seen) == list(range(6000))


def test_restore_from_two_processors_into_one_merges_their_partitions(backends, tmp_path):
    saved = []
    for i in range(2):
        keys = [k for k in range(6000) if partition_of(k) in _owned(i, 2)]
        b = _filled(backends, f"old{i}", keys)
        saved.append(_saved(b, tmp_path / f"snap{i}"))
    r = backends("new")
    r.restore_checkpoints(saved, range(PARTITION_COUNT))
    assert dict(r.items()) == {k: f"v{k}" for k in range(6000)}
    assert len(r) == 6000
    r.put(6000, "after")  # the restored database takes writes and checkpoints again
    again = _saved(r, tmp_path / "again")
    r2 = backends("new2")
    r2.restore_checkpoints([again], range(PARTITION_COUNT))
    assert len(r2) == 6001 and r2.get(6000) == "after"


def test_restore_from_two_processors_into_three(backends, tmp_path):
    saved = []
    for i in range(2):
        keys = [k for k in range(6000) if partition_of(k) in _owned(i, 2)]
        saved.append(_saved(_filled(backends, f"old{i}", keys), tmp_path / f"snap{i}"))
    seen: list = []
    for i in range(3):
        r = backends(f"new{i}")
        r.restore_checkpoints(saved, _owned(i, 3))
        assert len(r) == sum(1 for _ in r.keys())
        seen.extend(r.keys())
    assert sorted(seen) == list(range(6000))


def test_restore_and_later_work_never_change_the_saved_files(backends, tmp_path):
    saved = []
    for i in range(2):
        keys = [k for k in range(4000) if partition_of(k) in _owned(i, 2)]
        saved.append(_saved(_filled(backends, f"old{i}", keys), tmp_path / f"snap{i}"))
    before = {i: _digest(tmp_path / f"snap{i}") for i in range(2)}
    r = backends("new", cache_bytes=4096)
    r.restore_checkpoints(saved, _owned(0, 1))
    for k in range(4000):
        r.put(k, "changed")
    for k in range(0, 4000, 3):
        r.delete(k)
    r.clear()
    r.checkpoint()
    r.close()
    assert {i: _digest(tmp_path / f"snap{i}") for i in range(2)} == before


def test_restore_refuses_two_checkpoints_holding_the_same_partition(backends, tmp_path):
    saved = _saved(_filled(backends, "a", range(100)), tmp_path / "snap")
    with pytest.raises(ValueError, match="saved twice"):
        backends("r").restore_checkpoints([saved, saved], range(PARTITION_COUNT))


def test_restore_refuses_a_backend_that_already_has_entries(backends, tmp_path):
    saved = _saved(_filled(backends, "a", range(100)), tmp_path / "snap")
    r = backends("r")
    r.put("mine", 1)
    with pytest.raises(ValueError, match="empty backend"):
        r.restore_checkpoints([saved], range(PARTITION_COUNT))


def test_restore_refuses_files_that_are_not_a_state_checkpoint(backends, tmp_path):
    with pytest.raises(ValueError, match="does not hold a RocksDB state checkpoint"):
        backends("r").restore_checkpoints([_file_set(tmp_path)], range(PARTITION_COUNT))


def test_restore_of_checkpoints_holding_none_of_the_partitions_leaves_the_backend_empty(
        backends, tmp_path):
    keys = [k for k in range(500) if partition_of(k) in _owned(0, 2)]
    saved = _saved(_filled(backends, "a", keys), tmp_path / "snap")
    r = backends("r")
    r.restore_checkpoints([saved], _owned(1, 2))
    assert len(r) == 0 and list(r.items()) == []


def test_a_checkpoint_restores_into_state_kept_in_a_dict(backends, tmp_path):
    saved = _saved(_filled(backends, "a", range(1000)), tmp_path / "snap")
    before = _digest(tmp_path / "snap")
    state: dict = {}
    restore_keyed_state(state, [saved], _owned(2, 3))
    assert state == {k: f"v{k}" for k in range(1000) if partition_of(k) in _owned(2, 3)}
    assert sorted(k for k, _ in read_checkpoint_entries([saved], range(PARTITION_COUNT))) \
        == list(range(1000))
    assert _digest(tmp_path / "snap") == before


def test_a_database_written_before_per_partition_counts_reopens_with_exact_counts(tmp_path):
    """Databases of an earlier version kept only the total count under 0xFFFF"count"."""
    import struct

    from rocksdict import Options, Rdict
    from jetwake.snapshot.state.keyed_state import storage_key
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(str(tmp_path / "old"), options)
    for k in range(300):
        db[storage_key(k)] = dumps(k)
    db[b"\xff\xffcount"] = struct.pack(">Q", 300)
    db.close()
    b = _backend(tmp_path / "old")
    try:
        assert len(b) == 300
        saved = _saved(b, tmp_path / "snap")
        r = _backend(tmp_path / "r")
        r.restore_checkpoints([saved], _owned(0, 2))
        assert len(r) == sum(1 for k in range(300) if partition_of(k) in _owned(0, 2))
        r.destroy()
    finally:
        b.destroy()


# --- through a real job -------------------------------------------------------------------------

KEYS = 200
LIMIT = 12_000


class GatedSource(Processor):
    """Emits 0, 1, 2, ... up to ``gate[0]``, which the test raises while the job runs, and
    completes at ``limit``."""

    def __init__(self, gate: list[int], limit: int) -> None:
        self.gate = gate
        self.limit = limit
        self.next = 0

    def complete(self) -> bool:
        end = min(self.gate[0], self.limit)
        while self.next < end and self.outbox.has_room():
            stop = min(self.next + 256, end)
            self.outbox.offer_chunk(-1, list(range(self.next, stop)))
            self.next = stop
        return self.next >= self.limit

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(BroadcastKey("next"), self.next)

    def restore_from_snapshot(self, inbox) -> None:
        for _, value in inbox.drain():
            self.next = value


def _count_in_place(state: list, key, item) -> tuple:
    state[0] += 1  # changed in place: the backend must keep the value of each put
    return key, state[0]


def counting_pipeline(gate: list[int], kind: str, map_name: str = "counts") -> Pipeline:
    """A keyed count of ``x % KEYS`` over the gated source, into the map ``map_name``."""
    p = Pipeline()
    keyed = (p.read_from(Source("gated", ProcessorMetaSupplier.of(
        lambda: GatedSource(gate, LIMIT), 1), is_stream=True))
        .group_by(lambda x: x % KEYS))
    if kind == "rolling":
        stage = keyed.rolling_aggregate(AggregateOperations.counting())
    else:
        stage = keyed.map_stateful(lambda: [0], _count_in_place)
    stage.set_name("counter").write_to(Sinks.map(map_name))
    return p


def _config(**kwargs) -> JobConfig:
    return JobConfig(processing_guarantee="exactly_once", state_backend="rocksdb",
                     snapshot_interval_ms=3_600_000, state_cache_bytes=8192, **kwargs)


def _wait_counted(job, n: int, timeout: float = 60) -> None:
    wait_until(lambda: job.metrics().get("counter", {}).get("items_in", 0) >= n,
               timeout=timeout, what=f"the counter to receive {n} items")


def _expected() -> dict:
    return {k: LIMIT // KEYS for k in range(KEYS)}


def _file_sets(directory) -> list[str]:
    """The saved file sets of the counter stage under a snapshot or export directory."""
    return sorted(root for root, _, files in os.walk(directory)
                  if "counter" in root and any(f.endswith(".sst") for f in files))


@pytest.mark.parametrize("kind", ["rolling", "map_stateful"])
def test_a_job_restarts_from_rocksdb_files_with_state_rolled_back_to_the_snapshot(
        tmp_path, kind):
    gate = [LIMIT // 4]
    with Member(tmp_path) as m:
        job = m.new_job(counting_pipeline(gate, kind), _config(local_parallelism=2))
        _wait_counted(job, LIMIT // 4)
        rec = job.take_snapshot()
        snap_dir = tmp_path / "jobs" / job.id / "snapshots" / str(rec.snapshot_id)
        assert len(_file_sets(snap_dir)) == 2, "each counter processor saves its RocksDB files"
        gate[0] = LIMIT // 2  # changes after the snapshot, which the restart must undo
        _wait_counted(job, LIMIT // 2)
        job.restart()
        gate[0] = LIMIT
        job.join(120)
        assert dict(m.get_map("counts").items()) == _expected()


@pytest.mark.parametrize("before, after", [(2, 1), (1, 3)])
def test_rocksdb_files_restore_into_another_parallelism_with_every_key_once(
        tmp_path, before, after):
    gate = [LIMIT // 2]
    with Member(tmp_path) as m:
        job = m.new_job(counting_pipeline(gate, "rolling"), _config(local_parallelism=before))
        _wait_counted(job, LIMIT // 2)
        job.cancel_and_export_snapshot("rescale")
        assert len(_file_sets(tmp_path / "exports" / "rescale")) == before
        again = m.new_job(counting_pipeline([LIMIT], "rolling"), _config(
            local_parallelism=after, initial_snapshot_name="rescale"))
        again.join(120)
        assert dict(m.get_map("counts").items()) == _expected()


def test_snapshots_of_state_changed_in_place_each_restore_their_own_cut(tmp_path):
    gate = [LIMIT // 4]
    with Member(tmp_path) as m:
        job = m.new_job(counting_pipeline(gate, "map_stateful"), _config())
        _wait_counted(job, LIMIT // 4)
        job.export_snapshot("early")
        gate[0] = LIMIT // 2
        _wait_counted(job, LIMIT // 2)
        job.export_snapshot("late")
        job.cancel()
        early = set(_sst_inodes(tmp_path / "exports" / "early"))
        late = set(_sst_inodes(tmp_path / "exports" / "late"))
        assert early & late, "the later snapshot does not reuse the SST files of the earlier"
        for name in ("early", "late"):
            m.new_job(counting_pipeline([LIMIT], "map_stateful", f"counts-{name}"),
                      _config(initial_snapshot_name=name)).join(120)
            assert dict(m.get_map(f"counts-{name}").items()) == _expected(), name


def test_retention_deletes_old_snapshots_and_the_newest_still_restores(tmp_path):
    gate = [LIMIT // 2]
    with Member(tmp_path) as m:
        job = m.new_job(counting_pipeline(gate, "rolling"), _config())
        _wait_counted(job, LIMIT // 2)
        snaps = tmp_path / "jobs" / job.id / "snapshots"
        first = job.take_snapshot()
        first_ssts = set(_sst_inodes(snaps / str(first.snapshot_id)))
        newest = None
        for _ in range(3):
            newest = job.take_snapshot()
        assert not (snaps / str(first.snapshot_id)).exists(), "retention kept the first"
        assert first_ssts & set(_sst_inodes(snaps / str(newest.snapshot_id))), \
            "the newest snapshot should share the first one's unchanged SST files"
        job.restart()
        gate[0] = LIMIT
        job.join(120)
        assert dict(m.get_map("counts").items()) == _expected()


def test_a_rocksdb_snapshot_restores_into_a_job_with_state_in_memory(tmp_path):
    gate = [LIMIT // 2]
    with Member(tmp_path) as m:
        job = m.new_job(counting_pipeline(gate, "rolling"), _config(local_parallelism=2))
        _wait_counted(job, LIMIT // 2)
        job.cancel_and_export_snapshot("to-memory")
        m.new_job(counting_pipeline([LIMIT], "rolling"), JobConfig(
            processing_guarantee="exactly_once", initial_snapshot_name="to-memory",
            local_parallelism=1)).join(120)
        assert dict(m.get_map("counts").items()) == _expected()


def test_a_ttl_keeps_the_last_event_times_of_states_restored_from_rocksdb_files(tmp_path):
    half = LIMIT // 2
    gate = [half]
    p = Pipeline()
    (p.read_from(Source("gated", ProcessorMetaSupplier.of(
        lambda: GatedSource(gate, LIMIT), 1), is_stream=True))
      .with_timestamps(lambda x: x, allowed_lag=0)
      # after the restore only the key "late" gets events: the others are evicted at the end
      # of the stream only if their last event times were restored
      .group_by(lambda x: x % KEYS if x < half else "late")
      .map_stateful(lambda: [0], _count_in_place, ttl=10**9,
                    on_evict=lambda state, key: ("evicted", key, state[0]))
      .set_name("counter")
      .write_to(Sinks.list("out")))
    with Member(tmp_path) as m:
        job = m.new_job(p, _config(local_parallelism=2))
        _wait_counted(job, half)
        job.take_snapshot()
        job.restart()
        gate[0] = LIMIT
        job.join(120)
        evicted = sorted((x for x in m.get_list("out") if x[0] == "evicted"), key=str)
    assert evicted == sorted([("evicted", k, half // KEYS) for k in range(KEYS)]
                             + [("evicted", "late", LIMIT - half)], key=str)
