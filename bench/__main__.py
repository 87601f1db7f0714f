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
    # the long runs (chaos, soak) run only when named
    names = argv or [m.name for m in sorted(pkgutil.iter_modules(bench.__path__),
                                           key=lambda m: m.name)
                     if m.name.startswith("bench_") and _runs_by_default(m.name)]
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


def _runs_by_default(module_name: str) -> bool:
    """Whether ``python -m bench`` with no names runs it: the long runs (chaos, soak) set
    ``RUN_BY_DEFAULT = False`` and run only when named."""
    return getattr(importlib.import_module(f"bench.{module_name}"), "RUN_BY_DEFAULT", True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
