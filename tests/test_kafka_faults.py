"""Kafka end to end while the member process is SIGKILLed and restarted on its data directory.

The job (tests/support/kafka_job_process.py) counts records per key and writes
``key -> count so far`` for every input record. Exactly-once means: a ``read_committed`` reader
sees, for each key ``k`` with ``n`` input records, the values ``1..n`` each exactly once (every
output record once, and the keyed state exact after every restore).
"""
from __future__ import annotations

import random
import time
from collections import defaultdict

import pytest

from support.kafka_job import (
    Proc, Reader, check_exactly_once, expected_counts, produce, produce_slowly,
)
from support.restores import restored_snapshots, wait_for_a_new_snapshot
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.faults]


def kill_after_a_snapshot(proc: Proc, data_dir: str, moment: float) -> None:
    """Kills ``proc`` ``moment`` seconds after it has committed a snapshot of its own (a kill
    before any snapshot would leave the next run nothing to restore)."""
    wait_for_a_new_snapshot(data_dir)
    time.sleep(moment)  # the moment of the kill is the experiment
    proc.kill()


def test_exactly_once_with_random_kills(kafka_bootstrap, kafka_topic, tmp_path):
    rnd = random.Random(20240605)
    tin, tout = kafka_topic(partitions=4), kafka_topic(partitions=3)
    total = 30_000
    data = str(tmp_path / "member")
    proc = Proc(data, kafka_bootstrap, tin, tout, "--interval-ms", "150")
    reader = Reader(kafka_bootstrap, tout)
    feeder = None
    try:
        for round_ in range(6):
            proc.start(wait_ready=round_ == 0)
            if round_ == 0:
                feeder = produce_slowly(kafka_bootstrap, tin, total, 15.0)
            kill_after_a_snapshot(proc, data, rnd.uniform(0.5, 2.5))
            reader.poll(0.1)
        feeder.join(60)
        # the last run: no kill until everything is out
        proc.start()
        reader.wait_for(total, 90)
        reader.poll(2.0)  # anything extra (a duplicate) shows up now
    finally:
        proc.kill()
        reader.close()
    check_exactly_once(reader.records, total)
    # every run after the first went on from a snapshot of the one before
    assert len(restored_snapshots(data)) >= 6, restored_snapshots(data)


def test_exactly_once_killed_between_commit_record_and_kafka_commit(kafka_bootstrap,
                                                                   kafka_topic, tmp_path):
    tin, tout = kafka_topic(partitions=2), kafka_topic(partitions=1)
    total = 6_000
    produce(kafka_bootstrap, tin, 0, total)
    data = tmp_path / "member"
    proc = Proc(str(data), kafka_bootstrap, tin, tout, "--interval-ms", "300")
    reader = Reader(kafka_bootstrap, tout)
    try:
        proc.start("--die-in-phase2", "2")
        wait_until(lambda: not proc.alive(), timeout=60,
                   what="the sink to kill its process in phase 2")
        assert (data / "died-in-phase2").exists()
        proc.start()
        reader.wait_for(total, 90)
        reader.poll(2.0)
    finally:
        proc.kill()
        reader.close()
    check_exactly_once(reader.records, total)
    # the restarted job went on from the snapshot whose commit record was written
    assert restored_snapshots(str(data)), "the restarted job was not restored from a snapshot"


def test_at_least_once_never_loses_with_kills(kafka_bootstrap, kafka_topic, tmp_path):
    rnd = random.Random(7)
    tin, tout = kafka_topic(partitions=3), kafka_topic(partitions=2)
    total = 12_000
    data = str(tmp_path / "member")
    proc = Proc(data, kafka_bootstrap, tin, tout, "--interval-ms", "150",
                "--guarantee", "at_least_once")
    reader = Reader(kafka_bootstrap, tout)
    try:
        for round_ in range(3):
            proc.start(wait_ready=round_ == 0)
            if round_ == 0:
                feeder = produce_slowly(kafka_bootstrap, tin, total, 6.0)
            kill_after_a_snapshot(proc, data, rnd.uniform(0.5, 2.5))
        feeder.join(60)
        proc.start()
        want = expected_counts(total)

        def behind() -> list[str]:
            """The keys whose highest count written is still below their input."""
            best: dict[str, int] = defaultdict(int)
            for k, v in reader.records:
                best[k] = max(best[k], v)
            return sorted(k for k, n in want.items() if best[k] < n)

        def caught_up() -> bool:
            reader.read()
            return not behind()
        wait_until(caught_up, timeout=90, interval=0,
                   what=lambda: f"every key's count to reach its input ({behind()} behind)")
    finally:
        proc.kill()
        reader.close()
    by_key = defaultdict(set)
    for k, v in reader.records:
        by_key[k].add(v)
    for k, n in want.items():
        missing = set(range(1, n + 1)) - by_key[k]
        assert not missing, f"key {k}: counts {sorted(missing)[:5]} never written"
    assert len(restored_snapshots(data)) >= 3, restored_snapshots(data)
