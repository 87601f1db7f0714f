"""Broker faults for the tests of an exactly-once job on three brokers (test_broker_faults.py).

``Brokers`` kills, pauses and restarts one KRaft node of a kafka_local cluster and finds the
node a fault must hit: the leader of a partition, the active controller, the transaction
coordinator of a transactional id. ``LiveInput`` produces keyed events into the input topic
all along; the chaos run's ``Output`` (bench/chaos/harness.py) reads the output with
``read_committed`` in the background, with the time each record arrived, so a test can tell the
longest stretch without output and check that every record is there once with the exact
state.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.chaos.checker import running_states  # the chaos run's check of the same job
from jetwake import Pipeline, Sinks, Sources
from support.kafka_broker import _kafka_local
from support.waiting import wait_until

# the QuorumController's line when a node becomes the active controller, in its broker log
_ACTIVE = re.compile(r"\[QuorumController id=(\d+)\] Becoming the active controller at epoch "
                     r"(\d+)")


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (Kafka places a transactional id by it)."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def transaction_partition(transactional_id: str, partitions: int) -> int:
    """The partition of ``__transaction_state`` whose leader coordinates
    ``transactional_id``: Kafka's ``Utils.abs(id.hashCode()) % partitions``."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class Brokers:
    """The nodes of a kafka_local cluster (node ids 1..n, which are also the broker ids)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.port = int(bootstrap.split(",")[0].rpartition(":")[2])
        self.kl = _kafka_local()
        self.nodes = list(range(1, len(bootstrap.split(",")) + 1))
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self._retired: list[AdminClient] = []
        self.paused: set[int] = set()
        self._out_of_sync = ""

    # --- the node a fault hits ----------------------------------------------------------

    def _partitions(self, topic: str) -> dict:
        """``topic``'s partitions in the metadata, asked again while no broker answers (a
        broker just killed, a loaded machine)."""
        def ask() -> dict | None:
            try:
                return self.admin.list_topics(topic=topic, timeout=5).topics[topic].partitions
            except Exception:  # noqa: BLE001 - no answer this time
                self._new_admin()
                return None
        return wait_until(ask, what=f"the metadata of {topic}", timeout=60, interval=0.2)

    def leader(self, topic: str, partition: int = 0) -> int:
        """The broker id leading ``topic``'s ``partition`` (-1 while there is none)."""
        return self._partitions(topic)[partition].leader

    def isr(self, topic: str, partition: int = 0) -> list[int]:
        return list(self._partitions(topic)[partition].isrs)

    def controller(self) -> tuple[int, int]:
        """``(node id, epoch)`` of the active KRaft controller: the newest "Becoming the active
        controller" line of the nodes' logs. (In KRaft a broker's metadata names any live broker
        as the controller, and the client has no DescribeQuorum call.)"""
        best = (-1, -1)
        for node in self.nodes:
            for m in _ACTIVE.finditer(self.log_path(node).read_text(errors="replace")):
                if int(m.group(2)) > best[1]:
                    best = (int(m.group(1)), int(m.group(2)))
        return best

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The broker id coordinating ``transactional_id``'s transactions."""
        parts = self._partitions("__transaction_state")
        return parts[transaction_partition(transactional_id, len(parts))].leader

    # --- faults ---------------------------------------------------------------------------

    def running(self) -> list[int]:
        """The nodes whose process runs."""
        return [n for n in self.nodes if self.pid(n) is not None]

    def log_path(self, node: int) -> Path:
        """Node ``node``'s log in kafka_local's run directory (gone when the brokers stop)."""
        return Path(self.kl.run_dir(self.port)) / f"broker-{node}.log"

    def stopped_nodes(self) -> str:
        """For a failure message: every node not running (the one a test killed among them),
        with the last lines of its log (why it exited), or "" when every node runs."""
        out = []
        for node in self.nodes:
            if self.pid(node) is None:
                try:
                    tail = self.log_path(node).read_text(
                        errors="replace").splitlines()[-12:]
                except OSError as e:
                    tail = [f"(no log: {e})"]
                out.append(f"\nnode {node} is not running; the end of its log:\n  "
                           + "\n  ".join(tail))
        return "".join(out)

    def save_logs(self, dest: Path) -> None:
        """Copies the nodes' logs to ``dest`` (the run directory goes when the brokers stop)."""
        dest.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            try:
                (dest / f"broker-{node}.log").write_bytes(self.log_path(node).read_bytes())
            except OSError:
                pass

    def pid(self, node: int) -> int | None:
        return self.kl.node_pid(self.port, node)

    def kill(self, node: int) -> None:
        """SIGKILLs node ``node`` and waits until its process is gone."""
        pid = self.pid(node)
        assert pid is not None, f"broker {node} is not running"
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: self.pid(node) is None, what=f"broker {node}'s process to end",
                   timeout=10)

    def pause(self, node: int) -> None:
        pid = self.pid(node)
        assert pid is not None, f"broker {node} is not running"
        os.kill(pid, signal.SIGSTOP)
        self.paused.add(node)

    def resume(self, node: int) -> None:
        pid = self.pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        self.paused.discard(node)

    def restart(self, node: int) -> None:
        """Starts the killed node ``node`` again, without waiting for it to serve: the job
        must go on with the two others meanwhile (``heal`` waits for it)."""
        self.kl.restart_node(self.port, node)

    def _live_brokers(self) -> set[int]:
        try:
            return set(self.admin.list_topics(timeout=3).brokers)
        except Exception:  # noqa: BLE001 - no broker answers yet
            self._new_admin()
            return set()

    def _new_admin(self) -> None:
        """A client that timed out may keep asking a paused broker: the next question goes
        through a new one (the old one is kept, as its request may still be in flight)."""
        self._retired.append(self.admin)
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})

    def heal(self) -> None:
        """Every node running and continued (a test's clean-up, whatever it did)."""
        for node in self.nodes:
            if node in self.paused:
                self.resume(node)
        wait_until(self._in_sync, what=lambda: f"every broker in sync again (out of sync: "
                   f"{self._out_of_sync}){self.stopped_nodes()}", timeout=120, interval=0.2)

    def _start_stopped(self) -> None:
        """Starts every node whose process is gone, all at once (a node alone has no
        controller quorum), and again whenever one exits while starting."""
        for node in self.nodes:
            if node not in self.paused and self.pid(node) is None:
                self.kl.restart_node(self.port, node)

    def _in_sync(self) -> bool:
        """Whether every broker is in the metadata and in the in-sync replicas of every
        partition (the next fault must not hit a partition whose only in-sync replica it
        is)."""
        self._start_stopped()
        try:
            md = self.admin.list_topics(timeout=3)
        except Exception:  # noqa: BLE001 - no broker answers yet
            self._new_admin()
            return False
        if set(md.brokers) != set(self.nodes):
            self._out_of_sync = f"brokers {sorted(md.brokers)}"
            return False
        out = [f"{t}-{p}" for t, tm in md.topics.items() for p, pm in tm.partitions.items()
               if len(pm.replicas) == len(self.nodes) and set(pm.isrs) != set(pm.replicas)]
        self._out_of_sync = ", ".join(out[:5])
        if out:
            return False
        # the metadata lists a node that died a moment ago until the controller fences it
        # (9 s): its process must run too, or the next fault may hit the last node standing
        stopped = [n for n in self.nodes if self.pid(n) is None]
        self._out_of_sync = f"node(s) {stopped} not running" if stopped else ""
        return not stopped


