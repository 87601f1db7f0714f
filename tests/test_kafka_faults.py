"""Kafka end to end while the member process is SIGKILLed and restarted on its data directory.

The job (tests/kafka_job_process.py) counts records per key and writes ``key -> count so far``
for every input record. Exactly-once means: a ``read_committed`` reader sees, for each key
``k`` with ``n`` input records, the values ``1..n`` each exactly once (every output record
once, and the keyed state exact after every restore).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import tempfile
import threading
import sys
import time
import uuid
from collections import Counter, defaultdict

import pytest
from confluent_kafka import Consumer, Producer

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.faults]

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "kafka_job_process.py")
KEYS = 40


def produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i in range(start, start + count):
        p.produce(topic, key=f"k{i % KEYS}".encode(), value=str(i).encode())
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def produce_slowly(bootstrap: str, topic: str, count: int, seconds: float) -> threading.Thread:
    """Produces ``count`` records evenly over ``seconds`` in a thread (input keeps arriving
    while the member is killed and restarted)."""
    def run() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                      "enable.idempotence": True})
        step = max(1, count // 100)
        start = time.monotonic()
        for i in range(count):
            p.produce(topic, key=f"k{i % KEYS}".encode(), value=str(i).encode())
            if i % step == 0:
                p.poll(0)
                delay = start + seconds * i / count - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        assert p.flush(30) == 0
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def expected_counts(total: int) -> Counter:
    return Counter(f"k{i % KEYS}" for i in range(total))


class Reader:
    """A read_committed consumer collecting the job's output as it appears."""

    def __init__(self, bootstrap: str, topic: str, committed: bool = True) -> None:
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                           "auto.offset.reset": "earliest", "enable.auto.commit": False,
                           "isolation.level": "read_committed" if committed
                           else "read_uncommitted"})
        self.c.subscribe([topic])
        self.records: list[tuple[str, int]] = []

    def poll(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for m in self.c.consume(5000, 0.2):
                if m.error():
                    continue
                self.records.append((m.key().decode(), int(m.value())))

    def wait_for(self, n: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        while len(self.records) < n and time.monotonic() < end:
            self.poll(0.5)

    def close(self) -> None:
        self.c.close()


def check_exactly_once(records: list, total: int) -> None:
    want = expected_counts(total)
    seen = Counter(records)
    dups = [r for r, c in seen.items() if c > 1]
    assert not dups, f"{len(dups)} output records appear more than once, e.g. {dups[:5]}"
    by_key = defaultdict(set)
    for k, v in records:
        by_key[k].add(v)
    for k, n in want.items():
        missing = set(range(1, n + 1)) - by_key[k]
        extra = by_key[k] - set(range(1, n + 1))
        assert not missing and not extra, (
            f"key {k}: {len(missing)} counts missing (e.g. {sorted(missing)[:5]}), "
            f"extra {sorted(extra)[:5]}")
    assert len(records) == total


class Proc:
    def __init__(self, *args: str) -> None:
        self.args = [sys.executable, SCRIPT, *args]
        self.p: subprocess.Popen | None = None
        self.stderr_tail = ""

    def start(self, *extra: str, wait_ready: bool = False) -> None:
        # stderr goes to a file: a pipe nobody reads fills up (librdkafka logs a lot while a
        # broker is away) and would block the member
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen(self.args + list(extra),
                                  stdout=subprocess.PIPE if wait_ready else subprocess.DEVNULL,
                                  stderr=self.err, start_new_session=True)
        if wait_ready:  # the job is submitted (its record is on disk)
            line = self.p.stdout.readline()
            assert line.strip() == b"READY", (line, self._tail())
            self.p.stdout.close()

    def _tail(self) -> str:
        self.err.seek(0)
        return "\n".join(x for x in self.err.read().decode(errors="replace").splitlines()
                         if "rdkafka" not in x or "Connect to" not in x)[-60000:]

    def kill(self) -> None:
        if self.p is not None and self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
        if self.p is not None:
            self.p.wait(10)
            self.stderr_tail = self._tail()
            self.err.close()
            self.p = None

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None


def test_exactly_once_with_random_kills(kafka_bootstrap, kafka_topic, tmp_path):
    rnd = random.Random(20240605)
    tin, tout = kafka_topic(partitions=4), kafka_topic(partitions=3)
    total = 30_000
    proc = Proc(str(tmp_path / "member"), kafka_bootstrap, tin, tout, "--interval-ms", "150")
    reader = Reader(kafka_bootstrap, tout)
    feeder = None
    try:
        for round_ in range(6):
            proc.start(wait_ready=round_ == 0)
            if round_ == 0:
                feeder = produce_slowly(kafka_bootstrap, tin, total, 15.0)
            time.sleep(rnd.uniform(1.5, 3.5))
            reader.poll(0.1)
            proc.kill()
        feeder.join(60)
        # the last run: no kill until everything is out
        proc.start()
        reader.wait_for(total, 90)
        reader.poll(2.0)  # anything extra (a duplicate) shows up now
    finally:
        proc.kill()
        reader.close()
    check_exactly_once(reader.records, total)


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
        end = time.monotonic() + 60
        while proc.alive() and time.monotonic() < end:
            time.sleep(0.1)
        assert not proc.alive(), "the sink did not kill its process in phase 2"
        assert (data / "died-in-phase2").exists()
        proc.start()
        reader.wait_for(total, 90)
        reader.poll(2.0)
    finally:
        proc.kill()
        reader.close()
    check_exactly_once(reader.records, total)


def test_at_least_once_never_loses_with_kills(kafka_bootstrap, kafka_topic, tmp_path):
    rnd = random.Random(7)
    tin, tout = kafka_topic(partitions=3), kafka_topic(partitions=2)
    total = 12_000
    proc = Proc(str(tmp_path / "member"), kafka_bootstrap, tin, tout, "--interval-ms", "150",
                "--guarantee", "at_least_once")
    reader = Reader(kafka_bootstrap, tout)
    try:
        for round_ in range(3):
            proc.start(wait_ready=round_ == 0)
            if round_ == 0:
                feeder = produce_slowly(kafka_bootstrap, tin, total, 6.0)
            time.sleep(rnd.uniform(1.0, 3.0))
            proc.kill()
        feeder.join(60)
        proc.start()
        want = expected_counts(total)
        end = time.monotonic() + 90
        while time.monotonic() < end:
            reader.poll(0.5)
            best: dict[str, int] = defaultdict(int)
            for k, v in reader.records:
                best[k] = max(best[k], v)
            if all(best[k] >= n for k, n in want.items()):
                break
    finally:
        proc.kill()
        reader.close()
    by_key = defaultdict(set)
    for k, v in reader.records:
        by_key[k].add(v)
    for k, n in want.items():
        missing = set(range(1, n + 1)) - by_key[k]
        assert not missing, f"key {k}: counts {sorted(missing)[:5]} never written"
