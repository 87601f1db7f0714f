"""How every benchmark prints a figure: the engine beside its baseline, and the ratio."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


def line(name: str, engine_rate: float, baseline_rate: float, unit: str,
         baseline: str) -> None:
    """Prints ``name: engine X unit/s | baseline Y unit/s | ratio R``."""
    ratio = engine_rate / baseline_rate if baseline_rate else float("nan")
    print(f"{name:<44} {engine_rate:>12,.0f} {unit}/s | {baseline:<22} {baseline_rate:>12,.0f}"
          f" {unit}/s | ratio {ratio:.2f}", flush=True)


def figure(name: str, value: float, unit: str, note: str = "") -> None:
    """Prints a figure that has no throughput baseline (a duration, a size)."""
    print(f"{name:<44} {value:>12,.2f} {unit}{'  ' + note if note else ''}", flush=True)


@contextmanager
def timer() -> Iterator[list[float]]:
    """``with timer() as t: ...``, then ``t[0]`` is the elapsed seconds."""
    result = [0.0]
    start = time.perf_counter()
    try:
        yield result
    finally:
        result[0] = time.perf_counter() - start