class LiveInput:
    """A producer thread writing ``(key, value)`` events into ``topic`` at about ``rate`` per
    second (idempotent, acks=all) until stopped; ``sent`` counts the acknowledged ones."""

    def __init__(self, bootstrap: str, topic: str, rate: float = 50.0, keys: int = 11) -> None:
        self.topic, self.keys, self.interval = topic, keys, 1.0 / rate
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "acks": "all", "linger.ms": 5,
                                  "message.timeout.ms": 600_000})
        self.sent = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="live-input")
        self._thread.start()

    def _delivered(self, err, _msg) -> None:
        if err is None:
            self.sent += 1
        else:
            self.failed.append(str(err))

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            self.producer.produce(self.topic, key=f"k{i % self.keys}".encode(),
                                  value=json.dumps(i + 1).encode(), on_delivery=self._delivered)
            self.producer.poll(0)
            i += 1
            self._stop.wait(self.interval)  # the pace of the live input, not a wait for it
        self.producer.flush(60)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)


def read_input(bootstrap: str, topic: str, partitions: int) -> list[tuple[str, int]]:
    """Every committed record of ``topic``, partition by partition (a key's order)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    out: list[tuple[str, int]] = []
    try:
        for p in range(partitions):
            _lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            c.assign([TopicPartition(topic, p, 0)])
            read = 0
            while read < hi:
                for m in c.consume(1000, 1.0):
                    if m.error() is None:
                        out.append((m.key().decode(), json.loads(m.value())))
                        read = m.offset() + 1
    finally:
        c.close()
    return out


def _add(state: list[int], key: str, item: tuple[str, int]) -> tuple[str, list[int]]:
    """The running ``[sum, count]`` of a key, changed in place (the state object is kept)."""
    state[0] += item[1]
    state[1] += 1
    return (key, list(state))


def running_state_pipeline(bootstrap: str, source: str, sink: str) -> Pipeline:
    """The job of the broker fault tests: ``source`` (str keys, JSON values) -> a running
    ``[sum, count]`` per key, stage "running" -> ``sink``."""
    props = {"bootstrap.servers": bootstrap}
    pipeline = Pipeline()
    (pipeline.read_from(Sources.kafka(source, props, key_deserializer="str",
                                      value_deserializer="json"))
        .group_by(lambda kv: kv[0])
        .map_stateful(lambda: [0, 0], _add).set_name("running")
        .write_to(Sinks.kafka(sink, props, key_serializer="str", value_serializer="json")))
    return pipeline


