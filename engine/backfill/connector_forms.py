"""What a connector gives the Spark backfill: a reader for its source, a writer for its sink.

A connector brings its Spark form as it brings its processors: ``Source(..., spark=reader)``,
``Sink(..., spark=writer)``. The backfill knows no connector: it calls the reader when it
builds the source's stage and the writer when it runs the sink's Spark job. A connector that
cannot run on Spark passes ``spark=NotOnSpark(reason)`` (``engine/pipeline/spark_form.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jetwake.engine.backfill.stage_output import StageOut
    from jetwake.engine.backfill.translate import Translator
    from jetwake.engine.pipeline.transforms import SinkTransform, SourceTransform

__all__ = ["SparkReader", "SparkWriter"]


class SparkReader:
    """How the backfill reads a source.

    ``needs_member``: it reads a member's data (run() then needs ``member=``).
    ``topics``: the Kafka topics it reads (an ``until`` of offsets may name only those).
    """

    needs_member = False
    topics: tuple[str, ...] = ()

    def bounds(self, until: Any) -> Any:
        """What the source will read, found on the driver before Spark starts, so that a
        wrong path or brokers that do not answer fail with their own message and no Spark
        session (given back to :meth:`read`); None by default."""
        return None

    def release(self, bounds: Any) -> None:
        """Called once the run has ended (done or failed) with what :meth:`bounds` gave: a
        reader whose bounds hold something open for the tasks (a database snapshot the
        driver exports) closes it here."""

    def read(self, backfill: "Translator", t: "SourceTransform", bounds: Any) -> "StageOut":
        """The source's stage: an RDD of chunks (``backfill`` offers the common ways to make
        one: :meth:`Translator.local_items`, :meth:`Translator.file_runs`)."""
        raise NotImplementedError(f"{type(self).__qualname__}.read")


class SparkWriter:
    """How the backfill writes to a sink. ``needs_member``: it writes into a member (run()
    then needs ``member=``)."""

    needs_member = False

    def write(self, backfill: "Translator", t: "SinkTransform", chunks: Any) -> int:
        """Writes the items of ``chunks`` (an RDD of lists of items) and returns how many."""
        raise NotImplementedError(f"{type(self).__qualname__}.write")
