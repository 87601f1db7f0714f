"""The function an edge applies to each chunk before routing it (``Edge.transform``).

Any ``list -> list`` callable will do. An :class:`EdgeTransform` is one that keeps state per
upstream processor (the pipeline's fused stateless stages count the items each stage takes and
gives): the engine asks it for one instance per processor with :meth:`for_processor`, so that
processors running on different threads never share a counter, and a counter lives as long
as the execution that runs it, like the processor's own ``items_in`` and ``items_out``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

__all__ = ["EdgeTransform", "for_processor"]


class EdgeTransform:
    """A ``list -> list`` function over a chunk with per-processor instances."""

    def __call__(self, items: list[Any]) -> list[Any]:
        raise NotImplementedError(f"{type(self).__qualname__} must implement __call__")

    def for_processor(self) -> Callable[[list[Any]], list[Any]]:
        """The instance one upstream processor applies to its chunks (default: ``self``)."""
        return self

    def stage_counts(self) -> Iterator[tuple[Any, int, int]]:
        """``(step, items in, items out)`` of each pipeline stage this transform runs and
        counts (a step names its ``stage`` and ``kind``); none by default."""
        return iter(())


def for_processor(transform: Callable[[list[Any]], list[Any]] | None
                  ) -> Callable[[list[Any]], list[Any]] | None:
    """What a processor applies on an edge whose ``transform`` is ``transform``."""
    if isinstance(transform, EdgeTransform):
        return transform.for_processor()
    return transform
