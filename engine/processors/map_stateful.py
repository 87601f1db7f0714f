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
from jetwake.engine.processors.state_migration import DROPPED, migrate_all, migrate_one

__all__ = ["MapStatefulProcessor", "KeyedStates", "MapStatefulEntries", "NOT_EXPIRED",
           "END_OF_TIME", "expired_keys"]

END_OF_TIME = sys.maxsize - 1
"""The watermark ``on_evict`` receives for the states still alive when a finite stream ends."""


class KeyedStates:
    """The states of a ``map_stateful`` stage, one per key, and with a ``ttl`` each key's last
    event time and its place in the expiry heap. :meth:`step` is the stage's per-key step and
    :meth:`expire` its eviction: the member's processor and the Spark backfill both run the
    stage with these. ``states`` may be a keyed state store (RocksDB) instead of a dict."""

    def __init__(self, create_fn: Callable[[], Any], map_fn: Callable[..., Any],
                 keyed: bool, ttl: int | None) -> None:
        self.create_fn = create_fn
        self.map_fn = map_fn
        self.keyed = keyed
        self.ttl = ttl
        self.states: Any = {}       # key -> state
        self.last_ts: dict = {}     # key -> last event time (with a ttl)
        self.expiry: list = []      # heap of (expiry, seq, key), lazily corrected
        self._seq = 0
        self.write_back = False     # a state changed in place is written back (a store)

    def step(self) -> Callable[[Any, Any, Any], Any]:
        """The stage's per-key step, ``apply(k, t, x)``: ``map_fn`` on key ``k``'s state
        (created on its first event) and the item ``x`` of event time ``t`` (with a ttl the
        key's last event time moves up to ``t``); returns what ``map_fn`` returns. Made once
        the states' store is chosen (:meth:`use_store`): it reads them without an attribute
        lookup per item."""
        states, last_ts, ttl = self.states, self.last_ts, self.ttl
        create_fn, map_fn, keyed, write_back = self.create_fn, self.map_fn, self.keyed, \
            self.write_back
        track, get = self.track, states.get

        def apply(k: Any, t: Any, x: Any) -> Any:
            state = get(k, _MISSING)
            if state is _MISSING:
                state = states[k] = create_fn()
                if ttl is not None:
                    track(k, t)
            elif ttl is not None and t > last_ts[k]:
                last_ts[k] = t
            r = map_fn(state, k, x) if keyed else map_fn(state, x)
            if write_back:  # a store outside memory keeps copies
                states[k] = state
            return r
        return apply

    def use_store(self, store: Any) -> None:
        """Keeps the states in ``store`` (a keyed state store: RocksDB) instead of a dict."""
        self.states = store
        self.write_back = True

    def track(self, k: Any, last: int) -> None:
        """Records ``last`` as key ``k``'s last event time, due to expire at ``last + ttl``."""
        self.last_ts[k] = last
        self._seq += 1
        heapq.heappush(self.expiry, (last + self.ttl, self._seq, k))  # type: ignore[operator]

    def expire(self, wm: int) -> Iterator[tuple[Any, Any]]:
        """``(key, state)`` of each state that expires at watermark ``wm``, taken out."""
        states = self.states
        for k in expired_keys(self.expiry, self.last_ts, self.ttl, wm):  # type: ignore[arg-type]
            yield k, states.pop(k)

    def expire_key(self, k: Any, wm: int) -> Any:
        """Key ``k``'s state taken out when it expires at watermark ``wm``; else
        :data:`NOT_EXPIRED`."""
        last = self.last_ts.get(k)
        if last is None or last + self.ttl >= wm:  # type: ignore[operator]
            return NOT_EXPIRED
        del self.last_ts[k]
        return self.states.pop(k)


class MapStatefulEntries:
    """The snapshot entries of a ``map_stateful`` stage, one codec for its processor (which
    saves and restores them) and for the Spark backfill's hand-off (which writes them): the
    watermark, broadcast to every processor (the lowest is restored), and per key
    ``[state, last event time]`` (``{"last_ts": t}`` when the state itself is in a RocksDB
    checkpoint's files)."""

    WATERMARK = BroadcastKey("map-stateful-watermark")

    @staticmethod
    def watermark(wm: int) -> tuple[BroadcastKey, int]:
        return MapStatefulEntries.WATERMARK, wm

    @staticmethod
    def state(key: Any, state: Any, last_ts: int | None) -> tuple[Any, list]:
        return key, [state, last_ts]

    @staticmethod
    def last_ts_only(key: Any, last_ts: int) -> tuple[Any, dict]:
        """A key's last event time alone, its state being in saved files."""
        return key, {"last_ts": last_ts}

    @staticmethod
    def read(value: Any) -> tuple[Any, int | None]:
        """``(state, last event time)`` of a key's entry; the state is ``IN_FILES`` when
        the entry holds the last event time only."""
        if type(value) is dict:
            return IN_FILES, value["last_ts"]
        state, last = value
        return state, last


