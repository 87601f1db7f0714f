"""The Spark backfill: a Pipeline run on PySpark as a batch over history, handing its state
off to a streaming job (docs/backfill.md)."""

from jetwake.engine.backfill.runner import (
    EVERY_WINDOW_CLOSED, BackfillResult, BackfillTaskError, SparkMasterError, SparkRunner,
)

__all__ = ["SparkRunner", "BackfillResult", "BackfillTaskError", "SparkMasterError",
           "EVERY_WINDOW_CLOSED"]
