"""The dead-letter output of the Kafka source: records that cannot be deserialized.

A bad record is written, with its original key and value bytes untouched, to the dead-letter
topic; its headers say why and where it came from (``jetwake.error``, ``jetwake.topic``,
``jetwake.partition``, ``jetwake.offset``, ``jetwake.timestamp``, after the record's own
headers). The producer is idempotent and flushed before the source's offsets go into a
snapshot, so a dead-lettered record is never lost; after a restart it may be written again
(at-least-once), which a reader of the dead-letter topic tolerates by the (topic, partition,
offset) in its headers.
"""

from __future__ import annotations

import logging
from typing import Any

from jetwake.connectors.kafka.client_log import with_client_log

__all__ = ["DeadLetterWriter"]

log = logging.getLogger("jetwake.kafka")


class DeadLetterWriter:
    def __init__(self, topic: str, properties: dict) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.count = 0
        self._errors: list[str] = []
        conf = {k: v for k, v in properties.items() if k in _PRODUCER_SAFE or
                k.startswith(("security.", "sasl.", "ssl.", "client."))}
        conf.update({"enable.idempotence": True, "linger.ms": 5,
                     "delivery.report.only.error": True, "on_delivery": self._on_delivery})
        self._producer = Producer(with_client_log(conf))

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{err}")

    def write(self, msg: Any, error: BaseException) -> None:
        headers = list(msg.headers() or ())
        ts = msg.timestamp()[1]
        headers += [
            ("jetwake.error", f"{type(error).__name__}: {error}"[:2000].encode()),
            ("jetwake.topic", msg.topic().encode()),
            ("jetwake.partition", str(msg.partition()).encode()),
            ("jetwake.offset", str(msg.offset()).encode()),
            ("jetwake.timestamp", str(ts).encode()),
        ]
        while True:
            try:
                self._producer.produce(self.topic, value=msg.value(), key=msg.key(),
                                       headers=headers)
                break
            except BufferError:
                self._producer.poll(0.05)
        self.count += 1
        self._producer.poll(0)

    def acknowledged(self) -> bool:
        """Whether every dead letter written so far is acknowledged, without waiting; raises
        if one could not be written."""
        left = self._producer.flush(0)
        if self._errors:
            self._raise(left)
        return left == 0

    def _raise(self, left: int) -> None:
        errs, self._errors = self._errors, []
        from jetwake.engine.core.errors import RestartableError
        raise RestartableError(
            f"writing to the dead-letter topic {self.topic!r} failed "
            f"({left} not acknowledged): {errs[:3]}")

    def flush(self, timeout: float = 60.0) -> None:
        """Waits until every dead letter is acknowledged; raises if one could not be."""
        left = self._producer.flush(timeout)
        if self._errors or left:
            self._raise(left)

    def close(self) -> None:
        try:
            self._producer.flush(10)
        except Exception:  # noqa: BLE001 - closing after a failure
            log.debug("dead-letter producer flush on close failed", exc_info=True)


_PRODUCER_SAFE = {"bootstrap.servers", "metadata.broker.list", "client.id",
                  "socket.timeout.ms", "reconnect.backoff.ms", "reconnect.backoff.max.ms",
                  "broker.address.family", "api.version.request"}
