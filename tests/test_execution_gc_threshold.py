"""The execution service collects garbage cycles less often than CPython does by default, and
leaves thresholds a process chose alone."""
from __future__ import annotations

import gc

import pytest

from jetwake.engine.execution.execution_service import (
    CPYTHON_GC_THRESHOLDS, GC_FIRST_THRESHOLD, ExecutionService, Execution,
)


@pytest.fixture
def restore_gc_thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def _start_service() -> None:
    service = ExecutionService(1)
    service.submit(Execution("empty", [], on_end=lambda ex: None))  # starts the workers
    service.shutdown()


def test_starting_the_workers_raises_cpythons_first_gc_threshold(restore_gc_thresholds):
    gc.set_threshold(*CPYTHON_GC_THRESHOLDS)
    _start_service()
    assert gc.get_threshold() == (GC_FIRST_THRESHOLD, *CPYTHON_GC_THRESHOLDS[1:])


def test_thresholds_the_process_chose_are_left_alone(restore_gc_thresholds):
    gc.set_threshold(1234, 5, 6)
    _start_service()
    assert gc.get_threshold() == (1234, 5, 6)
