"""Validation of the librdkafka properties given to the Kafka source and sinks.

Mistakes are reported when the pipeline is built, with the property name and what to do
instead. Keys starting with ``jetwake.`` are options of the connector itself (see
docs/kafka.md) and are removed before the dict reaches librdkafka.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["check_common", "source_properties", "sink_properties", "split_options",
           "KafkaConfigError", "SOURCE_OPTIONS", "SINK_OPTIONS"]

# connector options (not librdkafka properties) and their defaults
SOURCE_OPTIONS = {
    "jetwake.startup.timeout.ms": 60_000,      # broker unreachable at start: fail after this
    # brokers that answered nothing for this long, across the job's restarts, fail the job
    # (reachability.py); 0: retry without a bound
    "jetwake.unreachable.timeout.ms": 600_000,
    "jetwake.partition.discovery.ms": 5_000,   # how often new partitions are looked for
    "jetwake.poll.batch": 2048,                # messages asked of one consume() call
    "jetwake.poll.timeout.ms": 20,             # accepted, no longer used: consume() never waits
    # accepted, no longer used: event time per partition is the timestamp stage's, run in the
    # source (its allowed_lag and idle_timeout)
    "jetwake.idle.timeout.ms": 30_000,
    "jetwake.watermark.lag.ms": 0,
}
# librdkafka consumer settings the source uses unless the properties set them (measured with
# bench/bench_kafka_peers.py; docs/performance.md has the figures)
SOURCE_CONSUMER_DEFAULTS = {
    # librdkafka waits this long before fetching again for a partition whose local queue was
    # over its thresholds (default 1000 ms): the source then drains the queue and sits idle
    # for the rest of the second. 10 ms keeps the queue fed without the busy re-checking of 0.
    "fetch.queue.backoff.ms": 10,
}
SINK_OPTIONS = {
    "jetwake.startup.timeout.ms": 60_000,
    "jetwake.commit.retry.timeout.ms": 120_000,  # a phase-2 commit retries this long
    "jetwake.fence.parallelism": 0,             # fence transactional ids up to this index
    "jetwake.markers.topic": "__jetwake_sink_markers",  # exactly-once markers (compacted)
    "jetwake.unreachable.timeout.ms": 600_000,  # as the source's (reachability.py)
}

_TRUE = ("true", "1", "yes")
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


class KafkaConfigError(ValueError):
    """The properties given to a Kafka connector are not usable; the message says why."""


def _as_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in _TRUE


def check_common(properties: Any, where: str) -> dict:
    if properties is None or not isinstance(properties, dict):
        raise KafkaConfigError(
            f"{where}: properties must be a dict of librdkafka settings such as "
            f"{{'bootstrap.servers': 'host:9092'}}, got {type(properties).__qualname__}")
    bad = [k for k in properties if not isinstance(k, str)]
    if bad:
        raise KafkaConfigError(f"{where}: property names must be strings, got {bad!r}")
    servers = properties.get("bootstrap.servers") or properties.get("metadata.broker.list")
    if not servers or not isinstance(servers, str) or not servers.strip():
        raise KafkaConfigError(
            f"{where}: 'bootstrap.servers' is missing: give the brokers as "
            "{'bootstrap.servers': 'host1:9092,host2:9092'}")
    return dict(properties)


def split_options(props: dict, defaults: dict, where: str) -> tuple[dict, dict]:
    """(librdkafka properties, connector options with defaults filled in)."""
    opts = dict(defaults)
    rest = {}
    for k, v in props.items():
        if k.startswith("jetwake."):
            if k not in defaults:
                raise KafkaConfigError(
                    f"{where}: unknown connector option {k!r}; known: {sorted(defaults)}")
            if isinstance(defaults[k], str):
                if not isinstance(v, str) or not _TOPIC_NAME.fullmatch(v):
                    raise KafkaConfigError(f"{where}: {k} must be a topic name (letters, "
                                           f"digits, '.', '_', '-'), got {v!r}")
                opts[k] = v
                continue
            try:
                opts[k] = int(v)
            except (TypeError, ValueError):
                raise KafkaConfigError(f"{where}: {k} must be an integer, got {v!r}") from None
        else:
            rest[k] = v
    return rest, opts


def source_properties(properties: Any, where: str = "Sources.kafka()") -> tuple[dict, dict]:
    props = check_common(properties, where)
    props, opts = split_options(props, SOURCE_OPTIONS, where)
    if _as_bool(props.get("enable.auto.commit", False)):
        raise KafkaConfigError(
            f"{where}: 'enable.auto.commit' must not be true: the source keeps its offsets in "
            "the job's snapshots (that is what makes it replayable); to see the lag in Kafka "
            "tooling, set 'group.id' and the source commits the snapshotted offsets to it")
    if props.get("enable.auto.offset.store") not in (None, False, "false"):
        raise KafkaConfigError(f"{where}: 'enable.auto.offset.store' is managed by the source; "
                               "remove it")
    if "group.instance.id" in props:
        raise KafkaConfigError(f"{where}: 'group.instance.id' is not supported: the source "
                               "assigns partitions itself and never joins the group")
    for k in ("transactional.id",):
        if k in props:
            raise KafkaConfigError(f"{where}: {k!r} is a producer setting, not a consumer one")
    props["enable.auto.commit"] = False
    props["enable.auto.offset.store"] = False
    props.setdefault("auto.offset.reset", "earliest")
    props.setdefault("enable.partition.eof", False)
    for k, v in SOURCE_CONSUMER_DEFAULTS.items():
        props.setdefault(k, v)
    return props, opts


def sink_properties(properties: Any, where: str = "Sinks.kafka()") -> tuple[dict, dict]:
    props = check_common(properties, where)
    props, opts = split_options(props, SINK_OPTIONS, where)
    if "transactional.id" in props:
        raise KafkaConfigError(
            f"{where}: do not set 'transactional.id': the exactly-once sink derives one per "
            "processor from the job id, the stage and the processor index (jetwake-<job>-"
            "<stage>-<index>) so that a restarted job fences its own earlier producers")
    if "enable.idempotence" in props and not _as_bool(props["enable.idempotence"]):
        raise KafkaConfigError(
            f"{where}: 'enable.idempotence' must stay true: without it a retried send can "
            "write a record twice or out of order, even under at-least-once")
    for k in ("group.id", "enable.auto.commit", "isolation.level"):
        if k in props:
            raise KafkaConfigError(f"{where}: {k!r} is a consumer setting, not a producer one")
    if "transaction.timeout.ms" in props:
        try:
            props["transaction.timeout.ms"] = int(props["transaction.timeout.ms"])
        except (TypeError, ValueError):
            raise KafkaConfigError(f"{where}: transaction.timeout.ms must be an integer (ms), "
                                   f"got {props['transaction.timeout.ms']!r}") from None
    props["enable.idempotence"] = True
    return props, opts
