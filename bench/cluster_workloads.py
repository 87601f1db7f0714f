"""The jobs of ``python -m bench cluster``, and the plain loop the word count is compared with.

This module travels to the members by value (cloudpickle), so a member needs nothing of
``bench/`` on its path.

The CPU-bound word count: ``Sources.items(range(n))``, then a costly map turning each number
into a word (:class:`CostlyWord`: a pure-Python loop of :data:`ROUNDS` steps, about 30 µs on
the development machine, standing for a parser or a model call), then ``group_by(word)`` and
counting, written to files. :class:`CostlyWord` notes when its processor saw its first item (a
file per processor), so the benchmark measures processing from the first item to the last
result and reports the start-up apart.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

VOCABULARY = 2_000
ROUNDS = 300


def word_of(i: int) -> str:
    return f"w{(i * 7919) % VOCABULARY}"


def costly_word(i: int, rounds: int = ROUNDS) -> str:
    """The word of ``i`` after ``rounds`` steps of integer hashing (the costly part)."""
    h = i
    for k in range(rounds):
        h = (h * 1000003 ^ k) & 0xFFFFFFFF
    return word_of(i) if h >= 0 else ""


class CostlyWord:
    """The word count's map function: :func:`costly_word`, and on its first item a file
    ``first-*`` in ``report_dir`` holding the wall time (one per processor)."""

    def __init__(self, report_dir: str, rounds: int = ROUNDS) -> None:
        self.report_dir = report_dir
        self.rounds = rounds
        self.seen = False

    def __call__(self, i: int) -> str:
        if not self.seen:
            self.seen = True
            path = os.path.join(self.report_dir, f"first-{os.getpid()}-{uuid.uuid4().hex[:6]}")
            with open(path, "w") as f:
                f.write(repr(time.time()))
        return costly_word(i, self.rounds)


def word_count_pipeline(n: int, report_dir: str, out_dir: str) -> Any:
    from jetwake import AggregateOperations, Pipeline, Sinks, Sources

    p = Pipeline()
    (p.read_from(Sources.items(range(n)))
      .map(CostlyWord(report_dir))
      .group_by(lambda w: w)
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.files(out_dir)))
    return p


def expected_counts(n: int) -> dict[str, int]:
    return dict(Counter(word_of(i) for i in range(n)))


def plain_loop(n: int, rounds: int = ROUNDS) -> tuple[float, dict[str, int]]:
    """The same word count as a plain loop in this process: (seconds, counts)."""
    counts: dict[str, int] = {}
    t0 = time.perf_counter()
    for i in range(n):
        w = costly_word(i, rounds)
        counts[w] = counts.get(w, 0) + 1
    return time.perf_counter() - t0, counts


def first_item_time(report_dir: str) -> float | None:
    """The earliest first-item time any processor noted."""
    times = [float(p.read_text()) for p in Path(report_dir).glob("first-*")]
    return min(times) if times else None


def read_counts(out_dir: str) -> tuple[dict[str, int], float | None, int]:
    """(word -> count, the latest output file's modification time, words counted twice) of
    what the file sink wrote (``str`` of ``(word, count)`` tuples, a file per processor)."""
    import ast

    counts: dict[str, int] = {}
    twice = 0
    last = None
    for f in Path(out_dir).iterdir():
        if not f.is_file():
            continue
        mtime = f.stat().st_mtime
        last = mtime if last is None else max(last, mtime)
        for line in f.read_text().splitlines():
            word, count = ast.literal_eval(line)
            if word in counts:
                twice += 1
            counts[word] = counts.get(word, 0) + count
    return counts, last, twice


def kafka_window_pipeline(bootstrap: str, input_topic: str, output_topic: str) -> Any:
    """Workload B of ``bench/kafka_spec.py`` (a tumbling 1 s count per key, Kafka to Kafka),
    with the connectors' defaults, as ``bench/kafka_runners.py`` runs it on one member."""
    from jetwake import AggregateOperations, Pipeline, Sinks, Sources, WindowDefinition

    from bench import kafka_spec as spec

    props = {"bootstrap.servers": bootstrap}
    window_value = spec.window_value
    p = Pipeline()
    (p.read_from(Sources.kafka(input_topic, props))
      .with_native_timestamps(0)
      .window(WindowDefinition.tumbling(spec.WINDOW_MS))
      .group_by(lambda kv: kv[0])
      .aggregate(AggregateOperations.counting())
      .write_to(Sinks.kafka(output_topic, props, key_fn=lambda r: r.key,
                            value_fn=lambda r: window_value(r.start, r.end, r.result),
                            value_serializer="json")))
    return p
