"""What the chaos and soak runs are made of: their own Kafka brokers, three member processes,
a producer at a fixed rate, a ``read_committed`` reader of the output, and a sampler of the
members' resident memory.

Where the machine allows network namespaces (root, a kernel with veth pairs), the members run
each in a namespace of tests/support/network_partition.py's :class:`PartitionNetwork` and the
brokers listen on its bridge, so that a member can be cut off; elsewhere everything runs on
loopback and the partition fault is skipped (:attr:`Harness.partitions` says why).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
TOKEN = "bench-chaos-token"
CLIENT_PORT = 5701  # each member's own namespace: the same port for all
KEYS = 13


def _tests_on_path() -> None:
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def kafka_local() -> Any:
    """tests/support/local_kafka/kafka_local.py (the project's broker script)."""
    _tests_on_path()
    from support.local_runners import load_runner  # noqa: PLC0415
    return load_runner(REPO / "tests" / "support" / "local_kafka" / "kafka_local.py")


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------------------------
# brokers
# --------------------------------------------------------------------------------------------

class Brokers:
    """``nodes`` KRaft brokers of kafka_local on ``host``; one can be SIGKILLed and started
    again on its data (kafka_local's ``restart_node``)."""

    def __init__(self, nodes: int, host: str = "127.0.0.1") -> None:
        self.kl = kafka_local()
        self.nodes = nodes
        self.port = self.kl.free_port(nodes)
        self.bootstrap = self.kl.start_broker(self.port, nodes=nodes, host=host)
        self.rdir = self.kl.run_dir(self.port)
        self.down: set[int] = set()

    def pid(self, node: int) -> int:
        pid = self.kl.node_pid(self.port, node)
        if pid is None:
            raise RuntimeError(f"broker node {node} is not running")
        return int(pid)

    def kill(self, node: int) -> None:
        os.kill(self.pid(node), signal.SIGKILL)
        self.down.add(node)

    def restart(self, node: int) -> None:
        """Starts node ``node`` again on its data directory, as kafka_local started it."""
        self.kl.restart_node(self.port, node)
        self.down.discard(node)

    def topic_bytes(self, topic: str) -> int:
        """The size on disk of ``topic``'s partitions in every broker's log directory: the
        blocks allocated (as ``du``), not the files' lengths, which count the space a broker
        reserves for the active segment's indexes (10 MiB each) before it writes them."""
        total = 0
        for data in self.rdir.glob("data-*"):
            for part in data.glob(f"{topic}-*"):
                if not part.name[len(topic) + 1:].isdigit():
                    continue
                for f in part.iterdir():
                    try:
                        total += f.stat().st_blocks * 512
                    except OSError:
                        pass
        return total

    def stop(self) -> None:
        self.kl.stop_broker(self.port, timeout=5.0)


# --------------------------------------------------------------------------------------------
# members
# --------------------------------------------------------------------------------------------

class Member:
    """One ``jetwake member start --cluster`` process in slot ``slot`` (1-based); restarted,
    it is a new process on the same data directory and address."""

    def __init__(self, run: "Members", slot: int) -> None:
        self.run = run
        self.slot = slot
        self.data_dir = run.root / f"member-{slot}"
        if run.net is not None:
            self.host, self.port = run.net.address(slot), CLIENT_PORT
        else:
            self.host, self.port = "127.0.0.1", _free_port()
        self.address = f"{self.host}:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.paused = False

    @property
    def log_path(self) -> Path:
        return self.run.root / f"member-{self.slot}-{self.starts}.log"

    def last_log_line(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return next((ln for ln in reversed(lines) if "ERROR" in ln), lines[-1] if lines else "")

    def start(self) -> None:
        self.starts += 1
        log = self.log_path
        prefix = self.run.net.command_prefix(self.slot) if self.run.net is not None else []
        cmd = [*prefix, sys.executable, "-m", "jetwake.engine.server.cli", "member", "start",
               "--cluster", self.run.name, "--kafka", self.run.bootstrap,
               "--data-dir", str(self.data_dir), "--host", self.host, "--port", str(self.port),
               # INFO: a failed run's logs show every restore and snapshot (which snapshot a
               # restart took is what an exactly-once failure turns on)
               "--token", TOKEN, "--log-level", "INFO", *self.run.member_args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("JETWAKE_")}
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        self.paused = False

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def serving(self) -> bool:
        if not self.alive():
            return False
        try:
            self.client(timeout=2.0).close()
            return True
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    def client(self, timeout: float = 5.0) -> Any:
        from jetwake import Client
        return Client(self.address, token=TOKEN, connect_timeout=timeout,
                      request_timeout=max(timeout, 10.0))

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)
            self.paused = False
        elif sig == signal.SIGSTOP:
            self.paused = True
        elif sig == signal.SIGCONT:
            self.paused = False

    def rss_bytes(self) -> int | None:
        """Resident memory from /proc (None when the process is gone)."""
        if not self.alive():
            return None
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def stop(self, grace: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass


class Members:
    """``count`` members of a fresh cluster on ``bootstrap`` (in namespaces when ``net``)."""

    def __init__(self, root: Path, bootstrap: str, count: int, net: Any,
                 member_args: list[str]) -> None:
        self.root = root
        self.bootstrap = bootstrap
        self.net = net
        self.member_args = member_args
        self.name = f"chaos{uuid.uuid4().hex[:8]}"
        self.members = [Member(self, i + 1) for i in range(count)]

    def start(self, timeout: float = 120.0) -> None:
        # the first member alone, then the others: members starting together on three
        # brokers can fail on a cluster topic another has just created (its configuration
        # not yet known to every broker: UNKNOWN_TOPIC_OR_PART)
        self.members[0].start()
        self.wait_serving(self.members[:1], timeout)
        for m in self.members[1:]:
            m.start()
        self.wait_serving(self.members, timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.members[0].client() as c:
                    if len(c.cluster()["members"]) == len(self.members):
                        return
            except Exception:  # noqa: BLE001 - still forming
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not list {len(self.members)} members "
                                   f"in {timeout:.0f} s")
            time.sleep(0.3)

    def wait_serving(self, members: list[Member], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(m.serving() for m in members):
            dead = [m for m in members if not m.alive()]
            if dead:
                raise RuntimeError(f"member {dead[0].slot} exited with "
                                   f"{dead[0].proc.returncode if dead[0].proc else None}; "
                                   f"see its log under {self.root}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"members did not serve clients in {timeout:.0f} s")
            time.sleep(0.2)

    def live(self) -> list[Member]:
        return [m for m in self.members if m.alive() and not m.paused]

    def coordinator(self) -> Member | None:
        """The coordinator as a live, unpaused member sees it (None if none answers)."""
        for via in self.live():
            try:
                with via.client(timeout=3.0) as c:
                    info = c.cluster()
            except Exception:  # noqa: BLE001 - try another
                continue
            found = [i["address"] for i in info["members"] if i.get("coordinator")]
            for m in self.members:
                if found and m.address == found[0] and m.alive():
                    return m
        return None

    def stop(self) -> None:
        for m in self.members:
            m.stop()


# --------------------------------------------------------------------------------------------
# traffic
# --------------------------------------------------------------------------------------------

def create_topic(bootstrap: str, replicas: int, partitions: int = 3,
                 prefix: str = "chaos") -> str:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    config = {"retention.ms": "-1"}
    if replicas >= 3:
        config["min.insync.replicas"] = "2"
    admin.create_topics([NewTopic(name, partitions, replicas, config=config)])[name].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if md is not None and md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()):
            return name
        time.sleep(0.1)
    raise TimeoutError(f"topic {name} has no leader for each partition after 60 s")


class Producer(threading.Thread):
    """Writes ``rate`` records a second: key ``k<seq % KEYS>``, value ``seq`` (JSON), with an
    idempotent producer (a retry across a broker fault neither duplicates nor reorders). What
    Kafka acknowledged is kept as (partition, offset, key, value)."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer as KafkaProducer
        self.producer = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                       "enable.idempotence": True,
                                       "message.timeout.ms": 600000,
                                       "log_level": 0})  # a broker down is expected here
        self.topic = topic
        self.rate = rate
        self.stop = threading.Event()
        self.acked: list[tuple[int, int, str, int]] = []  # partition, ack order, key, value
        self.failed: list[str] = []
        self.sent = 0

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            # ordered by when acknowledged, not by offset: a retried batch the broker had
            # already written comes back as a duplicate, acknowledged with no offset; the
            # idempotent producer acknowledges each partition's records in their order
            self.acked.append((msg.partition(), len(self.acked), msg.key().decode(),
                               json.loads(msg.value())))

    def run(self) -> None:
        start = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - start) * self.rate)
            while self.sent < due:
                seq = self.sent
                try:
                    self.producer.produce(self.topic, key=f"k{seq % KEYS}".encode(),
                                          value=json.dumps(seq).encode(),
                                          on_delivery=self._delivered)
                except BufferError:
                    break
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.01)
        self.producer.flush(600)

    def events(self) -> list[tuple[str, int]]:
        """The acknowledged records as ``(key, value)`` in each partition's order (a key's
        records are in one partition, so in the order the job sees them)."""
        return [(k, v) for _p, _o, k, v in sorted(self.acked)]


class Output(threading.Thread):
    """A ``read_committed`` reader of the output topic: its records and when each arrived.

    It reads every partition from the start without a consumer group (see
    :func:`assign_from_start`): with one, stopping every broker for longer than the group's
    session timeout made it read the output again, as if the job had written it twice."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                  "isolation.level": "read_committed",
                                  "fetch.wait.max.ms": 50, "log_level": 0})
        assign_from_start(self.consumer, topic)
        self.records: list[tuple[str, Any]] = []
        self.arrivals: list[float] = []  # monotonic time of each record's arrival
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stop.is_set():
            for msg in self.consumer.consume(500, 0.1):
                if msg.error() is not None:
                    continue
                now = time.monotonic()
                with self.lock:
                    self.records.append((msg.key().decode(), json.loads(msg.value())))
                    self.arrivals.append(now)
        self.consumer.close()

    def count(self) -> int:
        with self.lock:
            return len(self.records)

    def arrived_since(self, t: float) -> int:
        with self.lock:
            import bisect
            return len(self.arrivals) - bisect.bisect_right(self.arrivals, t)

    def snapshot(self) -> list[tuple[str, Any]]:
        """The records read so far, in the order read."""
        with self.lock:
            return list(self.records)

    def longest_stall(self, start: float, end: float | None = None) -> float:
        """The longest stretch without a new record from ``start`` to ``end`` (monotonic
        times); without ``end``, to the last record read."""
        with self.lock:
            times = [t for t in self.arrivals if start < t and (end is None or t <= end)]
        points = [start, *times] + ([end] if end is not None else [])
        return max((b - a for a, b in zip(points, points[1:])), default=0.0)

    def close(self) -> None:
        """Stops reading and closes the consumer."""
        self.stop.set()
        if self.is_alive():
            self.join(30)


