"""What a member process under a kill test does besides its job: feed its input map slowly,
so that the test's kills land while items still come, and stay alive until it is killed."""

from __future__ import annotations

import time
from typing import Any


def feed_slowly(member: Any, map_name: str, events: int, *, every: int, pause: float) -> None:
    """Puts ``i -> i`` into map ``map_name`` for the ``i`` from what it holds (a restarted
    process goes on where the killed one stopped) up to ``events``, pausing ``pause`` s
    after every ``every`` items."""
    source = member.get_map(map_name)
    for i in range(len(source), events):
        source.put(i, i)
        if i % every == 0:
            time.sleep(pause)


def serve_until_killed() -> None:
    """Keeps the process (and its member's threads) alive until the test kills it."""
    while True:
        time.sleep(1)
