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

Run for a member other than the coordinator and for the coordinator itself, in two
configurations, printed side by side:

- *default*: the members' default session timeout (6000 ms), on the broker of
  ``KAFKA_BOOTSTRAP_SERVERS`` (else one kafka_local starts);
- *lowered*: ``--session-timeout LOWERED_SESSION_TIMEOUT_MS`` on every member, on a broker of
  its own (kafka_local, a free loopback port, stopped at the end) whose
  ``group.min.session.timeout.ms`` is lowered to ``LOWERED_BROKER_MIN_SESSION_MS``: Kafka
  refuses a member whose session timeout is below that minimum (6000 ms by default).

A member the group expelled although it was alive (a false alarm: paused or starved longer
than the session timeout) says so in its log; the count is printed with each run.
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
LOWERED_SESSION_TIMEOUT_MS = 2000
LOWERED_BROKER_MIN_SESSION_MS = 1000
# what a member logs, once each time, when the group expelled it while it was alive
_EXPELLED = "joins again as a new member"


@dataclass(frozen=True)
class Configuration:
    """Member arguments and broker properties of one configuration (no properties: the
    broker of ``_bootstrap`` as it is)."""

    name: str
    member_args: list[str]
    broker_config: dict[str, str] = field(default_factory=dict)
    describe: str = ""


DEFAULT = Configuration("default", MEMBER_ARGS,
                        describe="the members' session timeout, 6000 ms")
LOWERED = Configuration(
    "lowered", [*MEMBER_ARGS, "--session-timeout", str(LOWERED_SESSION_TIMEOUT_MS)],
    {"group.min.session.timeout.ms": str(LOWERED_BROKER_MIN_SESSION_MS)},
    describe=f"--session-timeout {LOWERED_SESSION_TIMEOUT_MS} on every member; a broker of "
             f"its own with group.min.session.timeout.ms={LOWERED_BROKER_MIN_SESSION_MS}")


@dataclass(frozen=True)
class Result:
    resumed_s: float  # from the kill to the first replayed record
    replayed: int
    expelled: int  # false alarms: times a live member was dropped from the group


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


def _expulsions(cluster: BenchCluster) -> int:
    count = 0
    for m in cluster.members:
        try:
            text = m.log_path.read_text(errors="replace")
        except OSError:
            continue
        count += text.count(_EXPELLED)
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
        expelled = _expulsions(cluster)
    admin.delete_topics([source, sink])
    return Result(resumed, replayed, expelled)


def _side_by_side(name: str, default: float, lowered: float, unit: str, fmt: str,
                  note: str) -> None:
    """``name  default X unit | lowered Y unit | ratio R  note`` (R = lowered / default)."""
    ratio = lowered / default if default else float("nan")
    print(f"{name:<50} default {default:>7{fmt}} {unit} | lowered {lowered:>7{fmt}} {unit} | "
          f"ratio {ratio:.2f}  {note}", flush=True)


def _run_configuration(config: Configuration, bootstrap: str) -> dict[str, Result]:
    results = {}
    for victim in ("member", "coordinator"):
        r = results[victim] = run_once(bootstrap, victim, config.member_args)
        figure(f"failover ({config.name}): SIGKILL {victim}", r.resumed_s, "s",
               f"to processing again ({r.replayed:,} records replayed; {r.expelled} live "
               "member(s) expelled)")
    return results


def main() -> None:
    from bench.bench_kafka_peers import _kafka_local, warm_up
    per_interval = RATE * INTERVAL_MS / 1000
    bootstrap = _bootstrap()
    print(f"   {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}", flush=True)
    print(f"   default: {DEFAULT.describe}; broker {bootstrap}", flush=True)
    print(f"   lowered: {LOWERED.describe}", flush=True)
    default = _run_configuration(DEFAULT, bootstrap)
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
    for victim in ("member", "coordinator"):
        d, lo = default[victim], lowered[victim]
        _side_by_side(f"failover: SIGKILL {victim}, to processing again", d.resumed_s,
                      lo.resumed_s, "s", ".2f", "(goal < 10 s)")
        _side_by_side(f"failover: SIGKILL {victim}, records replayed", d.replayed,
                      lo.replayed, "records", ",.0f",
                      f"(one snapshot interval holds {per_interval:,.0f} at {RATE}/s)")


if __name__ == "__main__":
    main()
