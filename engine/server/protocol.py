"""The wire protocol between a member service and its clients (after the hello).

One TCP connection per client; one request and one response per frame
(:mod:`jetwake.engine.net.framing`):

* the client's first frame is its hello (:mod:`jetwake.engine.server.authentication`);
* then requests are ``{"op": NAME, "args": {...}}`` encoded with jetwake's msgpack
  serialization (tuples, datetimes, registered types; never pickle). A submitted pipeline
  travels as cloudpickle bytes inside a frame and is unpickled only on an authenticated
  connection. The operations are listed in :mod:`jetwake.engine.server.request_handlers`;
* responses are ``{"ok": True, "result": ...}`` or ``{"ok": False, "error": [TYPE, MESSAGE]}``;
  the client re-raises jetwake's errors (and Python's built-in ones) under the same class.
"""

from __future__ import annotations

from jetwake.engine.core.errors import JobNotFoundError

__all__ = ["PROTOCOL_VERSION", "DEFAULT_PORT", "version", "error_pair"]

PROTOCOL_VERSION = 1
DEFAULT_PORT = 5701


def version() -> str:
    """jetwake's version, as installed (sent in the hello and shown by ``jetwake cluster``)."""
    try:
        from importlib.metadata import version as _v
        return _v("jetwake")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "0.1.0"


def error_pair(e: BaseException) -> list[str]:
    """``[TYPE, MESSAGE]`` of an error, as a response carries it. A KeyError's message is its
    argument, not its repr (``'x'`` rather than ``"'x'"``)."""
    if isinstance(e, KeyError) and not isinstance(e, JobNotFoundError) and e.args:
        msg = str(e.args[0])
    else:
        msg = str(e)
    return [type(e).__name__, msg]
