"""What the event-time processors share: ordered pending output, a side output, snapshots.

Window and stateful processors emit in bursts (a watermark closes many windows at once) into
an outbox whose buckets are bounded. They queue what they produce in ``_pending`` (data chunks
and control items in order) and move it to the outbox while it has room; every entry point
flushes first, so output order is kept and nothing is lost when the outbox is full.

With a *side output* (late events, events whose timestamp cannot be read) the planner wires
output ordinal 0 to the user's sink; the data then goes to ordinals 1..n-1. Without it, data
goes to every ordinal (-1).
"""

from __future__ import annotations

import time
from collections import deque
from operator import itemgetter
from typing import Any, Callable, Iterator

from jetwake.engine.core.stream_items import NO_WATERMARK
from jetwake.engine.core.stream_items import IDLE_TIMESTAMP, Watermark
from jetwake.engine.core.processor import Processor, ProcessorContext

__all__ = ["EventTimeProcessor", "first", "second", "short_repr", "MISSING", "flush_pending",
           "DATA", "CONTROL", "SIDE"]

first = itemgetter(0)
second = itemgetter(1)
MISSING = object()

#: the kinds of pending output entries
DATA, CONTROL, SIDE = 0, 1, 2


def flush_pending(pending: deque, outbox: Any, side_output: bool) -> bool:
    """Moves ``pending`` entries (data chunks, control items and side-output chunks, in order)
    into ``outbox`` while it has room; True when all moved. With a side output, data goes to
    ordinals 1..n-1 and side chunks to ordinal 0."""
    if not pending:
        return True
    n = outbox.ordinal_count
    while pending:
        kind, entry = pending[0]
        if kind == DATA and len(pending) > 1 and pending[1][0] == DATA:
            # consecutive data chunks (a source's runs of several partitions) leave as one:
            # every stage downstream pays per chunk
            pending.popleft()
            entry = list(entry)
            while pending and pending[0][0] == DATA:
                entry.extend(pending.popleft()[1])
            pending.appendleft((DATA, entry))
        if kind == DATA:
            if not side_output:
                if not outbox.offer_chunk(-1, entry):
                    return False
            elif n > 1:  # with the side output alone, data has nowhere to go
                for o in range(1, n):
                    if not outbox.has_room(o):
                        return False
                for o in range(1, n):
                    outbox.offer_chunk(o, entry if o == 1 else list(entry))
        elif kind == SIDE:
            if not outbox.offer_chunk(0, entry):
                return False
        else:
            outbox.offer_control(entry)
        pending.popleft()
    return True


def short_repr(obj: Any, limit: int = 200) -> str:
    """``repr(obj)`` truncated to ``limit`` characters, for error messages."""
    try:
        text = repr(obj)
    except Exception as e:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        text = f"<{type(obj).__qualname__} with a failing repr: {e!r}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class EventTimeProcessor(Processor):
    """Base of the event-time processors (see the module docstring)."""

    side_output = False
    stage_name = ""
    early_period = 0  # ms between early results of open windows (0: none)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._next_early = time.monotonic() + self.early_period / 1000
        self._pending: deque = deque()
        self._snapshot_iter: Iterator[tuple[Any, Any]] | None = None
        self._snapshot_held: tuple[Any, Any] | None = None

    # --- output ------------------------------------------------------------------------------

    def _emit(self, chunk: list) -> None:
        if chunk:
            self._pending.append((DATA, chunk))

    def _emit_control(self, item: Any) -> None:
        self._pending.append((CONTROL, item))

    def _emit_side(self, chunk: list) -> None:
        if chunk:
            self._pending.append((SIDE, chunk))

    def _flush(self) -> bool:
        """Moves pending output into the outbox while it has room; True when all moved."""
        return flush_pending(self._pending, self.outbox, self.side_output)

    def try_process_watermark(self, watermark: Watermark) -> bool:
        # output produced before the watermark must leave before it
        if not self._flush():
            return False
        ts = watermark.timestamp
        if ts != IDLE_TIMESTAMP and ts != NO_WATERMARK:
            self._advance_watermark(ts)
        self._emit_control(watermark)
        self._flush()
        return True

    def _advance_watermark(self, ts: int) -> None:
        """Event time has reached ``ts``: emit or evict what that completes."""

    def _early_results_due(self) -> bool:
        """Whether it is time to emit early results of the open windows (and restart the
        clock when it is)."""
        if not self.early_period or time.monotonic() < self._next_early:
            return False
        self._next_early = time.monotonic() + self.early_period / 1000
        return True

    def _count_late(self, n: int) -> None:
        m = self.context.metrics
        m["late_events"] = m.get("late_events", 0) + n

    # --- snapshots ---------------------------------------------------------------------------

    def _snapshot_entries(self) -> Iterator[tuple[Any, Any]]:
        """The (key, value) entries of this processor's state; subclasses override."""
        return iter(())

    def save_to_snapshot(self) -> bool:
        # output produced before the barrier must leave before it
        if not self._flush():
            return False
        if self._snapshot_iter is None:
            self._snapshot_iter = self._snapshot_entries()
        offer = self.outbox.offer_to_snapshot
        if self._snapshot_held is not None:
            if not offer(*self._snapshot_held):
                return False
            self._snapshot_held = None
        for entry in self._snapshot_iter:
            if not offer(*entry):
                self._snapshot_held = entry
                return False
        self._snapshot_iter = None
        return True


def chunked(items: list, size: int = 4096) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def call_with_arity(fn: Callable[..., Any], max_args: int) -> Callable[..., Any]:
    """``fn`` adapted to be called with ``max_args`` positional arguments, dropping the last
    ones when it accepts fewer (an eviction callback may take (state, key) or (state, key,
    watermark))."""
    import inspect
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return fn
    n = sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    if n >= max_args:
        return fn
    return lambda *args: fn(*args[:n])


