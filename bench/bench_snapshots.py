"""Snapshots: their time and size for 1 million keys of state, what they cost a keyed rolling
aggregate, and how long a crashed member's data directory takes to process again.

With RocksDB state, snapshots as checkpoint files (hard links to SST files) are measured beside
the full copy (every entry read back and serialized) in the same run: the first snapshot of 1
million keys, a second one after 1% of the keys changed, and the restore of the second.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import msgpack

from jetwake import (
    AggregateOperations, BroadcastKey, JobConfig, Member, Pipeline, Processor,
    ProcessorMetaSupplier, Sinks, Source,
)

from jetwake.snapshot.state.rocksdb_backend import RocksDBStateBackend

from .report import figure, line, timer

STATE_KEYS = 1_000_000
CHANGED_KEYS = STATE_KEYS // 100
THROUGHPUT_ITEMS = 2_000_000
THROUGHPUT_KEYS = 10_000


class RangeSource(Processor):
    """Emits 0..n-1 in chunks; with ``then_idle`` it never completes (a streaming job that
    keeps its state for a snapshot to be measured)."""

    def __init__(self, n: int, then_idle: bool) -> None:
        self.n = n
        self.then_idle = then_idle
        self.next = 0

    def complete(self) -> bool:
        while self.next < self.n and self.outbox.has_room():
            end = min(self.next + 4096, self.n)
            self.outbox.offer_chunk(-1, list(range(self.next, end)))
            self.next = end
        return self.next >= self.n and not self.then_idle

    def save_to_snapshot(self) -> bool:
        return self.outbox.offer_to_snapshot(BroadcastKey("next"), self.next)

    def restore_from_snapshot(self, inbox) -> None:
        for _, value in inbox.drain():
            self.next = value


def range_source(n: int, then_idle: bool) -> Source:
    return Source("range", ProcessorMetaSupplier.of(lambda: RangeSource(n, then_idle), 1),
                  is_stream=True)


class SteeredSource(RangeSource):
    """Emits 0, 1, 2, ... up to ``target[0]``, which the benchmark raises while the job runs;
    never completes."""

    def __init__(self, target: list[int]) -> None:
        super().__init__(0, True)
        self.target = target

    def complete(self) -> bool:
        self.n = self.target[0]
        return super().complete()


def steered_pipeline(target: list[int]) -> Pipeline:
    """A rolling count per ``x % STATE_KEYS``: items beyond STATE_KEYS change existing keys."""
    p = Pipeline()
    (p.read_from(Source("range", ProcessorMetaSupplier.of(lambda: SteeredSource(target), 1),
                        is_stream=True))
      .group_by(lambda x: x % STATE_KEYS)
      .rolling_aggregate(AggregateOperations.counting())
      .set_name("rolling")
      .write_to(Sinks.noop()))
    return p


def rolling_pipeline(n: int, keys: int, then_idle: bool) -> Pipeline:
    p = Pipeline()
    (p.read_from(range_source(n, then_idle))
      .group_by(lambda x: x % keys)
      .rolling_aggregate(AggregateOperations.counting())
      .set_name("rolling")
      .write_to(Sinks.noop()))
    return p


def wait_processed(job, vertex: str, count: int, timeout: float = 300) -> None:
    end = time.time() + timeout
    while job.metrics().get(vertex, {}).get("items_in", 0) < count:
        if time.time() > end:
            raise TimeoutError(f"{vertex} did not receive {count} items")
        time.sleep(0.02)


def snapshot_of_a_million_keys(backend: str) -> None:
    data_dir = tempfile.mkdtemp(prefix="jetwake-bench-")
    try:
        with Member(data_dir) as m:
            job = m.new_job(rolling_pipeline(STATE_KEYS, STATE_KEYS, True), JobConfig(
                name="state", processing_guarantee="exactly_once",
                snapshot_interval_ms=3_600_000, state_backend=backend))
            wait_processed(job, "rolling", STATE_KEYS)
            rec = job.take_snapshot()
            job.cancel()
        state = {i: 1 for i in range(STATE_KEYS)}
        path = os.path.join(data_dir, "baseline.bin")
        with timer() as t_base:
            data = msgpack.packb(list(state.items()))
            with open(path, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        figure(f"snapshot of {STATE_KEYS:,} keys ({backend})", rec.duration_ms, "ms",
               f"{rec.size_bytes / 2**20:.1f} MiB; baseline msgpack+fsync of the same dict "
               f"{t_base[0] * 1000:.0f} ms, {len(data) / 2**20:.1f} MiB, ratio "
               f"{t_base[0] * 1000 / rec.duration_ms:.2f}")
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def rolling_throughput(guarantee: str) -> float:
    cfg = JobConfig(name="rolling", processing_guarantee=guarantee, snapshot_interval_ms=1000)
    with Member() as m:
        with timer() as t:
            m.new_job(rolling_pipeline(THROUGHPUT_ITEMS, THROUGHPUT_KEYS, False), cfg).join()
    return THROUGHPUT_ITEMS / t[0]


CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from bench.bench_snapshots import rolling_pipeline, wait_processed, STATE_KEYS
    from jetwake import JobConfig, Member
    m = Member({data_dir!r})
    # 1M keys of state, and a source that still has items to emit after the crash
    job = m.new_job(rolling_pipeline(20 * STATE_KEYS, STATE_KEYS, True), JobConfig(
        name="recover", processing_guarantee="exactly_once", snapshot_interval_ms=3_600_000))
    wait_processed(job, "rolling", STATE_KEYS)
    job.take_snapshot()
    print("ready", flush=True)
    time.sleep(3600)
""")


