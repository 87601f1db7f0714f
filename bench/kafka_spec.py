"""The two Kafka workloads of ``python -m bench kafka-peers``, shared by every runner.

Only the standard library is imported here: the runners of the peers (Quix Streams, Bytewax)
load this file by path inside their own virtual environments, where jetwake is not installed.

Input: ``n`` JSON records of about 100 bytes over 6 partitions, keyed ``k0`` .. ``k9999``
(round robin, partitioned by key), with event times 10 µs apart ending at the moment the topic
was filled (100 records per millisecond: 100,000 per one-second window). After them every
partition gets one end marker (key ``__end__``) 5 s later in event time, which closes every
window of the real records in every system (per-partition stream time or watermark).

A: each value is parsed, gets one field computed from another, and is written back as JSON
   with the same key (``enrich``). Complete when the output holds every input record.
B: a tumbling 1 s count per key. Each result is written with the record key and a JSON value
   ``{"start", "end", "count", "t"}``, ``t`` being the wall time at which the system handed the
   result to its sink (for exactly-once sinks that is before the commit makes it visible).
   Complete when the totals per window equal the input's.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

PARTITIONS = 6
KEYS = 10_000
RECORDS_PER_MS = 100
WINDOW_MS = 1_000
END_KEY = b"__end__"
END_GAP_MS = 5_000
_PAD = "x" * 24


def key_of(i: int) -> bytes:
    return f"k{i % KEYS}".encode()


def value_of(i: int, ts: int) -> bytes:
    """About 100 bytes of JSON."""
    return (f'{{"id":{i},"key":"k{i % KEYS}","amount":{(i * 7919) % 100000 / 100},'
            f'"ts":{ts},"note":"{_PAD}"}}').encode()


def base_timestamp(n: int, now_ms: int) -> int:
    """The first record's event time: aligned to a window, so that the input ends near
    ``now_ms`` (current timestamps: the broker's retention never deletes them)."""
    start = now_ms - n // RECORDS_PER_MS
    return start - start % WINDOW_MS


def timestamp_of(base: int, i: int) -> int:
    return base + i // RECORDS_PER_MS


def end_marker_timestamp(base: int, n: int) -> int:
    return timestamp_of(base, max(n - 1, 0)) + END_GAP_MS


def enrich(d: dict) -> dict:
    """Workload A's map: one field computed from another."""
    d["amount_cents"] = round(d["amount"] * 100)
    return d


def expected_windows(n: int, base: int) -> dict[int, int]:
    """Window start -> number of records in it (the totals workload B must produce)."""
    totals: dict[int, int] = {}
    for i in range(0, n, RECORDS_PER_MS):
        ts = timestamp_of(base, i)
        start = ts - ts % WINDOW_MS
        totals[start] = totals.get(start, 0) + min(RECORDS_PER_MS, n - i)
    return totals


def expected_window_results(n: int, base: int) -> int:
    """How many (key, window) results workload B produces."""
    results = 0
    per_window: dict[int, int] = expected_windows(n, base)
    for count in per_window.values():
        results += min(count, KEYS)  # keys cycle, so a window of c records has min(c, KEYS)
    return results


def window_value(start: int, end: int, count: int) -> dict:
    return {"start": start, "end": end, "count": count, "t": time.time()}


class FirstRecord:
    """Writes the wall time at which a runner first saw an input record to the report file
    (the benchmark's start of processing; the time before it is start-up)."""

    def __init__(self, report_path: str) -> None:
        self.path = report_path
        self.seen = False

    def mark(self) -> None:
        if not self.seen:
            self.seen = True
            write_report(self.path, {"t_first": time.time()})


def write_report(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
