"""Calling a service from a stage: the rules that a member's processors
(``map_using_service.py``) and the Spark backfill (``engine/backfill/services.py``) share.

- :class:`ServiceLease`: a processor's hold on its stage's service, created by the stage's
  :class:`ServiceFactory` once per processor or once per member and job (reference-counted:
  destroyed when the last of the member's processors of the stage closes); the asynchronous
  stage's event loop, in a thread of its own, belongs to the service, so a service bound to its
  loop (an aiohttp session) is made, used and closed on that one loop.
- :func:`call_service`: one call of ``fn(service, item)`` under the stage's ``timeout_ms`` and
  tenacity ``retry`` policy; :func:`failure_record`: what ``errors_to`` receives for a call that
  failed for good; :func:`retry_policy`: the ``retry=`` a user may give, checked when the
  pipeline is built.
- :class:`AsyncCalls`: up to ``max_concurrent`` calls in flight on the loop, at most one per key
  in the grouped form, results taken in input order (``preserve_order``) or as they complete,
  and control items (watermarks) held until every call started before them is out.
- :class:`CallMetrics`: ``calls``, ``call_retries``, ``call_failures``, ``calls_in_flight``
  (a gauge) and the call latency histogram (``engine/execution/execution_metrics.py``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator

from jetwake.engine.core.errors import PipelineError
from jetwake.engine.execution.execution_metrics import LATENCY_SUM, latency_bucket_key
from jetwake.engine.operations.service_factory import ServiceError, ServiceFactory
from jetwake.engine.processors.event_time_base import short_repr

__all__ = ["ServiceLease", "EventLoopThread", "call_service", "failure_record", "retry_policy",
           "is_async_callable", "AsyncCalls", "CallMetrics", "DATA", "SIDE", "CONTROL",
           "call_sync", "HELD_PER_CALL"]

#: the kinds of what :meth:`AsyncCalls.take` gives
DATA, SIDE, CONTROL = "o", "e", "c"

#: the items a stage holds (in flight, waiting for their key, or done and waiting for their
#: turn in order) per call it may have in flight
HELD_PER_CALL = 4


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` gives a coroutine: an ``async def`` function, a
    ``functools.partial`` of one, or an object whose ``__call__`` is one."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - a callable object's method
    return call is not None and not inspect.isfunction(fn) and not inspect.ismethod(fn) \
        and inspect.iscoroutinefunction(call)


def retry_policy(retry: Any, where: str) -> Any:
    """The tenacity ``AsyncRetrying`` that ``retry=`` stands for, or None (one attempt):
    an ``AsyncRetrying``; a ``Retrying`` (its stop, wait, retry and callbacks, sleeping on the
    event loop instead of blocking it); or a dict of ``AsyncRetrying``'s keyword arguments
    (``{"stop": stop_after_attempt(3), "wait": wait_fixed(0.1)}``). Each call runs on a copy of
    it, so calls in flight together do not share its state."""
    if retry is None:
        return None
    import tenacity
    if isinstance(retry, tenacity.AsyncRetrying):
        return retry
    if isinstance(retry, tenacity.Retrying):
        return tenacity.AsyncRetrying(
            stop=retry.stop, wait=retry.wait, retry=retry.retry, before=retry.before,
            after=retry.after, before_sleep=retry.before_sleep, reraise=retry.reraise,
            retry_error_cls=retry.retry_error_cls,
            retry_error_callback=retry.retry_error_callback)
    if isinstance(retry, dict):
        try:
            return tenacity.AsyncRetrying(**retry)
        except TypeError as e:
            raise TypeError(f"{where}: retry={retry!r} is not a set of tenacity.AsyncRetrying "
                            f"keyword arguments ({e}); e.g. retry={{'stop': "
                            f"stop_after_attempt(3), 'wait': wait_fixed(0.1)}}") from None
    raise TypeError(f"{where}: retry expects a tenacity policy, e.g. tenacity.AsyncRetrying("
                    f"stop=stop_after_attempt(3), wait=wait_fixed(0.1)), or a dict of its "
                    f"keyword arguments; got {type(retry).__qualname__}")


# --- the service and its event loop -----------------------------------------------------------

class EventLoopThread:
    """An asyncio event loop running in a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, awaitable: Any) -> Any:
        """Runs ``awaitable`` on the loop and waits for its result (from another thread)."""
        async def wrap() -> Any:
            return await awaitable
        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result()

    def stop(self) -> None:
        """Cancels what still runs on the loop, stops it and closes it."""
        async def cancel_all() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=10)
        except Exception:  # noqa: BLE001 - stopping anyway
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class _ServiceCore:
    """A created service (and its event loop, for the asynchronous stage)."""

    def __init__(self, factory: ServiceFactory, stage: str, with_loop: bool) -> None:
        self.factory = factory
        self.stage = stage
        self.loop = EventLoopThread(f"jetwake-service-{stage}") if with_loop else None
        try:
            self.service = factory.create(stage, self.loop.run if self.loop else None)
        except BaseException:
            if self.loop is not None:
                self.loop.stop()
            raise

    def close(self) -> None:
        try:
            self.factory.destroy(self.service, self.stage,
                                 self.loop.run if self.loop else None)
        finally:
            if self.loop is not None:
                self.loop.stop()


