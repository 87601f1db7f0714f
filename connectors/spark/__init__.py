"""The Spark backfill: a Pipeline run on PySpark, handing off to a streaming job."""

from jetwake.connectors.spark.runner import (
    BackfillResult, BackfillTaskError, SparkMasterError, SparkRunner,
)

__all__ = ["SparkRunner", "BackfillResult", "BackfillTaskError", "SparkMasterError"]
