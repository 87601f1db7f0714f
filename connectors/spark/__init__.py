"""The Spark backfill: a Pipeline run on PySpark, handing off to a streaming job."""

from jetwake.connectors.spark.runner import BackfillResult, SparkMasterError, SparkRunner

__all__ = ["SparkRunner", "BackfillResult", "SparkMasterError"]
