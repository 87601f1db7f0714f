"""The progress line of a waiting command: on a terminal only (stderr a TTY), one line
redrawn in place with the operation, the job's last known status and the elapsed time."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

__all__ = ["Progress"]


class Progress:
    """``with Progress("Starting job 'x'") as p: ...``: a thread redraws the line four times a
    second while the block runs (a request may block meanwhile); ``p(info, elapsed)`` records
    the job's status from a poll. The line is erased at the end. Nothing is drawn when stderr
    is not a terminal, so scripts and logs get only the command's result."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.status: str | None = None
        self.tty = sys.stderr.isatty()
        self.shown = False
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _show(self) -> None:
        now = f" (job is {self.status})" if self.status else ""
        sys.stderr.write(f"\r{self.what}{now}... {time.monotonic() - self._t0:.0f}s \033[K")
        sys.stderr.flush()
        self.shown = True

    def __enter__(self) -> "Progress":
        if self.tty:
            def tick() -> None:
                while not self._stop.wait(0.25):
                    self._show()
            self._thread = threading.Thread(target=tick, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done()

    def __call__(self, info: dict, elapsed: float) -> None:
        self.status = info["status"]

    def done(self) -> None:
        """Stops redrawing and erases the line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.shown = False