def assign_from_start(consumer: Any, topic: str, timeout: float = 30.0) -> None:
    """Assigns ``consumer`` every partition of ``topic`` from its first offset, once the
    brokers' metadata shows the topic (one just created may take a moment to appear).

    A checker reads this way rather than in a consumer group: a group member that hears
    nothing from Kafka for its session timeout loses its partitions and, without committed
    offsets, reads them again from the start when it rejoins."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    deadline = time.monotonic() + timeout
    while True:
        found = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                             for p in sorted(found.partitions)])
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the topic {topic!r} has no partitions after {timeout:.0f} s: "
                               "create it before reading it")
        time.sleep(0.2)  # the poll interval of this wait


@dataclass
class MemorySampler:
    """Every ``every`` seconds, each member's resident memory (from /proc)."""

    members: list[Member]
    every: float
    t0: float
    samples: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def sample(self) -> None:
        row: dict = {"t": round(time.monotonic() - self.t0, 1)}
        for m in self.members:
            rss = m.rss_bytes()
            row[f"member-{m.slot}"] = None if rss is None else round(rss / 2**20, 1)
        self.samples.append(row)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()

    def summary(self) -> dict[str, dict[str, float]]:
        """Per member: the first, largest and last sample (MiB)."""
        out = {}
        for m in self.members:
            key = f"member-{m.slot}"
            values = [s[key] for s in self.samples if s.get(key) is not None]
            if values:
                out[key] = {"start": values[0], "max": max(values), "end": values[-1]}
        return out


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of ``(seconds, value)`` points, per hour."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return 0.0 if den == 0 else 3600 * sum((t - mx) * (v - my) for t, v in points) / den


def partition_network(members: int) -> tuple[Any, str | None]:
    """A :class:`PartitionNetwork` of ``members`` namespaces, or (None, why not)."""
    _tests_on_path()
    from support.network_partition import NamespacesUnavailable, PartitionNetwork
    try:
        return PartitionNetwork(members), None
    except NamespacesUnavailable as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - no `ip`, no privileges, ...
        return None, f"{type(e).__name__}: {e}"


def finish(report: dict, report_path: Path | None, print_report: Any) -> None:
    """The end of a chaos or soak run: prints the report, writes it as JSON when asked, and
    exits 1 when its checks failed (so that `make chaos` and CI see it)."""
    print_report(report)
    if report_path is not None:
        report_path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"   report written to {report_path}")
    if not report["passed"]:
        raise SystemExit(1)
