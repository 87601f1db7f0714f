"""``Sources.kafka_table``: a table kept current by a compacted Kafka topic.

The source is the Kafka source (:class:`KafkaSourceProcessor`: partition assignment, offsets in
snapshots, deserialization, metadata retries) reading one topic from its beginning, with two
additions:

- It checks the topic when the job starts: a missing topic fails the job with the command that
  creates it compacted; a topic whose ``cleanup.policy`` is not ``compact`` logs a warning
  naming the topic and the fix (Kafka would delete old values by age, and a restart would
  rebuild a table missing keys).
- On a first start it notes the end offsets of its partitions and, once it has read up to them,
  emits the "table ready" markers a ``join_table`` with ``bootstrap=True`` waits for
  (engine/processors/table_join.py explains the protocol); a restored source emits them at
  once. It lets no snapshot barrier pass before its markers: ``save_to_snapshot`` reads on
  until they are out.

Its output is a changelog of ``(key, value)`` (a tombstone has the value None): a join_table
reads it with its markers, any other stage as plain ``(key, value)`` items (the planner drops
the markers on the way, ``ItemForm.TABLE_CHANGELOG``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from jetwake.engine.core.processor import ProcessorContext
from jetwake.engine.processors.table_join import ready_markers
from jetwake.connectors.kafka.source import KafkaSourceProcessor

__all__ = ["KafkaTableSourceProcessor", "check_compacted", "admin_properties"]

log = logging.getLogger("jetwake.kafka")

_ADMIN_PREFIXES = ("bootstrap.", "security.", "sasl.", "ssl.", "client.", "socket.",
                   "broker.", "api.version")


def admin_properties(properties: dict) -> dict:
    """The connection settings of consumer ``properties``, for an admin client."""
    return {k: v for k, v in properties.items() if k.startswith(_ADMIN_PREFIXES)}


def check_compacted(admin: Any, topic: str, where: str, timeout: float = 10.0) -> bool:
    """Whether ``topic``'s ``cleanup.policy`` includes ``compact``; logs a warning naming the
    topic and the fix when it does not."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout)
    entry = configs.get("cleanup.policy")
    policy = entry.value if entry is not None else "delete"
    if "compact" in str(policy).split(","):
        return True
    log.warning(
        "%s: topic %r has cleanup.policy=%s, not compact: Kafka deletes its old records by age, "
        "so a restarted job would rebuild a table missing the keys not written lately. Make it "
        "compacted: kafka-configs --alter --add-config cleanup.policy=compact --entity-type "
        "topics --entity-name %s --bootstrap-server HOST:PORT (or create it compacted: "
        "kafka-topics --create --config cleanup.policy=compact)", where, topic, policy, topic)
    return False


class KafkaTableSourceProcessor(KafkaSourceProcessor):
    """See the module docstring."""

    where = "Sources.kafka_table()"

    def __init__(self, topic: str, properties: dict, options: dict,
                 key_deserializer: Callable | None, value_deserializer: Callable | None
                 ) -> None:
        # the end of a partition is reported (a transaction's last marker has an offset but
        # no record: the position may stop short of the end offset)
        super().__init__([topic], {**properties, "enable.partition.eof": True}, options,
                         key_deserializer, value_deserializer, "earliest", None, "fail", None)
        self.at_end: set[tuple[str, int]] = set()
        self.missing_topic_fix = (
            f"create it compacted: kafka-topics --bootstrap-server HOST:PORT --create "
            f"--topic {topic} --config cleanup.policy=compact")
        self.ends: dict[tuple[str, int], tuple[int, int]] = {}
        self.ready_sent = False

    def init(self, context: ProcessorContext) -> None:
        super().init(context)  # fails with missing_topic_fix when the topic is missing
        owned = [(t, p) for t in self.topics for p in range(self.counts[t]) if self._owns(t, p)]
        self.ends = self._end_offsets(owned)
        if context.global_processor_index == 0:
            from confluent_kafka.admin import AdminClient
            from jetwake.connectors.kafka.client_log import with_client_log
            admin = AdminClient(with_client_log(admin_properties(self.properties)))
            try:
                check_compacted(admin, self.topics[0], self.where)
            except Exception as e:  # noqa: BLE001 - the check must not stop a job that can run
                log.warning("%s: could not read the cleanup.policy of topic %r: %s",
                            self.where, self.topics[0], e)

    def _end_offsets(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int],
                                                              tuple[int, int]]:
        """``(low, high)`` watermark offsets of ``tps`` as of now: the table to read first."""
        from confluent_kafka import TopicPartition

        out = {}
        for t, p in tps:
            out[(t, p)] = self._retry(lambda: self.consumer.get_watermark_offsets(
                TopicPartition(t, p), timeout=5.0))
        return out

    def _caught_up(self) -> bool:
        """Whether every partition read here is read up to its end offset noted at the start
        (always after a restore, see engine/processors/table_join.py)."""
        if self.was_restored:
            return True
        pending = [tp for tp in self.owned if tp in self.ends and tp not in self.at_end
                   and self.ends[tp][1] > self.ends[tp][0]]
        if not pending:
            return True
        from confluent_kafka import TopicPartition

        positions = self.consumer.position([TopicPartition(t, p) for t, p in pending])
        return all(tpo.offset >= self.ends[(tpo.topic, tpo.partition)][1]
                   for tpo in positions)

    def _handle_errors(self, errored: list) -> None:
        if not self.ready_sent:
            from confluent_kafka import KafkaError
            for m in errored:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    self.at_end.add((m.topic(), m.partition()))
        super()._handle_errors(errored)

    def _send_ready(self) -> None:
        if self.ready_sent or not self.started or not self._caught_up():
            return
        if self.outbox.offer_chunk(-1, list(ready_markers(self.index, self.total))):
            self.ready_sent = True
            log.debug("%s#%d: table read to its end offsets", self.context.vertex_name,
                      self.index)

    def complete(self) -> bool:
        super().complete()  # a stream: never done
        if not self.ready_sent:
            self._send_ready()
        return False

    def save_to_snapshot(self) -> bool:
        if not self.ready_sent:
            # no barrier before the markers: read on (the records go before the barrier)
            if not self.started:
                self._start()
            self.complete()
            if not self.ready_sent:
                return False
        return super().save_to_snapshot()
