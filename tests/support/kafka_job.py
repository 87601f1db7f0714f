"""The Kafka job of the fault tests from the outside: its process (kafka_job_process.py, which
counts records per key) started and SIGKILLed, its input produced, its output read, and the
exactly-once check of that output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict

from confluent_kafka import Consumer

from support.ordered_producer import ordered_producer
from support.waiting import wait_until

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kafka_job_process.py")
KEYS = 40


def produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    """Records ``start`` up to ``start + count``: key ``k{i % KEYS}``, value i."""
    p = ordered_producer(bootstrap, {"linger.ms": 5})
    for i in range(start, start + count):
        p.produce(topic, key=f"k{i % KEYS}".encode(), value=str(i).encode())
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def produce_slowly(bootstrap: str, topic: str, count: int, seconds: float) -> threading.Thread:
    """Produces ``count`` records evenly over ``seconds`` in a thread (input keeps arriving
    while the member is killed and restarted)."""
    def run() -> None:
        p = ordered_producer(bootstrap, {"linger.ms": 5})
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
    """The records per key in the first ``total`` records."""
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

    def read(self) -> None:
        """Adds what one fetch returns, waiting up to 0.2 s for something."""
        for m in self.c.consume(5000, 0.2):
            if m.error():
                continue
            self.records.append((m.key().decode(), int(m.value())))

    def poll(self, seconds: float) -> None:
        """Reads for ``seconds``, whatever comes: for duplicates that a test then looks for."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.read()

    def wait_for(self, n: int, timeout: float) -> None:
        """Reads until ``n`` records have arrived; fails, saying how many did, after
        ``timeout`` seconds."""
        def arrived() -> bool:
            self.read()
            return len(self.records) >= n
        wait_until(arrived, timeout=timeout, interval=0,
                   what=lambda: f"{n} records ({len(self.records)} arrived)")

    def close(self) -> None:
        self.c.close()


def check_exactly_once(records: list, total: int) -> None:
    """Each key's output is its counts 1..n, each once, for ``total`` records of input."""
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
    """The job's member process (kafka_job_process.py ARGS), started again on its data
    directory after each kill."""

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

