"""Stateful mapping: ``map_fn(state, key, item)`` with one mutable state object per key.

The state starts as ``create_fn()`` and the function may change it in place; its return value
is emitted unless it is None. With a ``ttl`` (event time, on a stage with timestamps) a key's
state is evicted when the watermark passes its last event's time plus the ttl, and
``on_evict(state, key, watermark)`` may return a last item to emit (it may also take only
``(state, key)``). An event more than ``ttl`` behind the watermark is late: its state may be
gone, so it is counted in ``late_events`` and dropped. When a finite stream ends, the states
still alive are evicted with the watermark :data:`END_OF_TIME`.

Keyless (``Stage.map_stateful``) runs on one processor with ``map_fn(state, item)``.
"""

from __future__ import annotations

import heapq
import sys
from typing import Any, Callable, Iterator

from jetwake.snapshot.state.state_snapshots import (
    restore_keyed_state, saved_state_files, state_snapshot_entries,
)
from jetwake.engine.core.processor import BroadcastKey, Inbox, ProcessorContext
from jetwake.engine.core.stream_items import timestamped
from jetwake.engine.operations.watermark_policy import NO_WATERMARK
from jetwake.engine.processors.event_time_base import EventTimeProcessor, call_with_arity

__all__ = ["MapStatefulProcessor", "END_OF_TIME", "expired_keys"]

END_OF_TIME = sys.maxsize - 1
"""The watermark ``on_evict`` receives for the states still alive when a finite stream ends."""


