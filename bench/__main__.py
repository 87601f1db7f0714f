"""`make bench`: runs every benchmark in turn (python -m bench [name ...]), or one benchmark
with its options (python -m bench nexmark --events 100000 ...)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback

import bench


def main(argv: list[str]) -> int:
    if len(argv) > 1 and argv[1].startswith("-"):  # one benchmark and its options
        options: list[str] | None = argv[1:]
        argv = argv[:1]
    else:
        options = None
    names = argv or sorted(m.name for m in pkgutil.iter_modules(bench.__path__)
                           if m.name.startswith("bench_"))
    failed = 0
    for name in names:
        name = name.replace("-", "_")  # `python -m bench kafka-peers`
        module_name = name if name.startswith("bench_") else f"bench_{name}"
        print(f"== {module_name}", flush=True)
        try:
            module = importlib.import_module(f"bench.{module_name}")
            module.main() if options is None else module.main(options)
        except SystemExit as e:  # a benchmark's own verdict (a failed check, bad options)
            failed += 1 if e.code else 0
        except Exception:  # noqa: BLE001 - report and go on with the next benchmark
            traceback.print_exc()
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
