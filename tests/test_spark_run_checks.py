"""What SparkRunner.run checks before it starts Spark: the master URL, and what each file and
Kafka source will read (a wrong path, a missing topic, offsets that do not fit the topic), so
that each fails with its own message and no Spark session is started."""

from __future__ import annotations

import pytest

from jetwake import Member, Pipeline, Sinks, Sources, SparkRunner
from jetwake.connectors.kafka.spark import BackfillKafkaError

pytestmark = [pytest.mark.spark]


@pytest.mark.parametrize("master", [
    "local", "local[2]", "local[*]", "local[2,3]", "local[*, 2]", "local-cluster[2,1,1024]",
    "spark://127.0.0.1:7077", "spark://a.example:7077,b.example:7077", "k8s://https://h:6443",
    "k8s://h:6443"])
def test_a_master_url_spark_accepts_is_taken(master):
    assert SparkRunner(master=master).master == master


@pytest.mark.parametrize("master,message", [
    ("foo", "'foo' is not a Spark master URL: use local, local[N]"),
    ("local[abc]", "is not a Spark master URL"),
    ("local[0]", "a local master runs at least 1 thread"),
    ("spark://host", "'host' is not HOST:PORT"),
    ("k8s://ftp://host", "a Kubernetes master is k8s://https://HOST:PORT"),
    ("sc://host:15002", "is a Spark Connect address, not a master URL"),
])
def test_a_malformed_master_url_is_refused_naming_the_forms(master, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SparkRunner(master=master)


def test_yarn_without_its_configuration_is_refused(monkeypatch):
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    with pytest.raises(ValueError, match="HADOOP_CONF_DIR or YARN_CONF_DIR"):
        SparkRunner(master="yarn")


def _kafka_pipeline(bootstrap: str, topic: str) -> Pipeline:
    p = Pipeline()
    p.read_from(Sources.kafka(topic, {"bootstrap.servers": bootstrap})).write_to(Sinks.noop())
    return p


def test_a_missing_file_fails_before_spark_starts(tmp_path):
    p = Pipeline()
    p.read_from(Sources.json_lines(str(tmp_path / "missing.jsonl"))).write_to(Sinks.noop())
    runner = SparkRunner(master="local[1]")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        runner.run(p)
    assert runner._spark is None


@pytest.mark.kafka
def test_a_missing_topic_fails_before_spark_starts(kafka_bootstrap):
    runner = SparkRunner(master="local[1]")
    with pytest.raises(BackfillKafkaError, match="'no-such-topic-for-checks'.* do not exist"):
        runner.run(_kafka_pipeline(kafka_bootstrap, "no-such-topic-for-checks"))
    assert runner._spark is None


@pytest.mark.kafka
def test_until_offsets_beyond_the_end_of_a_partition_are_refused(kafka_bootstrap,
                                                                  kafka_topic):
    topic = kafka_topic(partitions=1)
    runner = SparkRunner(master="local[1]")
    with pytest.raises(ValueError, match="offset 10 of partition 0 .* lies beyond its end "
                                         r"\(0\)"):
        runner.run(_kafka_pipeline(kafka_bootstrap, topic), until={topic: {0: 10}})
    assert runner._spark is None


@pytest.mark.kafka
def test_until_offsets_for_a_topic_no_source_reads_are_refused(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=1)
    runner = SparkRunner(master="local[1]")
    with Member() as m, pytest.raises(ValueError, match=r"\['typo'\], which no Kafka source"):
        runner.run(_kafka_pipeline(kafka_bootstrap, topic), until={topic: {0: 0}, "typo": {0: 1}},
                   member=m)
    assert runner._spark is None