class MapStatefulProcessor(EventTimeProcessor):
    def __init__(self, stage_name: str, create_fn: Callable[[], Any],
                 map_fn: Callable[..., Any], key_fn: Callable[[Any], Any] | None,
                 timestamped: bool, ttl: int | None = None,
                 on_evict: Callable[..., Any] | None = None) -> None:
        self.stage_name = stage_name
        self.create_fn = create_fn
        self.map_fn = map_fn
        self.key_fn = key_fn
        self.timestamped = timestamped
        self.ttl = ttl
        self.on_evict = call_with_arity(on_evict, 3) if on_evict is not None else None
        self.states: dict = {}      # key -> state
        self.last_ts: dict = {}     # key -> last event time (with a ttl)
        self._expiry: list = []     # heap of (expiry, seq, key), lazily corrected
        self._seq = 0
        self.wm = NO_WATERMARK

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        if self.ttl is not None:
            context.metrics.setdefault("late_events", 0)
            context.metrics.setdefault("evicted_keys", 0)
        if context.state_backend != "memory":  # JobConfig(state_backend="rocksdb")
            self.states = context.keyed_state("states")

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        items = inbox.drain()
        states = self.states
        get = states.get
        create_fn, map_fn, key_fn = self.create_fn, self.map_fn, self.key_fn
        out: list[Any] = []
        append = out.append
        if not self.timestamped:
            if key_fn is None:
                state = get(None)
                if state is None and None not in states:
                    state = states[None] = create_fn()
                for x in items:
                    r = map_fn(state, x)
                    if r is not None:
                        append(r)
                states[None] = state  # a store outside memory keeps copies: write back
            else:
                for x in items:
                    k = key_fn(x)
                    state = get(k)
                    if state is None and k not in states:
                        state = states[k] = create_fn()
                    r = map_fn(state, k, x)
                    states[k] = state
                    if r is not None:
                        append(r)
            self._emit(out)
            self._flush()
            return
        ttl = self.ttl
        last_ts = self.last_ts
        late = 0
        min_ts = self.wm - ttl if ttl is not None and self.wm != NO_WATERMARK else NO_WATERMARK
        for t, x in items:
            if t < min_ts:
                late += 1
                continue
            k = key_fn(x) if key_fn is not None else None
            state = get(k)
            if state is None and k not in states:
                state = states[k] = create_fn()
                if ttl is not None:
                    last_ts[k] = t
                    self._seq += 1
                    heapq.heappush(self._expiry, (t + ttl, self._seq, k))
            elif ttl is not None and t > last_ts[k]:
                last_ts[k] = t
            r = map_fn(state, k, x) if key_fn is not None else map_fn(state, x)
            states[k] = state
            if r is not None:
                append((t, r))  # keeps the event's timestamp
        if late:
            self._count_late(late)
        self._emit(out)
        self._flush()

    def _advance_watermark(self, ts: int) -> None:
        if ts > self.wm:
            self.wm = ts
            if self.ttl is not None:
                self._evict(ts)

    def _evict(self, wm: int) -> None:
        states = self.states
        on_evict = self.on_evict
        out = []
        evicted = 0
        for k in expired_keys(self._expiry, self.last_ts, self.ttl, wm):  # type: ignore[arg-type]
            state = states.pop(k)
            evicted += 1
            if on_evict is not None:
                r = on_evict(state, k, wm)
                if r is not None:
                    out.append(timestamped(wm, r))
        if evicted:
            self.context.metrics["evicted_keys"] += evicted
        self._emit(out)

    def try_process(self) -> bool:
        return self._flush()

    def complete(self) -> bool:
        if self.ttl is not None and not self._completed:
            # the end of a finite stream: every state expires, as if the watermark were infinite
            self._completed = True
            self._evict(END_OF_TIME)
        return self._flush()

    _completed = False

    _restored_files: list | None = None  # saved RocksDB checkpoints, restored at the end

    def _snapshot_entries(self):
        yield BroadcastKey("map-stateful-watermark"), self.wm
        last_ts = self.last_ts
        # RocksDB state: one entry referring to a checkpoint's files (see snapshot/state/state_snapshots.py);
        # the last event times of a ttl live in memory and are saved per key beside it
        files = state_snapshot_entries(self.context, "states", self.states)
        if files is not None:
            yield from files
            for k, last in last_ts.items():
                yield k, {"last_ts": last}
            return
        if not isinstance(self.states, dict):
            self.states.flush()  # phase 1: the write-back cache reaches disk in one batch
        for k, state in self.states.items():
            yield k, [state, last_ts.get(k)]

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        restored_wm = None
        for k, value in inbox.drain():
            files = saved_state_files(k, value, "states")
            if files is not None:
                if self._restored_files is None:
                    self._restored_files = []
                self._restored_files.append(files)
                continue
            if isinstance(k, BroadcastKey):
                restored_wm = value if restored_wm is None else min(restored_wm, value)
                continue
            if type(value) is dict:  # a ttl's last event time; the state is in saved files
                last = value["last_ts"]
            else:
                state, last = value
                self.states[k] = state
            if last is not None and self.ttl is not None:
                self.last_ts[k] = last
                self._seq += 1
                heapq.heappush(self._expiry, (last + self.ttl, self._seq, k))
        if restored_wm is not None:
            self.wm = restored_wm

    def finish_snapshot_restore(self) -> bool:
        if self._restored_files:
            restore_keyed_state(self.states, self._restored_files, self.context.owned_partitions)
        self._restored_files = None
        return True


def expired_keys(heap: list, last_ts: dict, ttl: int, wm: int) -> Iterator[Any]:
    """The keys whose state expires at watermark ``wm``, each taken out of ``last_ts``: those
    whose last event time plus ``ttl`` is below ``wm``. Strictly below: an event exactly
    ``ttl`` behind the watermark is on time (late is ``t < wm - ttl``), so the state it meets
    must still be there. ``heap`` holds ``(expiry, sequence, key)`` entries; a key touched since
    its entry was pushed goes back at its new expiry. The member's processor and the Spark
    backfill both evict with this."""
    while heap and heap[0][0] < wm:
        _, seq, k = heapq.heappop(heap)
        last = last_ts.get(k)
        if last is None:
            continue
        if last + ttl >= wm:
            heapq.heappush(heap, (last + ttl, seq, k))
            continue
        del last_ts[k]
        yield k
