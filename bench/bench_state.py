"""Micro-benchmark: puts/s and gets/s of the keyed state backends beside a plain dict.

Run ``python -m bench state`` or ``python -m bench.bench_state [key_count]``. Keys are strings,
values small ints; puts end with one flush; gets read every key once in a shuffled order, so a
cache smaller than the state misses often.

Then the RocksDB backend's own side of a snapshot: a checkpoint (flush, then RocksDB's hard-linked
files) beside reading every entry back and serializing it, and a restore from the checkpoint
beside putting every entry into a new backend.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from typing import Callable

from jetwake.engine.core.partitioning import PARTITION_COUNT
from jetwake.engine.core.serialization import dumps
from jetwake.snapshot.store.snapshot_files import load_files, save_files
from jetwake.snapshot.state.keyed_state import InMemoryStateBackend
from jetwake.snapshot.state.rocksdb_backend import RocksDBStateBackend

from .report import figure, line, timer

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


def _checkpoint_beside_full_copy(tmp: str, keys: list[str]) -> None:
    b = RocksDBStateBackend(f"{tmp}/ckpt")
    try:
        for i, k in enumerate(keys):
            b.put(k, i)
        with timer() as t_ckpt:
            manifest = save_files(b.checkpoint(), f"{tmp}/snapshot")
        for i, k in enumerate(keys):
            b.put(k, i)  # dirty again, so the full copy also starts with a flush
        with timer() as t_copy:
            b.flush()
            entries = list(b.items())
            data = dumps([[k for k, _ in entries], [v for _, v in entries]])
        figure(f"checkpoint of {len(keys):,} keys, RocksDB", t_ckpt[0] * 1000, "ms",
               f"flush + read + serialize every entry {t_copy[0] * 1000:.0f} ms "
               f"({len(data) / 2**20:.1f} MiB), ratio {t_ckpt[0] / t_copy[0]:.2f}")
        saved = load_files(manifest, f"{tmp}/snapshot")
        fresh = RocksDBStateBackend(f"{tmp}/restored")
        with timer() as t_restore:
            fresh.restore_checkpoints([saved], range(PARTITION_COUNT))
        puts = RocksDBStateBackend(f"{tmp}/put")
        with timer() as t_puts:
            for k, v in entries:
                puts.put(k, v)
            puts.flush()
        assert len(fresh) == len(puts) == len(keys)
        figure(f"restore of {len(keys):,} keys, RocksDB", t_restore[0] * 1000, "ms",
               f"put of every entry {t_puts[0] * 1000:.0f} ms, ratio "
               f"{t_restore[0] / t_puts[0]:.3f}")
        fresh.destroy()
        puts.destroy()
    finally:
        b.destroy()


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
        _checkpoint_beside_full_copy(tmp, keys)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else KEY_COUNT)
