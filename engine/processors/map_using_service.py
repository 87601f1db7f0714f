"""The processors of ``map_using_service`` and ``map_using_service_async`` (docs/enrichment.md,
"Calling services"); what they share with the Spark backfill is in ``service_calls.py``.

Both keep an item's event time on its result (timestamped items in, timestamped results out)
and, with ``errors_to``, send the failure record of a call that failed for good to output
ordinal 0 (the planner wires the sink there; data then goes to the other ordinals).

The synchronous processor calls ``fn(service, item)`` item by item on a thread of its own (it
is not cooperative: a service call blocks). The asynchronous one stays cooperative: ``process``
only hands items to the service's event loop and takes what has completed. It holds a
watermark until every call started before it has been emitted, and a snapshot barrier the
same way (``save_to_snapshot`` returns False until then): the barrier leaves after the results
of every item that arrived before it, so a snapshot holds no call in flight, and a restart
neither loses nor repeats a result. The stage keeps no state of its own in snapshots.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from jetwake.engine.core.processor import Inbox, ProcessorContext
from jetwake.engine.core.stream_items import Watermark
from jetwake.engine.operations.service_factory import ServiceFactory
from jetwake.engine.processors.event_time_base import EventTimeProcessor
from jetwake.engine.processors.service_calls import (
    CONTROL, DATA, AsyncCalls, CallMetrics, ServiceLease, call_failed, call_sync,
    failure_record,
)

__all__ = ["MapUsingServiceProcessor", "MapUsingServiceAsyncProcessor"]

#: the synchronous processor returns from ``process`` after this long (ms), so that a
#: snapshot barrier or a cancellation waits for a few calls at most, not for a whole chunk
_SLICE_MS = 50


class _ServiceProcessor(EventTimeProcessor):
    def __init__(self, stage_name: str, factory: ServiceFactory, fn: Callable[..., Any],
                 key_fn: Callable[[Any], Any] | None, timestamped: bool,
                 errors_to: bool) -> None:
        self.stage_name = stage_name
        self.factory = factory
        self.fn = fn
        self.key_fn = key_fn
        self.timestamped = timestamped
        self.side_output = errors_to
        self._lease: ServiceLease | None = None

    _with_loop = False

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.calls_metrics = CallMetrics(context.metrics)
        self._lease = ServiceLease(self.factory, self.stage_name, context, self._with_loop)

    def close(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.close()


class MapUsingServiceProcessor(_ServiceProcessor):
    """``fn(service, item)`` per item, blocking, on a thread of its own."""

    def is_cooperative(self) -> bool:
        return False

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._flush():
            return
        assert self._lease is not None
        service, fn, stage = self._lease.service, self.fn, self.stage_name
        timestamped, side, metrics = self.timestamped, self.side_output, self.calls_metrics
        out: list[Any] = []
        bad: list[Any] = []
        deadline = time.monotonic() + _SLICE_MS / 1000
        while inbox and time.monotonic() < deadline:
            x = inbox.poll()
            item = x[1] if timestamped else x
            metrics.in_flight(1)
            r, error, ms = call_sync(fn, service, item)
            metrics.in_flight(0)
            metrics.done(ms, 1, error is not None)
            if error is not None:
                if not side:
                    self._emit(out)
                    self._flush()
                    raise call_failed(stage, item, error, 1) from error
                bad.append(failure_record(stage, item, error, 1))
                continue
            if r is not None:
                out.append((x[0], r) if timestamped else r)
        self._emit_side(bad)
        self._emit(out)
        self._flush()

    def try_process(self) -> bool:
        return self._flush()

    def complete(self) -> bool:
        return self._flush()


class MapUsingServiceAsyncProcessor(_ServiceProcessor):
    """``await fn(service, item)`` on the service's event loop, many calls at once."""

    _with_loop = True

    def __init__(self, stage_name: str, factory: ServiceFactory, fn: Callable[..., Any],
                 key_fn: Callable[[Any], Any] | None, timestamped: bool, errors_to: bool,
                 max_concurrent: int, preserve_order: bool, timeout_ms: int | None,
                 retrying: Any) -> None:
        super().__init__(stage_name, factory, fn, key_fn, timestamped, errors_to)
        self.max_concurrent = max_concurrent
        self.preserve_order = preserve_order
        self.timeout_ms = timeout_ms
        self.retrying = retrying

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        lease = self._lease
        assert lease is not None and lease.loop is not None
        self.calls = AsyncCalls(lease.loop, lease.service, self.fn, self.stage_name,
                                self.max_concurrent, self.preserve_order, self.timeout_ms,
                                self.retrying, self.key_fn is not None, self.side_output,
                                self.calls_metrics)

    def _take(self) -> bool:
        """Moves what the calls have ready into the pending output, then into the outbox;
        True when all of it reached the outbox."""
        if not self._flush():
            return False
        out: list[Any] = []
        bad: list[Any] = []
        timestamped = self.timestamped
        for kind, ts, x in self.calls.take():
            if kind == DATA:
                out.append((ts, x) if timestamped else x)
            elif kind == CONTROL:
                self._emit_side(bad)
                self._emit(out)
                out, bad = [], []
                self._emit_control(x)
            else:
                bad.append(x)
        self._emit_side(bad)
        self._emit(out)
        return self._flush()

    def process(self, ordinal: int, inbox: Inbox) -> None:
        calls = self._take() and self.calls
        if not calls:
            return
        key_fn, timestamped = self.key_fn, self.timestamped
        while inbox and calls.has_room():
            x = inbox.poll()
            if timestamped:
                ts, item = x
            else:
                ts, item = None, x
            calls.add(ts, item, key_fn(item) if key_fn is not None else None)
        calls.start()
        self._take()

    def try_process(self) -> bool:
        self._take()
        return True

    def try_process_watermark(self, watermark: Watermark) -> bool:
        if not self._take():
            return False
        if self.calls.idle:
            self._emit_control(watermark)
            self._flush()
        else:  # it leaves after the results of the calls started before it
            self.calls.add_control(watermark)
        return True

    def save_to_snapshot(self) -> bool:
        # the barrier leaves once every call started before it is emitted: nothing in flight
        # is part of a snapshot
        return self._take() and self.calls.idle

    def complete(self) -> bool:
        return self._take() and self.calls.idle
