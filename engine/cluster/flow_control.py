"""Flow control of a distributed edge: the adaptive receive window.

Inside a member, bounded queues give backpressure. Between members one TCP connection carries
every edge, so TCP's own flow control cannot hold back one slow edge without stalling the
others. Each (edge, sending member) stream therefore has a window, counted in bytes of packets:

- the receiver counts the bytes it has *processed* (decoded and moved into its local queues,
  which refuse when the downstream processor falls behind) and, at every flow-control interval,
  sends the sender an *ack*: the stream position up to which it may send;
- the window's target is three times what was processed since the previous ack (the rate at
  which the receiver really drains), and the window moves halfway from its current size towards
  that target, within ``[min_window, max_window]``;
- the sender sends while its position is below the acked limit; a packet may overrun the limit
  by its own size, as a chunk of items is never split.

So a receiver that keeps up lets its senders run at full speed, and a slow one makes them wait
instead of letting their packets pile up in memory.
"""

from __future__ import annotations

__all__ = ["ReceiveWindow", "SendWindow", "INITIAL_WINDOW_BYTES"]

INITIAL_WINDOW_BYTES = 1 << 20
MIN_WINDOW_BYTES = 64 << 10
MAX_WINDOW_BYTES = 64 << 20


class ReceiveWindow:
    """The receiving side of one stream."""

    __slots__ = ("window", "processed", "_processed_at_ack", "min_window", "max_window")

    def __init__(self, initial_window: int = INITIAL_WINDOW_BYTES,
                 min_window: int = MIN_WINDOW_BYTES, max_window: int = MAX_WINDOW_BYTES) -> None:
        if not 0 < min_window <= initial_window <= max_window:
            raise ValueError("ReceiveWindow needs 0 < min_window <= initial_window <= max_window")
        self.window = initial_window
        self.processed = 0  # bytes of this stream processed so far
        self._processed_at_ack = 0
        self.min_window = min_window
        self.max_window = max_window

    def on_processed(self, nbytes: int) -> None:
        self.processed += nbytes

    def initial_limit(self) -> int:
        """The limit a sender may use before the first ack."""
        return self.window

    def next_ack(self) -> int:
        """Adapts the window to the rate since the last ack and returns the new limit: the
        stream position up to which the sender may send."""
        since = self.processed - self._processed_at_ack
        self._processed_at_ack = self.processed
        target = 3 * since
        window = self.window + (target - self.window) // 2
        self.window = max(self.min_window, min(self.max_window, window))
        return self.processed + self.window


class SendWindow:
    """The sending side of one stream."""

    __slots__ = ("sent", "limit")

    def __init__(self, initial_limit: int = INITIAL_WINDOW_BYTES) -> None:
        self.sent = 0
        self.limit = initial_limit

    def can_send(self) -> bool:
        """Whether the next packet may go (it may overrun the limit by its own size)."""
        return self.sent < self.limit

    def on_sent(self, nbytes: int) -> None:
        self.sent += nbytes

    def on_ack(self, limit: int) -> None:
        if limit > self.limit:  # acks may arrive out of date; the limit never goes back
            self.limit = limit
