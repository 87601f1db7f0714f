"""pytest plugin: a real Kafka broker for integration tests.

Loaded from tests/conftest.py (``pytest_plugins = ["support.kafka_broker"]``). Fixtures:

``kafka_bootstrap`` (session)
    A bootstrap-servers string, from the first of these that works:

    1. ``$KAFKA_BOOTSTRAP_SERVERS`` if set (an external broker; used as is);
    2. testcontainers' ``KafkaContainer`` if a Docker engine answers;
    3. a local KRaft broker started by tests/support/local_kafka/kafka_local.py on a free loopback
       port (jars fetched with Maven on first use), stopped at the end of the session.

    If none of them can be had the requesting tests fail (they are never skipped).

``kafka_topic`` (function)
    A factory ``new_topic(partitions=1, replication_factor=1) -> name`` that creates a
    uniquely named topic and waits until its metadata shows a leader for every partition.
    The topics are deleted afterwards (best effort).

``kafka_three_brokers`` (session)
    A separate Kafka cluster of three KRaft brokers: ``$KAFKA3_BOOTSTRAP_SERVERS`` if set,
    else started by kafka_local.py with ``--nodes 3`` on free loopback ports (about 9 s);
    started only by the tests that ask for it, stopped at the end of the session. Its value is
    a :class:`ThreeBrokers`: ``bootstrap``, and ``new_topic()`` for topics with 3 replicas and
    ``min.insync.replicas`` 2.
"""
from __future__ import annotations

import contextlib
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.local_runners import load_runner
from support.local_runners import watch_for_orphaning as orphan_watch
from support.waiting import wait_until

_KAFKA_LOCAL = Path(__file__).resolve().parent / "local_kafka" / "kafka_local.py"

#: What the tests' own brokers set over kafka_local's defaults, for a test's pace: the log
#: cleaner looks for work every second (Kafka's 15 s made a compaction test wait on it), and a
#: consumer group accepts a session timeout down to 1 s (Kafka's floor is 6 s), so that a test
#: that waits for a session to time out sets a short one (``session_timeout_ms``).
TEST_BROKER_CONFIG = {"log.cleaner.backoff.ms": 1000, "group.min.session.timeout.ms": 1000}

#: The session timeout a test that waits for one gives its members: half Kafka's 6 s default,
#: still six heartbeats and well above a loaded machine's pauses.
SHORT_SESSION_TIMEOUT_MS = 3000


def _kafka_local():
    """Import tests/support/local_kafka/kafka_local.py (its folder is not a package)."""
    return load_runner(_KAFKA_LOCAL)


def _docker_answers(timeout: float = 2.0) -> bool:
    try:
        import docker

        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except BaseException:  # noqa: BLE001 - no SDK, no socket, refused, timeout...: no Docker
        return False


def _start_container():
    from testcontainers.kafka import KafkaContainer

    container = KafkaContainer().with_kraft()
    for key, value in TEST_BROKER_CONFIG.items():
        container.with_env("KAFKA_" + key.upper().replace(".", "_"), str(value))
    container.start()
    return container


@pytest.fixture(scope="session")
def kafka_bootstrap():
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if env:
        yield env
        return

    errors: list[str] = []
    if _docker_answers():
        try:
            container = _start_container()
        except Exception as e:  # noqa: BLE001 - fall through to the local broker
            errors.append(f"testcontainers KafkaContainer: {type(e).__name__}: {e}")
        else:
            try:
                yield container.get_bootstrap_server()
            finally:
                container.stop()
            return
    else:
        errors.append("no Docker engine answers (testcontainers not used)")

    kl = _kafka_local()
    port = kl.free_port()
    bootstrap = None
    try:
        bootstrap = kl.start_broker(port, broker_config=TEST_BROKER_CONFIG)
    except Exception as e:  # noqa: BLE001
        errors.append(f"local broker (tests/support/local_kafka/kafka_local.py) on port {port}: "
                      f"{type(e).__name__}: {e}")
        kl.stop_broker(port)
    if bootstrap is None:
        pytest.fail("no Kafka broker available for the kafka tests:\n  - "
                    + "\n  - ".join(errors)
                    + "\nSet KAFKA_BOOTSTRAP_SERVERS to use an existing broker.", pytrace=False)
    watch_for_orphaning(port)
    try:
        yield bootstrap
    finally:
        kl.stop_broker(port)


def watch_for_orphaning(port: int) -> None:
    """Stops a broker that kafka_local started on ``port`` (the session's, or a test module's
    own) if this pytest process dies without its teardown."""
    orphan_watch(_KAFKA_LOCAL, "stop_broker", port)


