"""``ServiceFactory``: how a stage that calls a service (``map_using_service``,
``map_using_service_async``) creates its service and destroys it.

A service is whatever the stage's function calls: an HTTP client, a connection pool, a loaded
model. It is created once per processor (``shared_per="processor"``) or once per member and
job, shared by the stage's processors on that member (``shared_per="member"``: one model in
memory instead of one per processor), in ``init``, and destroyed when the job ends (the
processor's ``close``, also after a failure or a cancellation; a shared one when its last
processor closes). ``create_fn`` and ``destroy_fn`` may be ``async def``: the asynchronous
stage runs them on its event loop (a client bound to an event loop, such as an aiohttp
session, must be made on the loop that uses it).

This module holds the factory's contract (the checks at construction, the calls with a clear
error); the processors in ``engine/processors/service_calls.py`` run it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from jetwake.engine.core.errors import JetwakeError

__all__ = ["ServiceFactory", "ServiceError", "SHARED_PER"]

SHARED_PER = ("processor", "member")


class ServiceError(JetwakeError):
    """A service could not be created or destroyed, or a call to it failed for good (the
    stage names the item and the cause, which is chained)."""


class ServiceFactory:
    """Creates the service of a ``map_using_service`` stage (see the module docstring).

    ``create_fn()`` returns the service; ``destroy_fn(service)``, when given, releases it;
    ``shared_per`` is "processor" (the default) or "member".
    """

    __slots__ = ("create_fn", "destroy_fn", "shared_per")

    def __init__(self, create_fn: Callable[[], Any],
                 destroy_fn: Callable[[Any], Any] | None = None,
                 shared_per: str = "processor") -> None:
        if not callable(create_fn):
            raise TypeError(f"ServiceFactory: create_fn must be a callable that returns the "
                            f"service, got {type(create_fn).__qualname__}: {create_fn!r}")
        if destroy_fn is not None and not callable(destroy_fn):
            raise TypeError(f"ServiceFactory: destroy_fn must be a callable taking the "
                            f"service (or None), got {type(destroy_fn).__qualname__}: "
                            f"{destroy_fn!r}")
        if shared_per not in SHARED_PER:
            raise ValueError(f"ServiceFactory: shared_per must be 'processor' (a service per "
                             f"processor) or 'member' (one per member, shared by the stage's "
                             f"processors there), got {shared_per!r}")
        self.create_fn = create_fn
        self.destroy_fn = destroy_fn
        self.shared_per = shared_per

    def create(self, stage: str, run: Callable[[Any], Any] | None = None) -> Any:
        """A new service; ``run`` completes an awaitable that an ``async`` create_fn returns
        (on the stage's event loop). A failure is a :class:`ServiceError` naming ``stage``,
        its cause chained."""
        try:
            service = self.create_fn()
            if inspect.isawaitable(service):
                if run is None:
                    raise TypeError("create_fn returned an awaitable (an async create_fn): "
                                    "only map_using_service_async runs it; give "
                                    "map_using_service a plain function")
                service = run(service)
        except Exception as e:
            raise ServiceError(f"stage {stage!r}: the service factory's create_fn failed: "
                               f"{type(e).__name__}: {e}") from e
        return service

    def destroy(self, service: Any, stage: str, run: Callable[[Any], Any] | None = None) -> None:
        """Destroys ``service`` with ``destroy_fn`` (nothing without one); a failure is a
        :class:`ServiceError` naming ``stage``."""
        if self.destroy_fn is None:
            return
        try:
            done = self.destroy_fn(service)
            if inspect.isawaitable(done):
                if run is None:
                    close = getattr(done, "close", None)
                    if close is not None:
                        close()  # never awaited: no "coroutine was never awaited" warning
                    raise TypeError("destroy_fn returned an awaitable (an async destroy_fn): "
                                    "only map_using_service_async runs it")
                run(done)
        except Exception as e:
            raise ServiceError(f"stage {stage!r}: the service factory's destroy_fn failed: "
                               f"{type(e).__name__}: {e}") from e

    def __repr__(self) -> str:
        name = getattr(self.create_fn, "__qualname__", repr(self.create_fn))
        return f"ServiceFactory({name}, shared_per={self.shared_per!r})"
