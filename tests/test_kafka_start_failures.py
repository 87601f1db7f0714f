"""Why a Kafka job cannot start decides what the engine does: brokers that do not answer may
come back (the start is retried with back-off), a missing topic is the user's to fix (the job
fails at once, naming the topic)."""

from __future__ import annotations

import pytest

from jetwake import JobConfig, Member, Pipeline, Sinks, Sources
from jetwake.connectors.kafka.source import KafkaSourceError
from jetwake.engine.core.errors import is_restartable_cause

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _start_error(bootstrap: str, topic: str) -> KafkaSourceError:
    p = Pipeline()
    p.read_from(Sources.kafka(topic, {"bootstrap.servers": bootstrap,
                                      "jetwake.startup.timeout.ms": 2000})) \
        .write_to(Sinks.noop())
    with Member() as m:
        with pytest.raises(KafkaSourceError) as ei:
            m.new_job(p, JobConfig())
    return ei.value


def test_brokers_that_do_not_answer_are_a_restartable_cause():
    error = _start_error("127.0.0.1:1", "anything")
    assert "did not answer" in str(error)
    assert is_restartable_cause(error)


def test_a_missing_topic_is_a_permanent_cause_named_in_the_error(kafka_bootstrap):
    error = _start_error(kafka_bootstrap, "no-such-topic-4711")
    assert "no-such-topic-4711" in str(error) and "do not exist" in str(error)
    assert not is_restartable_cause(error)
