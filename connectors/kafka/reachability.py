"""Since when the Kafka brokers of a connector have not answered, and the one rule that ends a
job whose brokers are gone for good.

A broker that is away for a while is retried: the source reads again when it is back, the sink
retries its commits, and a job whose start fails for it restarts with back-off. But brokers
that never come back would make that retrying go on silently forever. The source and the sinks
note each answer and each failure of their brokers here (the source's metadata requests and
fetches; the sinks' commits, deliveries, transactional calls and markers; librdkafka's "all
brokers down" of either); once the brokers have failed, without one answer, for longer than
``jetwake.unreachable.timeout.ms``, :func:`check` raises the permanent
:class:`KafkaUnreachableError`, which fails the job (FAILED, with the brokers, how long and
since when in its error) instead of restarting it.

The record is per bootstrap-servers string and per process, not per processor: a job restarted
because of the brokers gets new processors, and the time they were away keeps counting across
the restarts. Only an answer of the brokers ends it: a restart that never reached them, or a
record a consumer had fetched before they went away, does not.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from jetwake.engine.core.errors import JetwakeError

__all__ = ["KafkaUnreachableError", "answered", "unanswered", "check", "unanswered_since",
           "time_left", "is_no_answer", "error_callback", "UNREACHABLE_OPTION"]

log = logging.getLogger("jetwake.kafka")

UNREACHABLE_OPTION = "jetwake.unreachable.timeout.ms"


class KafkaUnreachableError(JetwakeError):
    """The brokers have not answered for longer than ``jetwake.unreachable.timeout.ms``.
    Permanent: retrying is what the bound stops."""

    restartable = False


@dataclass
class _Since:
    monotonic: float
    wall: float


_lock = threading.Lock()
_since: dict[str, _Since] = {}


def answered(servers: str) -> None:
    """The brokers at ``servers`` answered: they are reachable."""
    if servers in _since:
        with _lock:
            since = _since.pop(servers, None)
        if since is not None:
            log.info("the Kafka brokers at %s answer again (after %.1f s without an answer)",
                     servers, time.monotonic() - since.monotonic)


def unanswered(servers: str) -> None:
    """A request to the brokers at ``servers`` failed for want of an answer."""
    if servers not in _since:
        with _lock:
            if servers in _since:
                return
            _since[servers] = _Since(time.monotonic(), time.time())
        log.warning("the Kafka brokers at %s do not answer; counting towards %s", servers,
                    UNREACHABLE_OPTION)


def is_no_answer(error: BaseException) -> bool:
    """Whether ``error`` of a Kafka client means its brokers did not answer (no connection,
    every broker down, a time-out), as opposed to an answer that refused the request."""
    from confluent_kafka import KafkaError, KafkaException

    no_answer = {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
                 KafkaError._MSG_TIMED_OUT, KafkaError._RESOLVE, KafkaError.REQUEST_TIMED_OUT,
                 KafkaError._TIMED_OUT_QUEUE}
    if isinstance(error, TimeoutError):
        return True
    if isinstance(error, KafkaException) and error.args \
            and isinstance(error.args[0], KafkaError):
        return error.args[0].code() in no_answer
    if isinstance(error, KafkaError):
        return error.code() in no_answer
    return False


def error_callback(servers: str) -> Callable[[Any], None]:
    """A librdkafka ``error_cb`` that notes "all brokers down" of a client of ``servers``
    (librdkafka's own word that none of them can be reached)."""
    from confluent_kafka import KafkaError

    def on_error(error: Any) -> None:
        if isinstance(error, KafkaError) and error.code() == KafkaError._ALL_BROKERS_DOWN:
            unanswered(servers)
        else:
            log.debug("Kafka client of %s: %s", servers, error)
    return on_error


def unanswered_since(servers: str) -> float | None:
    """The wall-clock time since which ``servers`` have not answered, or None."""
    since = _since.get(servers)
    return None if since is None else since.wall


def time_left(servers: str, limit_ms: int) -> float | None:
    """Seconds until ``servers`` pass their bound, when they are not answering now (at
    least 0); None while they answer or without a bound."""
    since = _since.get(servers)
    if since is None or limit_ms <= 0:
        return None
    return max(0.0, limit_ms / 1000 - (time.monotonic() - since.monotonic))


def check(servers: str, limit_ms: int, where: str) -> None:
    """Raises :class:`KafkaUnreachableError` when ``servers`` have not answered for longer
    than ``limit_ms`` (0: no bound)."""
    since = _since.get(servers)
    if since is None or limit_ms <= 0:
        return
    away = time.monotonic() - since.monotonic
    if away * 1000 <= limit_ms:
        return
    at = time.strftime("%H:%M:%S UTC", time.gmtime(since.wall))
    raise KafkaUnreachableError(
        f"{where}: the Kafka brokers at {servers} have not answered for {away:.0f} s (since "
        f"{at}), longer than {UNREACHABLE_OPTION}={limit_ms}; the job fails instead of "
        "retrying forever. Start the brokers and restart the job (it resumes from its last "
        f"snapshot), or raise {UNREACHABLE_OPTION} (0: wait for them without a bound)")
