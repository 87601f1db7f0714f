"""`make bench`: runs every benchmark in turn (python -m bench [name ...])."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback

import bench


def main(argv: list[str]) -> int:
    names = argv or sorted(m.name for m in pkgutil.iter_modules(bench.__path__)
                           if m.name.startswith("bench_"))
    failed = 0
    for name in names:
        name = name.replace("-", "_")  # `python -m bench kafka-peers`
        module_name = name if name.startswith("bench_") else f"bench_{name}"
        print(f"== {module_name}", flush=True)
        try:
            importlib.import_module(f"bench.{module_name}").main()
        except Exception:  # noqa: BLE001 - report and go on with the next benchmark
            traceback.print_exc()
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
