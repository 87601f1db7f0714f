"""Micro-benchmark: puts/s and gets/s of the keyed state backends against a plain dict.

Run ``python bench/bench_state.py [key_count]``. Keys are strings, values small ints; gets
read every key once in a shuffled order, so a cache smaller than the state misses often.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import time
from typing import Callable

from jetwake.snapshot.state_backend import InMemoryStateBackend, RocksDBStateBackend

KEY_COUNT = 1_000_000


def _rate(count: int, run: Callable[[], None]) -> float:
    started = time.perf_counter()
    run()
    return count / (time.perf_counter() - started)


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


def main(argv: list[str] | None = None) -> None:
    """Print puts/s and gets/s per backend, and the ratio to a plain dict."""
    args = sys.argv[1:] if argv is None else argv
    count = int(args[0]) if args else KEY_COUNT
    keys = [f"user-{i}" for i in range(count)]
    order = keys[:]
    random.Random(7).shuffle(order)

    dict_puts, dict_gets = _bench_dict(keys, order)
    print(f"{'backend':<28} {'puts/s':>12} {'gets/s':>12} {'dict/puts':>10} {'dict/gets':>10}")
    print(f"{'dict':<28} {dict_puts:>12,.0f} {dict_gets:>12,.0f} {1:>10.1f} {1:>10.1f}")
    tmp = tempfile.mkdtemp(prefix="bench-state-")
    try:
        cases: list[tuple[str, Callable[[], object]]] = [
            ("InMemoryStateBackend", InMemoryStateBackend),
            ("RocksDB cache 64 MiB", lambda: RocksDBStateBackend(f"{tmp}/big", 64 * 2**20)),
            ("RocksDB cache 1 MiB", lambda: RocksDBStateBackend(f"{tmp}/small", 2**20)),
        ]
        for name, make in cases:
            puts, gets = _bench_backend(make, keys, order)
            print(f"{name:<28} {puts:>12,.0f} {gets:>12,.0f} "
                  f"{dict_puts / puts:>10.1f} {dict_gets / gets:>10.1f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
