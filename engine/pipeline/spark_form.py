"""How a stage or a connector says it has no form on the Spark backfill.

Every transform declares its Spark form as it declares its plan on a member
(``Transform.add_to_spark`` beside ``add_to_dag``), and every connector of jetwake gives its
source or sink a Spark reader or writer (``Source(spark=...)``, ``Sink(spark=...)``) as it
gives it processors. One that cannot run on Spark says so with a :class:`NotOnSpark` in that
place, and the backfill refuses the pipeline with the reason before any Spark job starts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NotOnSpark"]


class NotOnSpark:
    """Declares that a transform or a connector has no Spark form; ``reason`` says why and
    what to use instead (it ends the error that refuses the pipeline)."""

    def __init__(self, reason: str) -> None:
        if not isinstance(reason, str) or not reason:
            raise ValueError("NotOnSpark needs the reason the backfill cannot run it")
        self.reason = reason

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # in place of a transform's add_to_spark: reached only if the check was bypassed
        raise TypeError(f"no Spark form: {self.reason}")

    def __repr__(self) -> str:
        return f"NotOnSpark({self.reason!r})"
