"""Creating the cluster's Kafka topics: one way for all of them (control, records, snapshot
data, maps, lists).

Each topic is replicated to up to three brokers, and a write needs all replicas but one in
sync (so one broker may fail without losing or refusing anything). Members start together, so
two of them creating the same topic at once is normal, not an error.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from jetwake.engine.core.errors import JetwakeError

__all__ = ["TOPIC_MAX_MESSAGE_BYTES", "create_topic", "replication_for", "durable_config"]

log = logging.getLogger("jetwake.cluster")

#: the largest record the cluster's topics take (chunks of values and snapshot files)
TOPIC_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


def replication_for(brokers: int) -> int:
    """The replication factor of a new topic on a Kafka cluster of ``brokers`` brokers."""
    return min(3, brokers)


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
