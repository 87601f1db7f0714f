"""Creating the cluster's Kafka topics: one way for all of them (control, records, snapshot
data, maps, lists).

Each topic is replicated to as many brokers as the member's ``internal_topic_replication``
says, by default to up to three (as many as the Kafka cluster has), and a write needs all
replicas but one in sync (so one broker may fail without losing or refusing anything). Members
start together, so two of them creating the same topic at once is normal, not an error. A
member warns at start when the cluster's topics have a single replica: a broker's loss would
lose the cluster's records and snapshots.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from jetwake.engine.core.errors import JetwakeError

__all__ = ["TOPIC_MAX_MESSAGE_BYTES", "create_topic", "replication_for", "durable_config",
           "check_internal_topic_replication", "single_replica_topics",
           "warn_if_single_replica", "SINK_MARKERS_TOPIC"]

log = logging.getLogger("jetwake.cluster")

#: the largest record the cluster's topics take (chunks of values and snapshot files)
TOPIC_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
#: the exactly-once Kafka sinks' markers topic by default (connectors/kafka/properties.py)
SINK_MARKERS_TOPIC = "__jetwake_sink_markers"


def check_internal_topic_replication(value: Any) -> int | None:
    """Checks the member setting ``internal_topic_replication``: None (as many replicas as
    the brokers allow, up to three) or an int >= 1."""
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise ValueError(f"internal_topic_replication must be an int >= 1 (the replicas of "
                         f"each of the cluster's topics), or None for as many as the Kafka "
                         f"cluster has brokers, up to 3; got {value!r}")
    return value


def replication_for(brokers: int, setting: int | None = None) -> int:
    """The replication factor of a new cluster topic on a Kafka cluster of ``brokers``
    brokers: ``setting`` (the member's ``internal_topic_replication``) when given, else
    min(3, brokers). A setting the brokers cannot meet fails with what to do."""
    if setting is None:
        return max(1, min(3, brokers))
    if setting > brokers:
        raise JetwakeError(f"internal_topic_replication={setting}, but the Kafka cluster has "
                           f"{brokers} broker(s): set internal_topic_replication to at most "
                           f"{brokers} (or leave it unset), or add brokers")
    return setting


def durable_config(replication: int) -> dict[str, str]:
    """The topic settings every cluster topic with data shares."""
    return {"min.insync.replicas": str(max(1, replication - 1)),
            "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)}


def create_topic(admin: AdminClient, topic: str, partitions: int, replication: int,
                 config: dict[str, str] | None = None, timeout: float = 30.0) -> None:
    """Creates ``topic``; one that another member created meanwhile is left as it is."""
    futures = admin.create_topics([NewTopic(topic, partitions, replication,
                                            config=config or {})],
                                  operation_timeout=timeout)
    try:
        futures[topic].result(timeout)
    except KafkaException as e:
        if e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        raise JetwakeError(f"could not create the topic {topic}: {e.args[0].str()}") from e
    log.info("created the topic %s (%d partitions, replication %d)", topic, partitions,
             replication)


def single_replica_topics(admin: AdminClient, cluster: str, known: list[str],
                          timeout: float = 30.0) -> list[str]:
    """The cluster's topics (and the sink markers topic) that have a partition with a single
    replica, sorted: the topics ``known`` to exist (asked for by name until the metadata
    shows them: a topic just created on one broker is not at once in every broker's
    metadata), and any other of the cluster's topics the metadata shows."""
    md = admin.list_topics(timeout=timeout)
    prefix = f"__jetwake_{cluster}_"
    found = {name: t for name, t in md.topics.items()
             if (name.startswith(prefix) or name == SINK_MARKERS_TOPIC)
             and t.error is None and t.partitions}
    deadline = time.monotonic() + timeout
    for name in known:
        while name not in found and time.monotonic() < deadline:
            t = admin.list_topics(topic=name, timeout=timeout).topics.get(name)
            if t is not None and t.error is None and t.partitions:
                found[name] = t
            else:
                time.sleep(0.05)
    return sorted(name for name, t in found.items()
                  if any(len(p.replicas) < 2 for p in t.partitions.values()))


def warn_if_single_replica(admin: AdminClient, cluster: str, known: list[str],
                           timeout: float = 30.0) -> None:
    """Logs a warning naming the cluster's topics with a single replica, and the fix."""
    topics = single_replica_topics(admin, cluster, known, timeout)
    if topics:
        log.warning("the topics %s of cluster '%s' have a single replica: losing that Kafka "
                    "broker loses the cluster's job records, snapshots and maps. Run Kafka "
                    "with 3 brokers (new topics then take 3 replicas; set "
                    "internal_topic_replication=3 to insist on it), and raise the replication "
                    "of these existing topics with kafka-reassign-partitions",
                    ", ".join(topics), cluster)
