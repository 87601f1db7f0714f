"""Exactly-once for the state shapes users write, through real SIGKILLs.

Each pipeline keeps state that is changed in place (lists, dicts, accumulators that mutate
themselves, window buffers) and runs exactly-once on a member process that is SIGKILLed at
random moments and restarted on its data directory. The output must count every event exactly
once. The random moments come from a seed that is printed, so a failure repeats with
``JETWAKE_KILL_SEED=<seed>``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from support.restores import restored_snapshots, wait_for_a_new_snapshot
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]

SCRIPT = os.path.join(os.path.dirname(__file__), "support", "state_shapes_process.py")
EVENTS = 8000
KILLS = 3


def _seed() -> int:
    seed = int(os.environ.get("JETWAKE_KILL_SEED") or random.SystemRandom().randrange(2**32))
    print(f"kill seed: {seed} (repeat with JETWAKE_KILL_SEED={seed})")
    return seed


def _start(data_dir: str, shape: str, backend: str, check: bool = False,
           env_extra: dict | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "JETWAKE_CRASH_AT"}
    env.update(env_extra or {})
    args = [sys.executable, SCRIPT, data_dir, shape, str(EVENTS), backend]
    if check:
        args.append("check")
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def _kill_at_random_moments(data_dir: str, rnd: random.Random, start) -> None:
    """KILLS runs, each SIGKILLed at a random moment after it has taken a snapshot of its own
    (a kill before any snapshot would leave the next run nothing to restore)."""
    for _ in range(KILLS):
        proc = start()
        try:
            wait_for_a_new_snapshot(data_dir)
            time.sleep(rnd.uniform(0.0, 1.0))  # the moment of the kill is the experiment
        finally:
            _kill(proc)


def _assert_restored_after_every_kill(data_dir: str, seed: int) -> None:
    restored = restored_snapshots(data_dir)
    assert len(restored) >= KILLS, f"seed {seed}: restored from snapshots {restored} only"


def _run_with_kills(data_dir: str, shape: str, backend: str, seed: int) -> dict:
    rnd = random.Random(seed)
    _kill_at_random_moments(data_dir, rnd, lambda: _start(data_dir, shape, backend))
    proc = _start(data_dir, shape, backend, check=True)
    try:
        _, err = proc.communicate(timeout=150)
    finally:
        _kill(proc)
    assert proc.returncode == 0, err.decode()[-3000:]
    _assert_restored_after_every_kill(data_dir, seed)
    with open(os.path.join(data_dir, "result.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("shape,backend", [
    ("rolling_all_of", "memory"),
    ("rolling_all_of", "rocksdb"),
    ("rolling_to_list", "memory"),
    ("rolling_dict_accumulator", "memory"),
    ("map_stateful_list", "memory"),
    ("map_stateful_list", "rocksdb"),
    ("window_to_list", "memory"),
])
def test_state_changed_in_place_counts_every_event_once_through_sigkills(tmp_path, shape,
                                                                         backend):
    seed = _seed()
    result = _run_with_kills(str(tmp_path / "member"), shape, backend, seed)
    got, want = result["got"], result["want"]
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    assert not wrong, (f"seed {seed}: {len(wrong)} of {len(want)} keys wrong, e.g. "
                       f"{dict(list(wrong.items())[:3])}")


@pytest.mark.kafka
def test_kafka_map_stateful_list_counter_is_exact_in_every_output_record(tmp_path,
                                                                        kafka_bootstrap,
                                                                        kafka_topic):
    """Kafka -> map_stateful(lambda: [0], counter changed in place) -> Kafka, exactly-once:
    per key, a read_committed reader sees "1", "2", ... "n" exactly once each."""
    from confluent_kafka import Consumer, Producer

    seed = _seed()
    rnd = random.Random(seed)
    in_topic, out_topic = kafka_topic(partitions=3), kafka_topic(partitions=3)
    keys = [f"k{i}" for i in range(13)]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    want: dict[str, int] = {}
    for i in range(EVENTS):
        key = keys[i % len(keys)]
        producer.produce(in_topic, key=key, value=str(i))
        want[key] = want.get(key, 0) + 1
    assert producer.flush(30) == 0
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "STATE_IN_TOPIC": in_topic,
           "STATE_OUT_TOPIC": out_topic}
    data_dir = str(tmp_path / "member")
    _kill_at_random_moments(data_dir, rnd, lambda: _start(
        data_dir, "kafka_map_stateful_list", "memory", env_extra=env))
    proc = _start(data_dir, "kafka_map_stateful_list", "memory", env_extra=env)
    got: dict[str, list[int]] = {k: [] for k in keys}
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"check-{seed}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe([out_topic])

        def all_out() -> bool:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error() is None:
                    got[msg.key().decode()].append(int(msg.value().decode()))
            return sum(len(v) for v in got.values()) >= EVENTS
        wait_until(all_out, timeout=120, interval=0, what=lambda: f"{EVENTS} output records "
                   f"({sum(len(v) for v in got.values())} arrived)")
        # a duplicate written late would still arrive now
        for msg in consumer.consume(1000, timeout=2.0):
            if msg.error() is None:
                got[msg.key().decode()].append(int(msg.value().decode()))
    finally:
        consumer.close()
        _kill(proc)
    wrong = {k: (v[:5], len(v)) for k, v in got.items() if v != list(range(1, want[k] + 1))}
    assert not wrong, f"seed {seed}: keys with lost, repeated or wrong counters: {wrong}"
    _assert_restored_after_every_kill(data_dir, seed)