_MISSING = object()
NOT_EXPIRED = object()  # KeyedStates.expire_key: the key's state stays
IN_FILES = object()  # MapStatefulEntries.read: the state is restored from a checkpoint's files


class MapStatefulProcessor(EventTimeProcessor):
    def __init__(self, stage_name: str, create_fn: Callable[[], Any],
                 map_fn: Callable[..., Any], key_fn: Callable[[Any], Any] | None,
                 timestamped: bool, ttl: int | None = None,
                 on_evict: Callable[..., Any] | None = None,
                 migrate: Callable[[Any], Any] | None = None) -> None:
        self.stage_name = stage_name
        self.migrate = migrate  # converts states of an older shape (state_migration.py)
        self.create_fn = create_fn
        self.map_fn = map_fn
        self.key_fn = key_fn
        self.timestamped = timestamped
        self.ttl = ttl
        self.on_evict = call_with_arity(on_evict, 3) if on_evict is not None else None
        self.keyed = KeyedStates(create_fn, map_fn, key_fn is not None,
                                 ttl if timestamped else None)
        self._apply = self.keyed.step()
        self.wm = NO_WATERMARK

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        if self.ttl is not None:
            context.metrics.setdefault("late_events", 0)
            context.metrics.setdefault("evicted_keys", 0)
        if context.state_backend != "memory":  # JobConfig(state_backend="rocksdb")
            self.keyed.use_store(context.keyed_state("states"))
            self._apply = self.keyed.step()

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        items = inbox.drain()
        apply = self._apply
        key_fn = self.key_fn
        out: list[Any] = []
        append = out.append
        if not self.timestamped:
            for x in items:
                r = apply(key_fn(x) if key_fn is not None else None, None, x)
                if r is not None:
                    append(r)
            self._emit(out)
            self._flush()
            return
        ttl = self.ttl
        late = 0
        min_ts = self.wm - ttl if ttl is not None and self.wm != NO_WATERMARK else NO_WATERMARK
        for t, x in items:
            if t < min_ts:
                late += 1
                continue
            r = apply(key_fn(x) if key_fn is not None else None, t, x)
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
        on_evict = self.on_evict
        out = []
        evicted = 0
        for k, state in self.keyed.expire(wm):
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
        yield MapStatefulEntries.watermark(self.wm)
        states, last_ts = self.keyed.states, self.keyed.last_ts
        # RocksDB state: one entry referring to a checkpoint's files (see snapshot/state/state_snapshots.py);
        # the last event times of a ttl live in memory and are saved per key beside it
        files = state_snapshot_entries(self.context, "states", states)
        if files is not None:
            yield from files
            for k, last in last_ts.items():
                yield MapStatefulEntries.last_ts_only(k, last)
            return
        if not isinstance(states, dict):
            states.flush()  # phase 1: the write-back cache reaches disk in one batch
        for k, state in states.items():
            yield MapStatefulEntries.state(k, state, last_ts.get(k))

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
            state, last = MapStatefulEntries.read(value)
            if state is not IN_FILES and self.migrate is not None \
                    and self.context.restoring_other_job:
                state = migrate_one(self.migrate, self.stage_name, k, state,
                                    self.context.metrics)
                if state is DROPPED:
                    continue
            if state is not IN_FILES:
                self.keyed.states[k] = state
            if last is not None and self.keyed.ttl is not None:
                self.keyed.track(k, last)
        if restored_wm is not None:
            self.wm = restored_wm

    def finish_snapshot_restore(self) -> bool:
        if self._restored_files:
            restore_keyed_state(self.keyed.states, self._restored_files,
                                self.context.owned_partitions)
            if self.migrate is not None and self.context.restoring_other_job:
                for k in migrate_all(self.keyed.states, self.migrate, self.stage_name,
                                     self.context.owned_partitions, self.context.metrics):
                    self.keyed.last_ts.pop(k, None)  # its expiry finds it gone
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
