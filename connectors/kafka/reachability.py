"""Since when the Kafka brokers of a connector have not answered, and the one rule that ends a
job whose brokers are gone for good.

A broker that is away for a while is retried: the source reads again when it is back, and a
job whose start fails for it restarts with back-off. But brokers that never come back would
make that retrying go on silently forever. The source notes each answer and each failure of
its brokers here (a metadata request, a fetch); once they have failed, without one answer, for
longer than ``jetwake.unreachable.timeout.ms``, :func:`check` raises the permanent
:class:`KafkaUnreachableError`, which fails the job (FAILED, with the brokers, how long and
since when in its error) instead of restarting it.

The record is per bootstrap-servers string and per process, not per processor: a job restarted
because of the brokers gets new processors, and the time they were away must keep counting
across the restarts.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from jetwake.engine.core.errors import JetwakeError

__all__ = ["KafkaUnreachableError", "answered", "unanswered", "check", "unanswered_since"]

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
            _since.pop(servers, None)


def unanswered(servers: str) -> None:
    """A request to the brokers at ``servers`` failed for want of an answer."""
    if servers not in _since:
        with _lock:
            _since.setdefault(servers, _Since(time.monotonic(), time.time()))


def unanswered_since(servers: str) -> float | None:
    """The wall-clock time since which ``servers`` have not answered, or None."""
    since = _since.get(servers)
    return None if since is None else since.wall


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
