"""The body of a stateless stage that has a vertex of its own.

Stateless stages usually run fused on the edge that leaves their upstream processor (see
engine/pipeline/fusion.py). One gets its own vertex when the user set its parallelism, or when
a rebalance before it decides how items reach it; this processor then applies the stage's
function over each chunk, so the vertex's items in and out are the stage's.
"""

from __future__ import annotations

from typing import Callable

from jetwake.engine.core.processor import Inbox, Processor

__all__ = ["StatelessStageProcessor"]


class StatelessStageProcessor(Processor):
    def __init__(self, chunk_fn: Callable[[list], list]) -> None:
        """``chunk_fn``: the stage's function over a chunk of items."""
        self.chunk_fn = chunk_fn

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self.outbox.has_room():
            out = self.chunk_fn(inbox.drain())
            if out:
                self.outbox.offer_chunk(-1, out)
