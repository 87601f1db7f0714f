"""Map writes a snapshot refers to are durable before its commit record.

A map write reaches RocksDB's log without an fsync: it survives a killed process but not a
power loss. A snapshot's commit record may point into a map's journal (the map journal source
saves its sequence) and counts on a map sink's puts (under exactly-once they are not made again
for items before the snapshot), so the maps are synced after phase 1 and before the commit
record. A SIGKILL cannot lose unsynced writes (tests/test_fault_tolerance.py crashes a member
right after the commit record and checks the map), so the ordering is tested here instead:
what was in the maps when they were synced covers what every committed snapshot refers to.
"""

from __future__ import annotations

import os
import time

from jetwake import BroadcastKey, JobConfig, JobStatus, Member
from support.member_process import KEYS, build_pipeline
from support.waiting import wait_until


def test_maps_are_synced_after_phase_1_and_before_each_commit_record(tmp_path, monkeypatch):
    m = Member(tmp_path)
    try:
        source, out = m.get_map("in"), m.get_map("out")
        real_sync = m._maps.sync
        job_id: list[str] = []
        syncs: list[tuple[int, set[int], int, dict]] = []

        def recording_sync() -> None:
            # what the sync is about to make durable, and where the snapshots stand
            if job_id:
                with open(os.path.join(tmp_path, "jobs", job_id[0], "next-snapshot-id")) as f:
                    next_id = int(f.read())
                committed = {r.snapshot_id for r in m.snapshot_store.committed(job_id[0])}
                syncs.append((next_id, committed, source.journal_next_seq(),
                              dict(out.items())))
            real_sync()
        monkeypatch.setattr(m._maps, "sync", recording_sync)

        job = m.new_job(build_pipeline(), JobConfig(
            name="sums", processing_guarantee="exactly_once", snapshot_interval_ms=30))
        job_id.append(job.id)
        for i in range(3000):
            source.put(i, i)
            if i % 100 == 0:
                time.sleep(0.01)
        wait_until(lambda: sum(c for _, c in out.values()) == 3000, what="the sums")
        job.suspend()
        assert job.status == JobStatus.SUSPENDED

        records = m.snapshot_store.committed(job.id)
        assert records and records[0].terminal
        for rec in records:
            sid = rec.snapshot_id
            before = [s for s in syncs if s[0] == sid + 1 and sid not in s[1]]
            assert before, f"no sync between phase 1 and the commit record of snapshot {sid}"
            _, _, synced_seq, synced_out = before[-1]
            saved_seq, state = None, {}
            for entries in m.snapshot_store.read(rec).values():
                for key, value in entries:
                    if type(key) is BroadcastKey and key.key == ("map-journal", "in"):
                        saved_seq = value[0]  # [next sequence, highest timestamp]
                    elif isinstance(key, int) and 0 <= key < KEYS:
                        state[key] = value
            assert saved_seq is not None and state
            assert synced_seq >= saved_seq, "the journal the snapshot points into was synced"
            for key, (_, count) in state.items():
                assert synced_out[key][1] >= count, "the sink's puts before it were synced"
    finally:
        m.shutdown()


def test_sync_covers_the_writes_since_the_last_one(tmp_path):
    with Member(tmp_path) as m:
        kv = m.get_map("m")
        kv.put_all({i: i for i in range(100)})
        m.sync_maps()
        # nothing left for the next sync to do (it skips the fsync)...
        assert kv._storage.take_unsynced() is False
        kv.put("x", 1)
        # ...until the next write
        assert kv._storage.take_unsynced() is True
    with Member(tmp_path) as m:
        assert len(m.get_map("m")) == 101


def test_sync_of_maps_in_memory_does_nothing():
    with Member() as m:
        m.get_map("m").put("a", 1)
        m.sync_maps()
        assert m.get_map("m").get("a") == 1
