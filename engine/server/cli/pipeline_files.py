"""Loading a user's pipeline file (``jetwake submit FILE.py``).

FILE.py runs in the command's process, with ``sys.argv`` set to the words after ``--``; it
defines a module-level ``pipeline`` (a Pipeline or a DAG) or a function ``pipeline(args)`` that
returns one. Its module is registered with cloudpickle to travel by value, so the member does
not need the file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import traceback
from typing import Any, Sequence

from jetwake.engine.server.cli.errors import CliError

__all__ = ["load_pipeline", "PipelineFileError"]


class PipelineFileError(CliError):
    """FILE.py is missing, defines no pipeline or raised while building it."""

    def __init__(self, message: str, traceback_text: str | None = None) -> None:
        super().__init__(message)
        self.traceback_text = traceback_text


def _user_traceback(e: BaseException) -> str:
    """The traceback of an error FILE.py raised, without the frames of this module."""
    tb = e.__traceback__
    here = os.path.abspath(__file__)
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        if os.path.abspath(fn) == here or fn.startswith("<frozen"):
            tb = tb.tb_next
        else:
            break
    return "".join(traceback.format_exception(type(e), e, tb))


def _a(obj: Any) -> str:
    """``obj``'s type with its article: "an int", "a str", "None"."""
    if obj is None:
        return "None"
    name = type(obj).__qualname__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def load_pipeline(path: str, args: Sequence[str] = ()) -> Any:
    """Runs FILE.py and returns its pipeline: the module-level ``pipeline`` (a Pipeline or a
    DAG) or what its function ``pipeline(args)`` returns. The module is registered with
    cloudpickle to travel by value, so the member does not need the file."""
    import cloudpickle

    from jetwake.engine.core.dag import DAG
    from jetwake.engine.pipeline.pipeline import Pipeline

    if not os.path.exists(path):
        raise PipelineFileError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise PipelineFileError(f"{path}: not a file")
    full = os.path.abspath(path)
    stem = "".join(ch if ch.isalnum() else "_" for ch in os.path.splitext(os.path.basename(
        path))[0])
    mod_name = f"jetwake_job_{stem}_{hashlib.sha1(full.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(mod_name, full)
    if spec is None or spec.loader is None:
        raise PipelineFileError(f"{path}: cannot be loaded as a Python module (is it a .py "
                                "file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(full))
    try:
        try:
            spec.loader.exec_module(module)
        except SystemExit as e:
            raise PipelineFileError(f"{path} called exit({e.code}) while being loaded") from None
        except BaseException as e:  # noqa: BLE001 - the user's code
            if isinstance(e, KeyboardInterrupt):
                raise
            raise PipelineFileError(f"{path} raised {type(e).__name__} while building the "
                                    f"pipeline: {e}", _user_traceback(e)) from None
        if not hasattr(module, "pipeline"):
            raise PipelineFileError(
                f"{path} does not define `pipeline`: define a module-level `pipeline = "
                "Pipeline()` or a function `def pipeline(args): ... return p`")
        obj = module.pipeline
        if not isinstance(obj, (Pipeline, DAG)):
            if not callable(obj):
                raise PipelineFileError(
                    f"{path}: `pipeline` is {_a(obj)}, not a Pipeline or a function "
                    "`pipeline(args)` that returns one")
            try:
                obj = obj(list(args))
            except BaseException as e:  # noqa: BLE001 - the user's code
                if isinstance(e, KeyboardInterrupt):
                    raise
                raise PipelineFileError(f"{path}: pipeline(args) raised {type(e).__name__}: "
                                        f"{e}", _user_traceback(e)) from None
            if not isinstance(obj, (Pipeline, DAG)):
                raise PipelineFileError(f"{path}: pipeline(args) returned {_a(obj)}, not a "
                                        "Pipeline")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    cloudpickle.register_pickle_by_value(module)
    return obj