# shared_per="member": (member, job, vertex) -> [core, processors holding it]
_shared: dict[tuple[Any, ...], list[Any]] = {}
_shared_lock = threading.Lock()


class ServiceLease:
    """One processor's hold on its stage's service: :attr:`service`, :attr:`loop` (the
    asynchronous stage's :class:`EventLoopThread`, else None); :meth:`close` releases it."""

    def __init__(self, factory: ServiceFactory, stage: str, context: Any,
                 with_loop: bool) -> None:
        self._key: tuple[Any, ...] | None = None
        if factory.shared_per == "member" and context is not None:
            key = (id(context.member), context.job_id, context.vertex_name,
                   context.member_index)
            with _shared_lock:  # processors of a member start one after another, or together
                held = _shared.get(key)
                if held is None:
                    held = _shared[key] = [_ServiceCore(factory, stage, with_loop), 0]
                held[1] += 1
            self._key = key
            self._core: _ServiceCore = held[0]
        else:
            self._core = _ServiceCore(factory, stage, with_loop)
        self.service = self._core.service
        self.loop = self._core.loop
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._key is not None:
            with _shared_lock:
                held = _shared[self._key]
                held[1] -= 1
                last = held[1] == 0
                if last:
                    del _shared[self._key]
            if not last:
                return
        self._core.close()


# --- one call -----------------------------------------------------------------------------------

def failure_record(stage: str, item: Any, error: BaseException, attempts: int) -> dict[str, Any]:
    """What ``errors_to`` receives for a call that failed for good: a dict naming the stage,
    the item, the error (its type and message) and the attempts made."""
    return {"stage": stage, "item": item, "error": f"{type(error).__name__}: {error}",
            "error_type": type(error).__name__, "attempts": attempts}


def call_failed(stage: str, item: Any, error: BaseException, attempts: int) -> ServiceError:
    """The error that fails the job for a call that failed for good, without ``errors_to``
    (the caller raises it ``from error``)."""
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    return ServiceError(f"stage {stage!r}: the service call for item {short_repr(item)} "
                        f"failed{tries}: {type(error).__name__}: {error} (give errors_to= a "
                        f"sink to route failed calls there instead of failing the job)")


class CallTimeout(TimeoutError):
    """A call that took longer than the stage's ``timeout_ms``."""


async def call_service(fn: Callable[..., Any], service: Any, item: Any,
                       timeout_s: float | None, retrying: Any) -> tuple[Any, BaseException | None,
                                                                        int]:
    """One call of ``await fn(service, item)``: each attempt bounded by ``timeout_s`` (a
    timeout is a failure, :class:`CallTimeout`), attempts as the tenacity policy ``retrying``
    says (None: one). Returns ``(result, None, attempts)`` or ``(None, error, attempts)``
    (the last attempt's error): a call never raises, but for a cancellation."""
    async def attempt() -> Any:
        if timeout_s is None:
            return await fn(service, item)
        try:
            return await asyncio.wait_for(fn(service, item), timeout_s)
        except asyncio.TimeoutError:
            raise CallTimeout(f"no answer within {timeout_s * 1000:g} ms (timeout_ms)") from None

    if retrying is None:
        try:
            return await attempt(), None, 1
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the stage routes or raises it
            return None, e, 1
    r = retrying.copy()
    try:
        result = await r(attempt)
        return result, None, _attempts(r)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001
        import tenacity
        if isinstance(e, tenacity.RetryError) and e.last_attempt.failed:
            cause = e.last_attempt.exception()
            if isinstance(cause, Exception):
                return None, cause, _attempts(r)
        return None, e, _attempts(r)


