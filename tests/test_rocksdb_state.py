"""Keyed state in RocksDB: a job chooses the backend, its state may be far larger than the
write-back cache, and snapshots and restores work the same as in memory."""

from __future__ import annotations

import os

import pytest

from jetwake import AggregateOperations, JobConfig, Member, Pipeline, Sinks, Sources
from support.waiting import wait_until

KEYS = 20_000
ITEMS = 60_000


def rolling(items: list) -> Pipeline:
    p = Pipeline()
    (p.read_from(Sources.items(items))
      .group_by(lambda x: x % KEYS)
      .rolling_aggregate(AggregateOperations.counting())
      .write_to(Sinks.map("counts")))
    return p


def stateful(items: list) -> Pipeline:
    def count(state: list, key, item):
        state[0] += 1
        return (key, state[0])

    p = Pipeline()
    (p.read_from(Sources.items(items))
      .group_by(lambda x: x % KEYS)
      .map_stateful(lambda: [0], count)
      .write_to(Sinks.map("counts")))
    return p


def expected() -> dict:
    return {k: ITEMS // KEYS for k in range(KEYS)}


@pytest.mark.parametrize("build", [rolling, stateful], ids=["rolling", "map_stateful"])
def test_state_far_larger_than_the_cache_gives_exact_results(tmp_path, build):
    with Member(tmp_path) as m:
        m.new_job(build(list(range(ITEMS))), JobConfig(
            state_backend="rocksdb", state_cache_bytes=4096)).join(120)
        assert dict(m.get_map("counts").items()) == expected()


def test_rocksdb_state_lives_in_files_under_the_data_directory_while_the_job_runs(tmp_path):
    from support.snapshot_fixtures import counting_source

    p = Pipeline()
    (p.read_from(counting_source(None))
      .group_by(lambda x: x % 100)
      .rolling_aggregate(AggregateOperations.counting())
      .write_to(Sinks.noop()))
    with Member(tmp_path) as m:
        job = m.new_job(p, JobConfig(state_backend="rocksdb", state_cache_bytes=1024))
        state_dir = os.path.join(tmp_path, "state", job.id)
        wait_until(lambda: any(f.endswith(".sst") or f.startswith("MANIFEST")
                               for _, _, fs in os.walk(state_dir) for f in fs),
                   what=f"RocksDB files under {state_dir}")
        job.cancel()
        with pytest.raises(Exception):
            job.join(10)
    assert not any(fs for _, _, fs in os.walk(state_dir)), "state files outlive the job"


def test_rocksdb_state_is_snapshotted_and_restored_across_suspend_and_resume(tmp_path):
    from support.snapshot_fixtures import counting_source

    limit = 30_000
    p = Pipeline()
    (p.read_from(counting_source(limit))
      .group_by(lambda x: x % 1000)
      .rolling_aggregate(AggregateOperations.counting())
      .write_to(Sinks.map("counts")))
    with Member(tmp_path) as m:
        job = m.new_job(p, JobConfig(name="r", processing_guarantee="exactly_once",
                                     snapshot_interval_ms=50, state_backend="rocksdb",
                                     state_cache_bytes=2048))
        wait_until(lambda: job.last_snapshot, what="a snapshot")
        job.suspend()
        job.resume()
        job.join(120)
        assert dict(m.get_map("counts").items()) == {k: limit // 1000 for k in range(1000)}


def test_rocksdb_backend_without_a_data_directory_is_refused_with_the_fix():
    with Member() as m:
        with pytest.raises(ValueError, match="data_dir"):
            m.new_job(rolling([1]), JobConfig(state_backend="rocksdb"))
