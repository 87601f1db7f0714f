"""``python -m bench failover``: how long a cluster takes to process again after a member, or
the coordinator, is SIGKILLed, and how many records it replays.

Three member processes run an at-least-once Kafka -> map -> Kafka job (snapshots every
``INTERVAL_MS``) while a producer writes ``RATE`` records a second, each carrying its sequence
number. After the job has run steadily, one member is killed. The job restarts from its last
snapshot on the two survivors and replays the records since then: the first replayed record
to arrive marks the moment the new execution processes, so

- *time to processing again* = arrival of the first replayed record - the kill;
- *records replayed* = output records whose sequence number had arrived before, shown beside
  what one snapshot interval holds (``RATE * INTERVAL_MS``).

Three configurations; the coordinator is killed in each (``COORDINATOR_ROUNDS`` times in the
first two, each in a fresh cluster), a member other than the coordinator in the first:

- *default*: every setting at its default, on the broker of ``KAFKA_BOOTSTRAP_SERVERS`` (else
  one kafka_local starts), with the broker's defaults: the survivors find nothing listening at
  the dead coordinator's peer address and have Kafka remove it from the group at once
  (failure_detection.py);
- *session*: ``--fast-failover off`` on every member, the same broker: the dead coordinator
  is replaced only after Kafka's session timeout (6000 ms), the path before the removal;
- *lowered*: ``--fast-failover off --session-timeout LOWERED_SESSION_TIMEOUT_MS`` on every
  member, on a broker of its own (kafka_local, a free loopback port, stopped at the end) whose
  ``group.min.session.timeout.ms`` is lowered to ``LOWERED_BROKER_MIN_SESSION_MS``: Kafka
  refuses a member whose session timeout is below that minimum (6000 ms by default).

The coordinator's figures of *default* and *session* are printed side by side with their
ratio. A member the group expelled although it was alive (a false alarm: paused or starved
longer than the session timeout) says so in its log, and so does a survivor that had a dead
coordinator removed; both counts are printed with each run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench.cluster_members import BenchCluster
from bench.report import figure

RATE = 2000  # records per second
INTERVAL_MS = 1000
STEADY_S = 6.0
MEMBER_ARGS = ["--cooperative-threads", "1", "--local-parallelism", "1"]
COORDINATOR_ROUNDS = 2
LOWERED_SESSION_TIMEOUT_MS = 2000
LOWERED_BROKER_MIN_SESSION_MS = 1000
# what a member logs, once each time, when the group expelled it while it was alive
_EXPELLED = "joins again as a new member"
# what a survivor logs when it had Kafka remove a coordinator whose process was gone
_REMOVED = "had Kafka remove coordinator"


@dataclass(frozen=True)
class Configuration:
    """Member arguments and broker properties of one configuration (no properties: the
    broker of ``_bootstrap`` as it is), and which victims it kills how many times."""

    name: str
    member_args: list[str]
    broker_config: dict[str, str] = field(default_factory=dict)
    describe: str = ""
    victims: tuple[tuple[str, int], ...] = (("coordinator", 1),)


DEFAULT = Configuration("default", MEMBER_ARGS,
                        describe="every setting at its default (session timeout 6000 ms, "
                                 "fast failover on), the broker's defaults",
                        victims=(("member", 1), ("coordinator", COORDINATOR_ROUNDS)))
SESSION = Configuration("session", [*MEMBER_ARGS, "--fast-failover", "off"],
                        describe="--fast-failover off: the session timeout (6000 ms) alone",
                        victims=(("coordinator", COORDINATOR_ROUNDS),))
LOWERED = Configuration(
    "lowered", [*MEMBER_ARGS, "--fast-failover", "off",
                "--session-timeout", str(LOWERED_SESSION_TIMEOUT_MS)],
    {"group.min.session.timeout.ms": str(LOWERED_BROKER_MIN_SESSION_MS)},
    describe=f"--fast-failover off --session-timeout {LOWERED_SESSION_TIMEOUT_MS} on every "
             f"member; a broker of its own with group.min.session.timeout.ms="
             f"{LOWERED_BROKER_MIN_SESSION_MS}")


@dataclass(frozen=True)
class Result:
    resumed_s: float  # from the kill to the first replayed record
    replayed: int
    expelled: int  # false alarms: times a live member was dropped from the group
    removed: int  # dead coordinators survivors had Kafka remove at once


def _bootstrap() -> str:
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if env:
        return env
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support",
                                    "local_kafka"))
    import kafka_local  # noqa: PLC0415 - the project's broker script
    return kafka_local.start_broker()


def _topic(admin: Any, partitions: int = 6) -> str:
    from confluent_kafka.admin import NewTopic
    name = f"failover-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


class _Producer(threading.Thread):
    """Writes RATE records a second, values ``{"seq": n}``, until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic = topic
        self.stop = threading.Event()

    def run(self) -> None:
        seq, start = 0, time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - start) * RATE)
            while seq < due:
                self.producer.produce(self.topic, key=str(seq % 97).encode(),
                                      value=json.dumps({"seq": seq}).encode())
                seq += 1
            self.producer.poll(0)
            time.sleep(0.005)
        self.producer.flush(30)


