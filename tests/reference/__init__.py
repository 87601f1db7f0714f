"""A reference model of jetwake pipelines, for the conformance tests (tests/test_conformance.py).

- ``spec``: pipeline specs, plain data, and their inputs (each partition's records).
- ``functions``: the user functions a spec names (shared by the model and the pipelines).
- ``model``: what a spec must emit, which events are late where, and whether the input fixes
  it (``run_model``, ``is_determinate``); plain Python, nothing from jetwake.
- ``result``: ``RunResult``, what a run emitted, the shape every runtime returns.
- ``generate``: hypothesis strategies for specs and inputs, and the jetwake pipeline of a spec.
- ``runners``: the runtimes a spec runs on (``run_on_member``, ...), each
  ``(spec, inputs) -> RunResult``.

Importing this package does not import jetwake; ``generate`` and ``runners`` do.
"""

from .model import (
    NO_WATERMARK, Event, Indeterminacy, ModelResult, expected_run, is_determinate, record_times,
    run_model,
)
from .result import RunResult, canonical, difference, multiset
from .spec import Inputs, Spec, SpecError, check_spec, watermark_step

__all__ = ["NO_WATERMARK", "Event", "Indeterminacy", "ModelResult", "expected_run",
           "is_determinate", "record_times", "run_model", "RunResult", "canonical",
           "difference", "multiset", "Inputs", "Spec", "SpecError", "check_spec",
           "watermark_step"]
