"""The Spark backfill's public names where they were first published: the backfill itself is
a runtime of the engine (``jetwake.engine.backfill``), this package only re-exports it."""

from jetwake.engine.backfill import (
    EVERY_WINDOW_CLOSED, BackfillResult, BackfillTaskError, SparkMasterError, SparkRunner,
)

__all__ = ["SparkRunner", "BackfillResult", "BackfillTaskError", "SparkMasterError",
           "EVERY_WINDOW_CLOSED"]