class _Output(threading.Thread):
    """Reads the sink topic; notes when each sequence number first and again arrived."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10})
        self.consumer.subscribe([topic])
        self.seen: set[int] = set()
        self.replays: list[float] = []  # arrival times of records seen before
        self.last_arrival = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for msg in self.consumer.consume(500, 0.05):
                if msg.error() is not None:
                    continue
                now = time.monotonic()
                seq = json.loads(msg.value())["seq"]
                if seq in self.seen:
                    self.replays.append(now)
                else:
                    self.seen.add(seq)
                self.last_arrival = now
        self.consumer.close()


def _job_file(bootstrap: str, source: str, sink: str) -> str:
    return textwrap.dedent(f"""
        from jetwake import Pipeline, Sinks, Sources
        props = {{"bootstrap.servers": {bootstrap!r}}}
        pipeline = Pipeline()
        (pipeline.read_from(Sources.kafka({source!r}, props, value_deserializer="json"))
            .map(lambda kv: (kv[0], kv[1]))
            .write_to(Sinks.kafka({sink!r}, props, value_serializer="json")))
    """)


def _log_count(cluster: BenchCluster, text: str) -> int:
    """How many times ``text`` occurs in the members' logs."""
    count = 0
    for m in cluster.members:
        try:
            count += m.log_path.read_text(errors="replace").count(text)
        except OSError:
            continue
    return count


def run_once(bootstrap: str, victim: str, member_args: list[str]) -> Result:
    """One kill of the ``victim`` ("member" or "coordinator") in a fresh cluster."""
    from confluent_kafka.admin import AdminClient
    from jetwake import JobConfig
    admin = AdminClient({"bootstrap.servers": bootstrap})
    source, sink = _topic(admin), _topic(admin)
    with BenchCluster(bootstrap, 3, member_args) as cluster:
        namespace: dict = {}
        exec(_job_file(bootstrap, source, sink), namespace)  # noqa: S102 - our own text
        with cluster.client() as client:
            client.new_job(namespace["pipeline"], JobConfig(
                name="failover", processing_guarantee="at_least_once",
                snapshot_interval_ms=INTERVAL_MS))
            info = client.cluster()
        producer, output = _Producer(bootstrap, source), _Output(bootstrap, sink)
        producer.start()
        output.start()
        time.sleep(STEADY_S)  # the job runs steadily: snapshots taken, output flowing
        coordinator = next(m["address"] for m in info["members"] if m["coordinator"])
        target = next(m for m in cluster.members
                      if (m.address == coordinator) == (victim == "coordinator"))
        replays_before = len(output.replays)
        killed = time.monotonic()
        os.kill(target.pid, signal.SIGKILL)
        deadline = killed + 120
        while len(output.replays) == replays_before and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(output.replays) == replays_before:
            raise TimeoutError(f"no replayed record within 120 s of killing the {victim}")
        resumed = output.replays[replays_before] - killed
        time.sleep(3.0)  # the replay finishes
        producer.stop.set()
        producer.join(30)
        time.sleep(1.0)
        output.stop.set()
        output.join(10)
        replayed = len(output.replays) - replays_before
        expelled = _log_count(cluster, _EXPELLED)
        removed = _log_count(cluster, _REMOVED)
    admin.delete_topics([source, sink])
    return Result(resumed, replayed, expelled, removed)


