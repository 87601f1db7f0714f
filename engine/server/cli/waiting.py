"""How a command waits for the member: a request or a job's new state, bounded by
``--timeout`` and shown by a progress line on a terminal."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from jetwake.engine.server.cli.errors import CliError
from jetwake.engine.server.cli.progress import Progress

__all__ = ["TERMINAL", "send_action", "wait_for", "wait_started"]

TERMINAL = ("FAILED", "COMPLETED")


def send_action(job: Any, args: argparse.Namespace, what: str, action: str, **kw: Any) -> Any:
    """Sends a job action; blocking ones (a terminal snapshot) show progress meanwhile."""
    if getattr(args, "no_wait", False):
        return job._action(action, background=True, **kw)
    with Progress(what):
        try:
            return job._action(action, **kw)
        except TimeoutError:
            raise CliError(f"timed out after {args.timeout:g} s: {what.lower()} (the member "
                           "may still complete it; try a longer --timeout)") from None


def wait_for(job: Any, args: argparse.Namespace, what: str,
             check: Callable[[dict], bool] | set) -> dict:
    """Waits until the job's state passes ``check`` (a set of statuses or a test of its
    info); returns its info."""
    with Progress(what) as progress:
        try:
            return job.wait_for_status(check, args.timeout, progress)
        except TimeoutError:
            raise CliError(f"timed out after {args.timeout:g} s: {what.lower()}; the job is "
                           f"{job._info['status']} (try again with a longer --timeout)") \
                from None


def wait_started(job: Any, timeout: float, progress: Progress) -> dict:
    """Waits until the member has finished starting the job: it runs, or its start failed
    (known as soon as the member knows it, however long that takes within ``timeout``).
    Returns the job's info; ``progress`` shows the job's status meanwhile."""
    progress(job._info, 0.0)
    try:
        return job.wait_started(timeout, progress)
    except TimeoutError:
        raise CliError(
            f"timed out after {timeout:g} s waiting for job '{job.name}' ({job.id}) to "
            f"start; it is still {job._info['status']} and the member carries on starting "
            f"it: `jetwake status {job.name}` shows whether it runs or why it failed (or "
            "wait with a longer --timeout)") from None
