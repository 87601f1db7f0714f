"""Clicks per user from a Kafka topic: the job docs/backfill.md backfills on Spark from the
command line, then streams from the hand-off snapshot.

    python examples/clicks.py 127.0.0.1:9092 2000   # a new topic, 2,000 clicks; prints its name
    jetwake backfill examples/clicks.py --export-snapshot clicks-backfill -- 127.0.0.1:9092 TOPIC
    jetwake submit examples/clicks.py --from-snapshot clicks-backfill -- 127.0.0.1:9092 TOPIC

As a pipeline file, `pipeline(args)` takes the broker and the topic after `--`. Run as a script,
it writes that many clicks (key: the user, value: the page as JSON) into a new topic of two
partitions, or into the topic given as a third argument, and prints the topic's name.
"""

from __future__ import annotations

import json
import sys
import uuid

from jetwake import AggregateOperations, Pipeline, Sinks, Sources

USERS = 10


def pipeline(args: list[str]) -> Pipeline:
    """Each user's clicks so far (a rolling count), in the member's map "clicks-per-user"."""
    bootstrap, topic = args
    p = Pipeline()
    (p.read_from(Sources.kafka(topic, {"bootstrap.servers": bootstrap},
                               key_deserializer="str", value_deserializer="json"))
      .group_by(lambda click: click[0])
      .rolling_aggregate(AggregateOperations.counting())
      .write_to(Sinks.map("clicks-per-user")))
    return p


def produce_clicks(bootstrap: str, n: int, topic: str | None = None) -> str:
    """Writes ``n`` clicks into ``topic`` (a new topic of two partitions when None); returns
    the topic's name."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    props = {"bootstrap.servers": bootstrap}
    if topic is None:
        topic = f"clicks-{uuid.uuid4().hex[:8]}"
        admin = AdminClient(props)   # kept until the topic exists: its futures need it
        admin.create_topics([NewTopic(topic, 2)])[topic].result()
    producer = Producer(props)
    for i in range(n):
        producer.produce(topic, key=f"user-{i % USERS}", value=json.dumps({"page": i % 7}),
                         partition=i % 2)
        producer.poll(0)
    if producer.flush(30) != 0:
        raise RuntimeError(f"clicks not delivered to {topic} on {bootstrap}")
    return topic


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python examples/clicks.py BOOTSTRAP N [TOPIC]")
    print(produce_clicks(sys.argv[1], int(sys.argv[2]), *sys.argv[3:]))