def _run_configuration(config: Configuration, bootstrap: str) -> dict[str, list[Result]]:
    results: dict[str, list[Result]] = {}
    for victim, rounds in config.victims:
        for _ in range(rounds):
            r = run_once(bootstrap, victim, config.member_args)
            results.setdefault(victim, []).append(r)
            figure(f"failover ({config.name}): SIGKILL {victim}", r.resumed_s, "s",
                   f"to processing again ({r.replayed:,} records replayed; {r.expelled} live "
                   f"member(s) expelled; {r.removed} dead coordinator(s) removed at once)")
    return results


def _span(results: list[Result]) -> str:
    values = sorted(r.resumed_s for r in results)
    return f"{values[0]:.2f}" if len(values) == 1 else f"{values[0]:.2f}-{values[-1]:.2f}"


def main() -> None:
    from bench.bench_kafka_peers import _kafka_local, warm_up
    per_interval = RATE * INTERVAL_MS / 1000
    bootstrap = _bootstrap()
    print(f"   {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}", flush=True)
    for config in (DEFAULT, SESSION):
        print(f"   {config.name}: {config.describe}; broker {bootstrap}", flush=True)
    print(f"   {LOWERED.name}: {LOWERED.describe}", flush=True)
    default = _run_configuration(DEFAULT, bootstrap)
    session = _run_configuration(SESSION, bootstrap)
    kl = _kafka_local()
    port = kl.free_port()
    try:
        lowered_bootstrap = kl.start_broker(port, broker_config=LOWERED.broker_config)
        # a fresh broker makes its transaction log at the first init_transactions, which the
        # members' first writes would otherwise wait for (and sometimes trip over)
        warm_up(lowered_bootstrap)
        lowered = _run_configuration(LOWERED, lowered_bootstrap)
    finally:
        kl.stop_broker(port)
    print(f"   load average at the end {os.getloadavg()[0]:.2f}", flush=True)
    fast, slow = default["coordinator"], session["coordinator"]
    mean_fast = sum(r.resumed_s for r in fast) / len(fast)
    mean_slow = sum(r.resumed_s for r in slow) / len(slow)
    print(f"{'failover: SIGKILL coordinator, to processing again':<52} default "
          f"{_span(fast)} s | session timeout only {_span(slow)} s | ratio of the means "
          f"{mean_fast / mean_slow:.2f}  (goal < 3 s at the defaults)", flush=True)
    print(f"{'failover: SIGKILL coordinator, lowered session':<52} "
          f"{_span(lowered['coordinator'])} s  ({LOWERED.describe})", flush=True)
    print(f"{'failover: SIGKILL member, to processing again':<52} "
          f"{_span(default['member'])} s  (any configuration: the session timeout plays no "
          "part)", flush=True)
    replayed = [r.replayed for rs in (fast, slow) for r in rs]
    print(f"{'failover: SIGKILL coordinator, records replayed':<52} "
          f"{min(replayed):,}-{max(replayed):,}  (one snapshot interval holds "
          f"{per_interval:,.0f} at {RATE}/s)", flush=True)


if __name__ == "__main__":
    main()
