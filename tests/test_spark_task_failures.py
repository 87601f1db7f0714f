"""A Spark job's failure, as the driver gets it (the worker's Python traceback printed inside
the JVM's exception text), read back as the pipeline's own error."""

from __future__ import annotations

import traceback

from jetwake.connectors.kafka.source import KafkaDeserializationError
from jetwake.engine.backfill.task_failures import BackfillTaskError, spark_task_failure
from jetwake.engine.pipeline.fusion import note_stage


def as_spark_reports(error: BaseException) -> Exception:
    """``error`` printed by a Python worker, inside the text of the JVM exception the driver
    sees (py4j's shape: the Java exception chain, the worker's text, then JVM frames)."""
    printed = "".join(traceback.format_exception(error))
    return Exception(
        "An error occurred while calling o52.getResult.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage "
        "0.0 failed 1 times, most recent failure: Lost task 0.0 in stage 0.0 (TID 0) "
        "(127.0.0.1 executor driver): org.apache.spark.api.python.PythonException: "
        "[PYTHON_EXCEPTION] An exception was thrown from the Python worker: " + printed
        + " SQLSTATE: 38000\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator."
        "handlePythonException(PythonRunner.scala:628)\n\tat org.apache.spark.scheduler."
        "Task.run(Task.scala:147)\n")


def raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - the error under test
        return e
    raise AssertionError("nothing raised")


def test_a_user_error_becomes_a_backfill_task_error_naming_the_stage():
    def parse():
        try:
            return 10 // 0
        except ZeroDivisionError as e:
            note_stage(e, "stage 'parse' (map)")
            raise
    failure = spark_task_failure(as_spark_reports(raised(parse)))
    assert isinstance(failure, BackfillTaskError)
    assert str(failure) == ("stage 'parse' (map) failed in a Spark task: ZeroDivisionError: "
                            "integer division or modulo by zero")
    assert failure.stage == "stage 'parse' (map)"
    assert "return 10 // 0" in failure.worker_traceback


def test_a_jetwake_error_is_raised_again_as_its_own_class_and_message():
    message = "Sources.kafka(): cannot deserialize the record at topic 't', partition 0, offset 2"
    failure = spark_task_failure(as_spark_reports(
        raised(lambda: (_ for _ in ()).throw(KafkaDeserializationError(message)))))
    assert type(failure) is KafkaDeserializationError
    assert str(failure) == message


def test_of_chained_exceptions_the_outermost_is_reported():
    def load():
        try:
            {}["missing"]
        except KeyError as e:
            raise ValueError("the config has no 'missing'\nsecond line of the message") from e
    failure = spark_task_failure(as_spark_reports(raised(load)))
    assert str(failure) == ("a pipeline function failed in a Spark task: ValueError: the "
                            "config has no 'missing'\nsecond line of the message")
    assert failure.error_type == "ValueError" and failure.stage is None


def test_a_failure_of_spark_itself_is_left_as_it_is():
    assert spark_task_failure(Exception("org.apache.spark.SparkException: Job 3 cancelled "
                                        "because SparkContext was shut down")) is None