def recovery_time() -> None:
    data_dir = tempfile.mkdtemp(prefix="jetwake-bench-")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(root=root, data_dir=data_dir)],
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    try:
        with timer() as t:
            m = Member(data_dir)
            job = m.get_job("recover")
            # processing again: the restored source emits and the stage receives items
            while job.metrics().get("rolling", {}).get("items_in", 0) == 0 \
                    and job.status.value == "RUNNING":
                time.sleep(0.001)
        with timer() as t_empty:
            Member(tempfile.mkdtemp(prefix="jetwake-bench-")).shutdown(graceful=False)
        m.shutdown(graceful=False)
        figure(f"recovery of a crashed member, {STATE_KEYS:,} keys", t[0] * 1000, "ms",
               f"(opening an empty data directory: {t_empty[0] * 1000:.0f} ms)")
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _inodes(directory: str) -> dict[int, int]:
    """inode -> size of every file under ``directory``."""
    out = {}
    for root, _, files in os.walk(directory):
        for f in files:
            st = os.stat(os.path.join(root, f))
            out[st.st_ino] = st.st_size
    return out


def rocksdb_snapshots(as_files: bool) -> dict[str, float]:
    """First snapshot of STATE_KEYS keys, a second after 1% of them changed, and the restore
    of the second (``Job.restart``), with RocksDB state saved as files or entry by entry."""
    RocksDBStateBackend.snapshot_as_files = as_files
    data_dir = tempfile.mkdtemp(prefix="jetwake-bench-")
    target = [STATE_KEYS]
    try:
        with Member(data_dir) as m:
            job = m.new_job(steered_pipeline(target), JobConfig(
                name="state", processing_guarantee="exactly_once",
                snapshot_interval_ms=3_600_000, state_backend="rocksdb"))
            wait_processed(job, "rolling", STATE_KEYS)
            first = job.take_snapshot()
            target[0] += CHANGED_KEYS
            wait_processed(job, "rolling", STATE_KEYS + CHANGED_KEYS)
            second = job.take_snapshot()
            snaps = os.path.join(data_dir, "jobs", job.id, "snapshots")
            before = _inodes(os.path.join(snaps, str(first.snapshot_id)))
            after = _inodes(os.path.join(snaps, str(second.snapshot_id)))
            with timer() as t_restore:
                job.restart()
            job.cancel()
        return {"first": first.duration_ms, "second": second.duration_ms,
                "restore": t_restore[0] * 1000,
                "first_mib": sum(before.values()) / 2**20,
                "second_mib": sum(after.values()) / 2**20,
                "second_new_mib": sum(s for i, s in after.items() if i not in before) / 2**20}
    finally:
        RocksDBStateBackend.snapshot_as_files = True
        shutil.rmtree(data_dir, ignore_errors=True)


def compare(name: str, files_ms: float, copy_ms: float, note: str = "") -> None:
    """Prints a duration beside the full-copy path's, and their ratio (under 1: faster)."""
    print(f"{name:<44} {files_ms:>10,.0f} ms | full copy {copy_ms:>10,.0f} ms | ratio "
          f"{files_ms / copy_ms:.3f}{'  ' + note if note else ''}", flush=True)


def rocksdb_files_beside_full_copy() -> None:
    copy = rocksdb_snapshots(as_files=False)
    files = rocksdb_snapshots(as_files=True)
    compare(f"RocksDB snapshot of {STATE_KEYS:,} keys", files["first"], copy["first"],
            f"files {files['first_mib']:.1f} MiB, full copy {copy['first_mib']:.1f} MiB")
    compare(f"RocksDB snapshot after {CHANGED_KEYS:,} keys changed", files["second"],
            copy["second"], f"files: {files['second_new_mib']:.2f} MiB new of "
            f"{files['second_mib']:.1f} MiB (the rest hard links shared with the first)")
    compare(f"RocksDB restore of {STATE_KEYS:,} keys (restart)", files["restore"],
            copy["restore"])


def main() -> None:
    snapshot_of_a_million_keys("memory")
    rocksdb_files_beside_full_copy()
    without = rolling_throughput("none")
    with_snapshots = rolling_throughput("exactly_once")
    line(f"rolling count, {THROUGHPUT_KEYS:,} keys, snapshots every 1 s", with_snapshots,
         without, "items", "same job, no snapshots")
    recovery_time()


if __name__ == "__main__":
    main()
