"""``jetwake.connectors.spark.runner``, where the backfill's runner was first published: a
re-export of ``jetwake.engine.backfill.runner``."""

from jetwake.engine.backfill.runner import (
    EVERY_WINDOW_CLOSED, LOCAL_DRIVER_JAVA_OPTIONS, BackfillResult, BackfillTaskError,
    SparkMasterError, SparkRunner,
)

__all__ = ["SparkRunner", "BackfillResult", "BackfillTaskError", "SparkMasterError",
           "EVERY_WINDOW_CLOSED", "LOCAL_DRIVER_JAVA_OPTIONS"]
