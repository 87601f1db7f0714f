"""Forwards every item unchanged: the body of merge and rebalance stages, whose work (the
fused stateless functions and the routing) happens on the edges around it."""

from __future__ import annotations

from jetwake.engine.core.processor import Inbox, Processor

__all__ = ["PassThroughProcessor"]


class PassThroughProcessor(Processor):
    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self.outbox.has_room():
            self.outbox.offer_chunk(-1, inbox.drain())