def _attempts(retrying: Any) -> int:
    return int(retrying.statistics.get("attempt_number", 1))


def call_sync(fn: Callable[..., Any], service: Any, item: Any) -> tuple[Any,
                                                                       BaseException | None,
                                                                       float]:
    """One call of ``fn(service, item)`` (the synchronous stage): ``(result, error, ms)``."""
    t0 = time.perf_counter()
    try:
        r = fn(service, item)
    except Exception as e:  # noqa: BLE001 - the stage routes or raises it
        return None, e, (time.perf_counter() - t0) * 1000
    return r, None, (time.perf_counter() - t0) * 1000


class CallMetrics:
    """The service metrics of a processor (``context.metrics``) or of a backfill task."""

    def __init__(self, metrics: dict[str, Any]) -> None:
        self.m = metrics
        for k in ("calls", "call_retries", "call_failures", "calls_in_flight", LATENCY_SUM):
            metrics.setdefault(k, 0)

    def done(self, ms: float, attempts: int, failed: bool) -> None:
        m = self.m
        m["calls"] += 1
        if attempts > 1:
            m["call_retries"] += attempts - 1
        if failed:
            m["call_failures"] += 1
        key = latency_bucket_key(ms)
        m[key] = m.get(key, 0) + 1
        m[LATENCY_SUM] += ms

    def in_flight(self, n: int) -> None:
        self.m["calls_in_flight"] = n


# --- many calls at once -------------------------------------------------------------------------

class _Call:
    __slots__ = ("ts", "item", "key", "done", "result", "error", "attempts", "ms", "taken")

    def __init__(self, ts: Any, item: Any, key: Any) -> None:
        self.ts = ts
        self.item = item
        self.key = key
        self.done = False
        self.taken = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.attempts = 0
        self.ms = 0.0


class _Control:
    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item


