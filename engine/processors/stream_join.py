"""What the two event-time joins of two streams share (``join_interval``, ``join_asof``).

Both take the left stream on ordinal 0 and the right stream on ordinal 1, as timestamped
values, each partitioned by its join key so that equal keys meet in one processor. A
processor sees one watermark, the lowest of its inputs' (the engine coalesces them): no event
of either side older than it follows. An event below it is *late*: the state it would have
to meet may already be gone, so it is counted in ``late_events`` and dropped, or routed to
the stage's late-events sink (:meth:`StreamJoinProcessor.process`).
Both joins drop state exactly so that an event at or above the watermark still finds every
entry it can match. An event within the lag of its own partition is never late here, since
the watermark is never above its own partition's.

The join state and its watermark are saved per join key (:class:`JoinWatermark` is the one
broadcast entry), so a restore with another parallelism or member count re-partitions it;
the Spark backfill's hand-off writes the same entries through the same codecs.

Metrics (``context.metrics``): ``join_pairs`` (results emitted), ``late_events``,
``join_evicted_entries`` (entries dropped because the watermark passed them) and
``join_state_entries`` (a gauge: entries held now).
"""

from __future__ import annotations

from typing import Any, Callable

from jetwake.engine.core.processor import BroadcastKey, Inbox, ProcessorContext
from jetwake.engine.core.stream_items import NO_WATERMARK
from jetwake.engine.processors.event_time_base import EventTimeProcessor

__all__ = ["StreamJoinProcessor", "JoinWatermark", "LEFT", "RIGHT"]

LEFT, RIGHT = 0, 1
"""The ordinals (and state sides) of the two inputs."""


class JoinWatermark:
    """The watermark entry of a join's snapshot: broadcast to every processor, the lowest is
    restored (each processor saved its own)."""

    KEY = BroadcastKey("stream-join-watermark")

    @staticmethod
    def entry(wm: int) -> tuple[BroadcastKey, int]:
        return JoinWatermark.KEY, wm


class StreamJoinProcessor(EventTimeProcessor):
    """Base of the join processors: splits late events off, calls :meth:`_add_all` with the
    on-time events, keeps the metrics and the watermark entry. Subclasses hold the state."""

    def __init__(self, stage_name: str, key_fn: Callable[[Any], Any],
                 other_key_fn: Callable[[Any], Any], fn: Callable[[Any, Any], Any] | None,
                 side_output: bool) -> None:
        self.stage_name = stage_name
        self.key_fns = (key_fn, other_key_fn)
        self.fn = fn
        self.side_output = side_output
        self.wm = NO_WATERMARK
        self._restored_wm: int | None = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        m = context.metrics
        for k in ("join_pairs", "late_events", "join_evicted_entries", "join_state_entries"):
            m.setdefault(k, 0)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        key_fn = self.key_fns[ordinal]
        wm = self.wm
        out: list[Any] = []
        items = inbox.drain()
        late = [x for t, x in items if t < wm]  # below the watermark: late
        if late:
            items = [e for e in items if e[0] >= wm]
        self._add_all(ordinal, [(key_fn(x), t, x) for t, x in items], out)
        if late:
            self._count_late(len(late))
            if self.side_output:
                self._emit_side(late)
        self._emit_results(out)
        self._flush()

    def _add_all(self, side: int, events: list[tuple[Any, int, Any]], out: list) -> None:
        """Adds the on-time events ``(key, ts, item)`` of ``side`` in order; appends what they
        complete to ``out`` as ``(timestamp, result)``."""
        raise NotImplementedError

    def _emit_results(self, out: list) -> None:
        m = self.context.metrics
        if out:
            m["join_pairs"] += len(out)
            self._emit(out)
        m["join_state_entries"] = self._size()

    def _size(self) -> int:
        raise NotImplementedError

    def _evicted(self, n: int) -> None:
        if n:
            self.context.metrics["join_evicted_entries"] += n

    def _advance_watermark(self, ts: int) -> None:
        if ts > self.wm:
            self.wm = ts
            self._on_watermark(ts)

    def _on_watermark(self, wm: int) -> None:
        """Event time has reached ``wm``: emit what it completes, drop what it expires."""

    def try_process(self) -> bool:
        return self._flush()

    # --- snapshots -----------------------------------------------------------------------

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        for k, value in inbox.drain():
            if isinstance(k, BroadcastKey):
                self._restored_wm = value if self._restored_wm is None \
                    else min(self._restored_wm, value)
            else:
                self._restore_key(k, value)

    def _restore_key(self, key: Any, value: Any) -> None:
        raise NotImplementedError

    def finish_snapshot_restore(self) -> bool:
        if self._restored_wm is not None and self._restored_wm > self.wm:
            self.wm = self._restored_wm
        self._restored_wm = None
        self.context.metrics["join_state_entries"] = self._size()
        return True