def session_timeout_ms(bootstrap: str, wanted: int = SHORT_SESSION_TIMEOUT_MS) -> int:
    """``wanted``, or the broker's ``group.min.session.timeout.ms`` where that is higher (an
    external broker at Kafka's defaults refuses a session timeout below 6 s): the session
    timeout of a test's members when what it waits for is a session timing out."""
    from confluent_kafka.admin import ConfigResource

    admin = _admin(bootstrap)
    broker = min(admin.list_topics(timeout=10).brokers)
    resource = ConfigResource(ConfigResource.Type.BROKER, str(broker))
    floor = admin.describe_configs([resource])[resource].result(timeout=10)[
        "group.min.session.timeout.ms"].value
    return max(wanted, int(floor))


def _admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def wait_for_topic(admin, name: str, partitions: int, timeout: float = 30.0) -> None:
    """Returns once a topic just created has its ``partitions``, each with a leader: before,
    a producer or a job may find it missing."""
    def ready() -> bool:
        try:
            md = admin.list_topics(topic=name, timeout=5).topics.get(name)
        except Exception:  # noqa: BLE001 - transient while the topic is being created
            return False
        return (md is not None and md.error is None and len(md.partitions) == partitions
                and all(p.leader >= 0 for p in md.partitions.values()))
    wait_until(ready, timeout=timeout, interval=0.1,
               what=f"topic {name!r} with a leader for each of its {partitions} partitions")


@pytest.fixture
def kafka_topic(kafka_bootstrap, request):
    from confluent_kafka.admin import NewTopic

    admin = _admin(kafka_bootstrap)
    created: list[str] = []
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:60]

    def new_topic(partitions: int = 1, replication_factor: int = 1) -> str:
        name = f"jetwake-{base}-{uuid.uuid4().hex[:10]}"
        # no retention by time: tests produce records with fixed event times years in the
        # past, which a broker's retention check would otherwise delete in the middle of a test
        fut = admin.create_topics([NewTopic(name, num_partitions=partitions,
                                            replication_factor=replication_factor,
                                            config={"retention.ms": "-1"})],
                                  operation_timeout=30)[name]
        fut.result(timeout=60)
        created.append(name)
        wait_for_topic(admin, name, partitions)
        return name

    yield new_topic

    if created:
        try:
            for fut in admin.delete_topics(created, operation_timeout=30).values():
                fut.result(timeout=30)
        except Exception:  # noqa: BLE001 - cleanup only
            pass


@dataclass
class ThreeBrokers:
    """The three-broker Kafka cluster of ``kafka_three_brokers``."""

    bootstrap: str

    def new_topic(self, prefix: str = "jetwake-3b", partitions: int = 1) -> str:
        """Creates a uniquely named topic with 3 replicas and ``min.insync.replicas`` 2 and
        waits until each partition has a leader."""
        from confluent_kafka.admin import NewTopic

        admin = _admin(self.bootstrap)
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=3,
                                      config={"min.insync.replicas": "2",
                                              "retention.ms": "-1"})],
                            operation_timeout=30)[name].result(timeout=60)
        wait_for_topic(admin, name, partitions)
        return name


@pytest.fixture(scope="session")
def kafka_three_brokers():
    env = os.environ.get("KAFKA3_BOOTSTRAP_SERVERS", "").strip()
    if env:
        yield ThreeBrokers(env)
        return
    kl = _kafka_local()
    port = kl.free_port(3)
    try:
        bootstrap = kl.start_broker(port, nodes=3)
    except Exception as e:  # noqa: BLE001
        kl.stop_broker(port)
        pytest.fail(f"no three-broker Kafka for the tests that need one: "
                    f"tests/support/local_kafka/kafka_local.py --nodes 3 on port {port}: "
                    f"{type(e).__name__}: {e}", pytrace=False)
    watch_for_orphaning(port)
    try:
        yield ThreeBrokers(bootstrap)
    finally:
        # its data is deleted anyway: the brokers get 2 s to stop before SIGKILL instead of
        # waiting (about 6 s) for the last one's controlled shutdown without a quorum
        kl.stop_broker(port, timeout=2.0)


@contextlib.contextmanager
def private_broker(topics: tuple[str, ...] = ("in", "out"), partitions: int = 2):
    """A broker of the test's own (one node, started by kafka_local on a free port), for a
    test that stops or restarts it, with ``topics`` created: yields ``(kafka_local, port,
    bootstrap)`` and stops the broker at the end, whatever the test did to it."""
    from confluent_kafka.admin import AdminClient, NewTopic

    kl = _kafka_local()
    port = kl.free_port()
    bootstrap = kl.start_broker(port)
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
            f.result(30)
        yield kl, port, bootstrap
    finally:
        kl.stop_broker(port)