class AsyncCalls:
    """The calls of one processor (or one backfill task) on the service's event loop.

    :meth:`add` takes an item (with its event time, or None) while :meth:`has_room`; up to
    ``max_concurrent`` calls run at once, and with ``keyed`` at most one per key (the others of
    the key wait, in order, while other keys proceed). :meth:`take` gives what is ready, in
    input order with ``preserve_order`` (else each result as its call completes):
    ``(DATA, ts, result)``, ``(SIDE, None, failure record)`` when ``errors_to`` is set, and
    ``(CONTROL, None, item)`` for a control item added with :meth:`add_control` once every
    call added before it has been taken. A call that fails for good without ``errors_to``
    raises from :meth:`take`. Results and records are never None: a None result drops the
    item. Everything but the calls runs in the caller's thread; the loop only runs the calls
    and queues them as done.
    """

    def __init__(self, loop: EventLoopThread, service: Any, fn: Callable[..., Any], stage: str,
                 max_concurrent: int, preserve_order: bool, timeout_ms: int | None,
                 retrying: Any, keyed: bool, errors_to: bool, metrics: CallMetrics) -> None:
        self.loop = loop
        self.service = service
        self.fn = fn
        self.stage = stage
        self.max_concurrent = max_concurrent
        self.preserve_order = preserve_order
        self.timeout_s = None if timeout_ms is None else timeout_ms / 1000
        self.retrying = retrying
        self.keyed = keyed
        self.errors_to = errors_to
        self.metrics = metrics
        self.limit = max_concurrent * HELD_PER_CALL
        self.entries: deque[Any] = deque()  # _Call and _Control, in input order
        self.held = 0                        # calls added and not yet taken
        self.running = 0
        self._startable: deque[_Call] = deque()
        self._waiting: dict[Any, deque[_Call]] = {}  # key with a call running -> its next
        self._done: deque[_Call] = deque()  # appended by the loop's thread
        self.wakeup = threading.Event()

    def has_room(self) -> bool:
        return self.held < self.limit

    @property
    def idle(self) -> bool:
        """Nothing added is still held (every call and control item has been taken)."""
        return not self.entries

    def add(self, ts: Any, item: Any, key: Any = None) -> None:
        c = _Call(ts, item, key)
        self.entries.append(c)
        self.held += 1
        if self.keyed:
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.append(c)
                return
            self._waiting[key] = deque()
        self._startable.append(c)

    def add_control(self, item: Any) -> None:
        self.entries.append(_Control(item))

    def start(self) -> None:
        """Starts the calls that may run now (call it after adding a batch)."""
        batch = []
        while self._startable and self.running < self.max_concurrent:
            batch.append(self._startable.popleft())
            self.running += 1
        if batch:
            self.loop.loop.call_soon_threadsafe(self._start_on_loop, batch)
        self.metrics.in_flight(self.running)

    def _start_on_loop(self, batch: list[_Call]) -> None:
        loop = self.loop.loop
        for c in batch:
            loop.create_task(self._run(c))

    async def _run(self, c: _Call) -> None:
        t0 = time.perf_counter()
        c.result, c.error, c.attempts = await call_service(self.fn, self.service, c.item,
                                                           self.timeout_s, self.retrying)
        c.ms = (time.perf_counter() - t0) * 1000
        self._done.append(c)
        self.wakeup.set()

    def _collect(self) -> bool:
        """Marks the calls the loop finished as done and starts those that may run now."""
        done = self._done
        if not done:
            return False
        metrics = self.metrics
        while done:
            c = done.popleft()
            c.done = True
            self.running -= 1
            metrics.done(c.ms, c.attempts, c.error is not None)
            if self.keyed:
                waiting = self._waiting[c.key]
                if waiting:
                    self._startable.append(waiting.popleft())
                else:
                    del self._waiting[c.key]
        self.start()
        return True

    def take(self) -> Iterator[tuple[str, Any, Any]]:
        """What is ready now (see the class docstring)."""
        self._collect()
        entries = self.entries
        if not self.preserve_order:
            for c in entries:
                if type(c) is _Call and c.done and not c.taken:
                    c.taken = True
                    out = self._outcome(c)
                    if out is not None:
                        yield out
        while entries:
            c = entries[0]
            if type(c) is _Control:
                entries.popleft()
                yield CONTROL, None, c.item
                continue
            if not c.done:
                return
            entries.popleft()
            if not c.taken:
                c.taken = True
                out = self._outcome(c)
                if out is not None:
                    yield out

    def _outcome(self, c: _Call) -> tuple[str, Any, Any] | None:
        self.held -= 1
        if c.error is not None:
            if self.errors_to:
                return SIDE, None, failure_record(self.stage, c.item, c.error, c.attempts)
            raise call_failed(self.stage, c.item, c.error, c.attempts) from c.error
        if c.result is None:
            return None
        return DATA, c.ts, c.result

    def wait(self, timeout: float) -> None:
        """Blocks until a call completes or ``timeout`` seconds pass (the backfill's task)."""
        if not self._done:
            self.wakeup.wait(timeout)
        self.wakeup.clear()


def check_service_stage(where: str, factory: Any, fn: Any, want_async: bool) -> None:
    """The checks both service stages make when the pipeline is built."""
    if not isinstance(factory, ServiceFactory):
        raise TypeError(f"{where}: service_factory expects a jetwake.ServiceFactory("
                        f"create_fn, destroy_fn=None, shared_per='processor'), got "
                        f"{type(factory).__qualname__}")
    if not callable(fn):
        raise TypeError(f"{where}: fn expects a callable fn(service, item), got "
                        f"{type(fn).__qualname__}: {fn!r}")
    if want_async and not is_async_callable(fn):
        raise PipelineError(
            f"{where}: fn {_name(fn)} is a plain function, but map_using_service_async calls "
            "an async one; define it with `async def fn(service, item)`, or use "
            "map_using_service for a blocking function")
    if not want_async and is_async_callable(fn):
        raise PipelineError(
            f"{where}: fn {_name(fn)} is an async function, which map_using_service would "
            "never await; use map_using_service_async(service_factory, fn) for it")


def _name(fn: Any) -> str:
    return repr(getattr(fn, "__qualname__", None) or type(fn).__qualname__)
