"""Where a backfill stops: ``SparkRunner.run(until=...)`` and the CLI's ``--until``."""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["parse_until"]


def parse_until(until: Any) -> Any:
    """``until`` checked: "latest", a timestamp in ms, a ``{topic: {partition: offset}}``
    dict, or the path of a JSON file holding such a dict (the CLI's ``--until``)."""
    if until == "latest":
        return until
    if isinstance(until, int) and not isinstance(until, bool):
        if until < 0:
            raise ValueError(f"until: a timestamp must be ms since the epoch, got {until}")
        return until
    if isinstance(until, str):
        if until.isdigit():
            return int(until)
        if not os.path.isfile(until):
            raise ValueError(f"until must be 'latest', a timestamp in ms, offsets as "
                             f"{{topic: {{partition: offset}}}} or a JSON file of them; "
                             f"{until!r} is none of these (no such file)")
        try:
            with open(until, encoding="utf-8") as f:
                until = json.load(f)
        except ValueError as e:
            raise ValueError(f"until: {until} is not a JSON file of offsets: {e}") from None
    if isinstance(until, dict):
        out: dict[str, dict[int, int]] = {}
        for topic, parts in until.items():
            if not isinstance(topic, str) or not isinstance(parts, dict):
                raise ValueError(f"until: offsets must be {{topic: {{partition: offset}}}}, "
                                 f"got {until!r}")
            try:
                out[topic] = {int(p): int(o) for p, o in parts.items()}
            except (TypeError, ValueError):
                raise ValueError(f"until: partitions and offsets of {topic!r} must be "
                                 f"integers, got {parts!r}") from None
        return out
    raise ValueError(f"until must be 'latest', a timestamp in ms or offsets "
                     f"{{topic: {{partition: offset}}}}, got {until!r}")
