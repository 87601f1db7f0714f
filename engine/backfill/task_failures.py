"""A Spark task's failure, reported as the error the pipeline raised.

When a Python function fails in a Spark task, the driver gets a JVM exception (through py4j)
whose text holds the worker's Python traceback among pages of JVM frames. A backfill reports
what the streaming job would: the pipeline's own error. An error of jetwake's (a record that
cannot be deserialized, a timestamp that cannot be read, a Kafka range that stalls) is raised
again as the same class with its message; any other exception becomes a
:class:`BackfillTaskError` naming its type, its message and, where the stage noted itself, the
stage. The worker's traceback, which points at the user's code, is kept on the error
(``worker_traceback``) and shown as a note of it.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.pipeline.fusion import note_stage, stage_of_note

__all__ = ["BackfillTaskError", "spark_task_failure"]

_TRACEBACK = "Traceback (most recent call last):"
# where the worker's text ends inside the JVM's: a JVM frame, or Spark's SQL state
_JVM_TEXT = re.compile(r"^\s*(at [\w$.]+\(|SQLSTATE:|Caused by: |Driver stacktrace:)")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?:: ?(.*))?$")


class BackfillTaskError(JetwakeError):
    """A pipeline function raised in a Spark task. ``error_type``: the qualified name of the
    exception, ``stage``: the stage that raised it where known, ``worker_traceback``: the
    Python traceback in the worker."""

    def __init__(self, message: str, error_type: str = "", stage: str | None = None,
                 worker_traceback: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type
        self.stage = stage
        self.worker_traceback = worker_traceback


def _worker_text(text: str) -> str | None:
    """The worker's Python traceback within a Spark failure's text: from the first traceback
    header to where the JVM's frames start again."""
    start = text.find(_TRACEBACK)
    if start < 0:
        return None
    lines = []
    for line in text[start:].splitlines():
        if _JVM_TEXT.match(line):
            break
        lines.append(line)
    return "\n".join(lines).rstrip()


def _exception_of(worker: str) -> tuple[str, str, list[str]] | None:
    """``(type name, message, notes)`` of the outermost exception of a printed traceback."""
    last = worker.rfind(_TRACEBACK)
    body = worker[last + len(_TRACEBACK):].splitlines()
    i = 0
    while i < len(body) and (not body[i] or body[i][0] in " \t"):
        i += 1  # the frames (indented) before the exception's own line
    if i == len(body):
        return None
    m = _EXCEPTION_LINE.match(body[i])
    if m is None:
        return None
    notes: list[str]
    message, notes = [m.group(2) or ""], []
    for line in body[i + 1:]:
        if not line.strip():
            break
        (notes if stage_of_note(line) is not None else message).append(line)
    return m.group(1), "\n".join(message).strip(), notes


def _jetwake_class(name: str) -> type | None:
    """The exception class ``name`` names when it is one of jetwake's."""
    module, _, cls = name.rpartition(".")
    if not module.startswith("jetwake."):
        return None
    try:
        found = getattr(importlib.import_module(module), cls, None)
    except ImportError:
        return None
    return found if isinstance(found, type) and issubclass(found, Exception) else None


def spark_task_failure(error: BaseException) -> BaseException | None:
    """The pipeline's error inside ``error``, a Spark job's failure as the driver sees it;
    None when ``error`` holds no Python traceback of a worker (a failure of Spark itself)."""
    worker = _worker_text(str(error))
    if worker is None:
        return None
    found = _exception_of(worker)
    if found is None:
        return None
    name, message, notes = found
    stage = next((stage_of_note(n) for n in notes), None)
    cls = _jetwake_class(name)
    rebuilt: Any = None
    if cls is not None:
        try:
            rebuilt = cls(message)
        except Exception:  # noqa: BLE001 - a constructor of another shape: report it as below
            rebuilt = None
    if rebuilt is None:
        short = name.rpartition(".")[2] if name.startswith("builtins.") else name
        where = f"{stage} failed" if stage else "a pipeline function failed"
        rebuilt = BackfillTaskError(f"{where} in a Spark task: {short}: {message}"
                                    if message else f"{where} in a Spark task: {short}",
                                    error_type=name, stage=stage)
    elif stage:
        note_stage(rebuilt, stage)
    rebuilt.worker_traceback = worker
    rebuilt.add_note(f"the Spark worker's traceback:\n{worker}")
    return rebuilt

