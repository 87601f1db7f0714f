"""The graceful stop of a process a test started: SIGTERM, then SIGKILL if it outlives a
deadline, so that a member that hangs on its way out cannot hang the test with it."""

from __future__ import annotations

import signal
import subprocess


def stop_gracefully(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """Sends SIGTERM to ``proc`` (if it still runs) and waits up to ``timeout`` seconds for it
    to end, then kills it (SIGKILL); returns its exit code (negative for a signal)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(10)
