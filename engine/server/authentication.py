"""Who may talk to a member: the hello, the token, and the limits on connections waiting for it.

* The client's FIRST frame must be ``{"op": "hello", "token": ..., "version": ...}``. It is
  read with a 64 KiB limit and decoded as plain msgpack (no extension types); the token is
  compared with :func:`hmac.compare_digest`. Nothing else is read from a client before its
  hello is accepted, and a wrong token closes the connection.
* The whole hello must arrive within ``hello_timeout`` seconds of the connection being
  accepted: one deadline, not a limit per read, so a client sending a byte now and then is
  closed all the same.
* At most ``max_unauthenticated`` connections may be waiting for their hello at once
  (:class:`ConnectionGate`); the member closes further ones at once, with one error reply.
* A member without a token serves anyone who reaches its port, and a submitted pipeline is
  code: so it only listens without a token on a loopback address (fail closed,
  :func:`check_listen_address`).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
import threading
import time
from typing import Any, Callable

import msgpack

from jetwake.engine.net.framing import ProtocolError, read_frame, write_frame

__all__ = ["HELLO_MAX_BYTES", "HELLO_TIMEOUT_S", "MAX_UNAUTHENTICATED", "InsecureAddressError",
           "is_loopback", "check_listen_address", "decode_hello", "token_matches",
           "accept_hello", "ConnectionGate"]

log = logging.getLogger("jetwake.service")

HELLO_MAX_BYTES = 64 * 1024
HELLO_TIMEOUT_S = 10.0
# Each connection waiting for its hello holds a thread (for hello_timeout at most): a burst of
# honest clients connecting at once stays well below this, a flood of silent ones is cut off.
MAX_UNAUTHENTICATED = 256


class InsecureAddressError(ValueError):
    """A member without a token was asked to listen on an address others can reach."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and the loopback addresses (127.0.0.0/8, ::1). Anything else,
    host names included, counts as reachable from the network: the check fails closed."""
    h = host.strip().lower()
    if h == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def check_listen_address(host: str, token: str | None) -> None:
    """Raises :class:`InsecureAddressError` when ``host`` is not a loopback address and there
    is no token: any client reaching the port could submit a pipeline, which is Python code
    run in the member."""
    if token or is_loopback(host):
        return
    shown = host if host else "all interfaces"
    raise InsecureAddressError(
        f"refusing to listen on {shown} without a token: anyone who can reach that address "
        "could run arbitrary code in this member (a submitted pipeline is Python code). "
        "Set a token with --token TOKEN or the JETWAKE_TOKEN environment variable (clients "
        "then need the same token), or listen on loopback only (--host 127.0.0.1)")


def decode_hello(data: bytes) -> dict:
    """The hello frame as a map; :class:`ProtocolError` for anything else (extension types
    included: nothing but plain msgpack is decoded before the token is checked)."""
    def no_ext(code: int, payload: bytes) -> Any:
        raise ProtocolError("extension types are not allowed in the hello frame")
    try:
        msg = msgpack.unpackb(data, raw=False, ext_hook=no_ext, max_bin_len=HELLO_MAX_BYTES,
                              max_str_len=HELLO_MAX_BYTES)
    except ProtocolError:
        raise
    except Exception as e:  # noqa: BLE001 - garbage from the network
        raise ProtocolError(f"the hello frame is not msgpack: {e}") from None
    if not isinstance(msg, dict) or msg.get("op") != "hello":
        raise ProtocolError("the first frame must be a hello")
    return msg


def token_matches(expected: str | None, given: Any) -> bool:
    """True when the member needs no token, or ``given`` is it (compared in constant time)."""
    if expected is None:
        return True
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def accept_hello(sock: socket.socket, peer: str, token: str | None, hello_timeout: float,
                 member_info: Callable[[], dict]) -> bool:
    """Reads and answers a new connection's hello. True when the client is authenticated
    (it got ``member_info()``); False when it left or was refused (it got one error reply).
    Raises :class:`ProtocolError` for a malformed hello and :class:`socket.timeout` when the
    whole hello did not arrive within ``hello_timeout`` seconds."""
    deadline = time.monotonic() + hello_timeout
    try:
        data = read_frame(sock, HELLO_MAX_BYTES, deadline)
    except socket.timeout:
        raise socket.timeout(f"no complete hello within {hello_timeout:g} s") from None
    if data is None:
        return False
    hello = decode_hello(data)
    # the reply is small; a client that does not read it gets the rest of its deadline
    sock.settimeout(max(deadline - time.monotonic(), 1.0))
    given = hello.get("token")
    if not token_matches(token, given):
        log.warning("client %s: rejected (%s token)", peer, "no" if not given else "wrong")
        # the member's words; the command line adds how to pass a token
        msg = "this member requires a token" if not given else "wrong token"
        write_frame(sock, msgpack.packb({"ok": False, "error": ["AuthenticationError", msg]}))
        return False
    write_frame(sock, msgpack.packb({"ok": True, "result": member_info()}))
    return True


class ConnectionGate:
    """Counts the connections waiting for their hello and refuses those beyond
    ``max_unauthenticated``, at once and without a thread: one error reply, then close.
    Refusals are counted and logged at most once per ``log_interval`` seconds (a flood of
    them must not flood the log too)."""

    def __init__(self, max_unauthenticated: int, log_interval: float = 10.0) -> None:
        self.max_unauthenticated = max_unauthenticated
        self.log_interval = log_interval
        self.refused = 0  # closed at once because too many were waiting
        self._waiting = 0  # connections accepted whose hello is not yet answered
        self._unlogged = 0  # refusals not yet reported in a log line
        self._next_log = 0.0
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Connections accepted whose hello has not been answered yet."""
        with self._lock:
            return self._waiting

    def admit(self, sock: socket.socket, peer: Any, address_text: str) -> bool:
        """Counts a new connection as waiting for its hello, or refuses it (one error reply,
        without blocking) when ``max_unauthenticated`` are already waiting. Each admitted
        connection must be :meth:`release`\\ d once its hello is answered or it is gone."""
        with self._lock:
            if self._waiting < self.max_unauthenticated:
                self._waiting += 1
                return True
            self.refused += 1
            self._unlogged += 1
            now = time.monotonic()
            report = now >= self._next_log
            if report:
                count, self._unlogged = self._unlogged, 0
                self._next_log = now + self.log_interval
        if report:
            peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
            log.warning("refused %d connection(s) (the latest from %s): %d clients are already "
                        "waiting to authenticate, the limit (--max-unauthenticated); %d refused "
                        "since the start", count, peer_text, self.max_unauthenticated,
                        self.refused)
        try:
            sock.setblocking(False)
            write_frame(sock, msgpack.packb({"ok": False, "error": [
                "MemberUnreachableError",
                f"the member at {address_text} is busy: {self.max_unauthenticated} "
                "connections are already waiting to authenticate; try again shortly"]}))
            # read what the client sent already, so that closing sends FIN rather than RST
            # (an RST may destroy the reply before the client reads it)
            sock.recv(HELLO_MAX_BYTES)
        except OSError:
            pass  # best effort: the connection is closed either way
        return False

    def release(self) -> None:
        """One admitted connection was authenticated, refused or closed."""
        with self._lock:
            self._waiting -= 1
