"""Micro-benchmark: puts/s and gets/s of the keyed state backends beside a plain dict.

Run ``python -m bench state`` or ``python -m bench.bench_state [key_count]``. Keys are strings,
values small ints; puts end with one flush; gets read every key once in a shuffled order, so a
cache smaller than the state misses often.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from typing import Callable

from jetwake.snapshot.state_backend import InMemoryStateBackend, RocksDBStateBackend

from .report import line, timer

KEY_COUNT = 1_000_000


def _rate(count: int, run: Callable[[], None]) -> float:
    with timer() as elapsed:
        run()
    return count / elapsed[0]


def _bench_dict(keys: list[str], order: list[str]) -> tuple[float, float]:
    d: dict[str, int] = {}

    def puts() -> None:
        for i, k in enumerate(keys):
            d[k] = i

    def gets() -> None:
        for k in order:
            d.get(k)

    return _rate(len(keys), puts), _rate(len(order), gets)


def _bench_backend(make: Callable[[], object], keys: list[str], order: list[str]
                   ) -> tuple[float, float]:
    backend = make()

    def puts() -> None:
        for i, k in enumerate(keys):
            backend.put(k, i)
        backend.flush()

    def gets() -> None:
        for k in order:
            backend.get(k)

    try:
        return _rate(len(keys), puts), _rate(len(order), gets)
    finally:
        backend.destroy()


def main(key_count: int = KEY_COUNT) -> None:
    """Print puts/s and gets/s per backend beside a plain dict, with the ratio."""
    keys = [f"user-{i}" for i in range(key_count)]
    order = keys[:]
    random.Random(7).shuffle(order)
    dict_puts, dict_gets = _bench_dict(keys, order)
    tmp = tempfile.mkdtemp(prefix="bench-state-")
    try:
        cases: list[tuple[str, Callable[[], object]]] = [
            ("InMemoryStateBackend", InMemoryStateBackend),
            ("RocksDB cache 64 MiB", lambda: RocksDBStateBackend(f"{tmp}/big", 64 * 2**20)),
            ("RocksDB cache 1 MiB", lambda: RocksDBStateBackend(f"{tmp}/small", 2**20)),
        ]
        for name, make in cases:
            puts, gets = _bench_backend(make, keys, order)
            line(f"state put, {name}", puts, dict_puts, "puts", "dict")
            line(f"state get, {name}", gets, dict_gets, "gets", "dict")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else KEY_COUNT)
