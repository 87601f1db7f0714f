"""What the test fixtures do alike with the local server runner scripts
(local_kafka/kafka_local.py, local_postgres/postgres_local.py): load one by its path (their
folders are not packages), and stop a server a dead test process leaves behind."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType


def load_runner(path: Path) -> ModuleType:
    """The runner script at ``path``, imported once under its file name."""
    name = path.stem
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


# ends when the server's state is gone: the tests stopped their server themselves
_WATCHDOG = """
import importlib, os, sys, time
parent, port, script_dir, module, stop = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                          sys.argv[4], sys.argv[5])
sys.path.insert(0, script_dir)
runner = importlib.import_module(module)
while runner._read_state(port) is not None:
    time.sleep(1)
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        getattr(runner, stop)(port)
        break
"""


def watch_for_orphaning(script: Path, stop: str, port: int) -> None:
    """Calls ``stop(port)`` of the runner ``script`` if this pytest process dies without its
    teardown (killed by a timeout, say): a small process of its own session watches the test
    process while the runner keeps a state for ``port``."""
    subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(port),
                      str(script.parent), script.stem, stop], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
