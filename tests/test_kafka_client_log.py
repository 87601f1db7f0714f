"""librdkafka's log reaches the member's logging, in its format, rate-limited: a job pointed at
a broker that is down does not flood the log (about 20 raw lines a second before)."""

from __future__ import annotations

import logging

import pytest

from jetwake import JobConfig, Member, Pipeline, Sinks, Sources
from jetwake.connectors.kafka.client_log import CLIENT_LOGGER, RateLimitFilter
from jetwake.connectors.kafka.source import KafkaSourceError


def _record(msg: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(CLIENT_LOGGER, level, __file__, 1, msg, None, None)


def test_the_filter_passes_a_burst_of_each_kind_then_holds_the_rest_back():
    f = RateLimitFilter(burst=3, period=60)
    passed = [f.filter(_record(f"connect to 127.0.0.1:1 failed (after {i}ms)"))
              for i in range(50)]
    assert passed == [True] * 3 + [False] * 47


def test_kinds_are_counted_apart():
    f = RateLimitFilter(burst=1, period=60)
    assert f.filter(_record("connect failed"))
    assert f.filter(_record("metadata request timed out"))
    assert f.filter(_record("connect failed", logging.WARNING))
    assert not f.filter(_record("connect failed"))


def test_after_a_period_the_first_record_says_how_many_were_held_back():
    now = [100.0]
    f = RateLimitFilter(burst=1, period=60, clock=lambda: now[0])
    assert f.filter(_record("connect failed"))
    assert not any(f.filter(_record("connect failed")) for _ in range(5))
    now[0] += 61
    later = _record("connect failed")
    assert f.filter(later)
    assert "5 more like it in the last 60 s not logged" in later.getMessage()


@pytest.mark.integration
def test_a_job_on_a_dead_broker_logs_through_the_member_logging_rate_limited(caplog, capfd):
    # a fresh rate limit: earlier tests in this process may have used up this minute's lines
    client_logger = logging.getLogger(CLIENT_LOGGER)
    for f in list(client_logger.filters):
        client_logger.removeFilter(f)
    p = Pipeline()
    p.read_from(Sources.kafka("t", {"bootstrap.servers": "127.0.0.1:1",
                                    "jetwake.startup.timeout.ms": 3000})).write_to(Sinks.noop())
    with caplog.at_level(logging.DEBUG, logger=CLIENT_LOGGER):
        with Member() as m:
            with pytest.raises(KafkaSourceError, match="did not answer"):
                m.new_job(p, JobConfig())
    records = [r for r in caplog.records if r.name == CLIENT_LOGGER]
    assert records, "librdkafka's log did not reach the jetwake.kafka.client logger"
    assert len(records) <= 10, f"{len(records)} client log lines in a few seconds"
    assert "Connection refused" not in capfd.readouterr().err
