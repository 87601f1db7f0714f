"""The member service: a long-running member that clients drive over TCP.

:class:`MemberService` listens, accepts each connection on a thread of its own, has the client
authenticate (:mod:`jetwake.engine.server.authentication`) and then answers its requests
(:mod:`jetwake.engine.server.request_handlers`) frame by frame
(:mod:`jetwake.engine.net.framing`, :mod:`jetwake.engine.server.protocol`). Running a member
as a process, with signals and a graceful shutdown, is
:mod:`jetwake.engine.server.member_process`.

Jobs belong to the member, not to the connection: a client may disconnect while its jobs run.
"""

from __future__ import annotations

import logging
import os
import socket
import socketserver
import threading
import time
from typing import TYPE_CHECKING, Any, cast

from jetwake.engine.server.authentication import (
    HELLO_TIMEOUT_S, MAX_UNAUTHENTICATED, ConnectionGate, accept_hello, check_listen_address,
)
from jetwake.engine.net.framing import ProtocolError, read_frame, write_frame
from jetwake.engine.server.job_events import JobEvents
from jetwake.engine.server.listen_socket import serve_on
from jetwake.engine.server.protocol import DEFAULT_PORT, PROTOCOL_VERSION, version
from jetwake.engine.server.request_handlers import RequestHandlers

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.server.member import Member

__all__ = ["MemberService"]

log = logging.getLogger("jetwake.service")


class MemberService:
    """Serves one :class:`Member` to network clients (see the module docstring)."""

    # at most one warning per this many seconds about refused connections (a flood of them
    # must not flood the log too); the count is in ``refused_connections``
    REFUSAL_LOG_INTERVAL_S = 10.0

    def __init__(self, member: "Member", host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: str | None = None, *, hello_timeout: float = HELLO_TIMEOUT_S,
                 max_unauthenticated: int = MAX_UNAUTHENTICATED,
                 bound: socket.socket | None = None) -> None:
        """Binds ``host:port`` (port 0: any free port) and listens; :meth:`start` serves.
        ``bound``: a socket already bound to that address
        (:func:`~jetwake.engine.server.listen_socket.bind_socket`) to listen on instead.

        ``hello_timeout``: seconds a new connection has to deliver its whole hello.
        ``max_unauthenticated``: connections that may wait for their hello at once; the member
        closes further ones at once. Raises :class:`InsecureAddressError` (a ValueError) for a
        non-loopback ``host`` without a ``token``, ValueError for a bad limit, OSError when
        the address cannot be bound."""
        if isinstance(hello_timeout, bool) or not isinstance(hello_timeout, (int, float)) \
                or not 0 < hello_timeout < float("inf"):
            raise ValueError(f"hello_timeout must be a positive number of seconds, got "
                             f"{hello_timeout!r}")
        if isinstance(max_unauthenticated, bool) or not isinstance(max_unauthenticated, int) \
                or max_unauthenticated < 1:
            raise ValueError(f"max_unauthenticated must be a whole number >= 1, got "
                             f"{max_unauthenticated!r}")
        check_listen_address(host, token)
        self.member = member
        self.token = token or None
        self.hello_timeout = float(hello_timeout)
        self.max_unauthenticated = max_unauthenticated
        self.started = time.time()
        self.serving = False
        self._gate = ConnectionGate(max_unauthenticated, self.REFUSAL_LOG_INTERVAL_S)
        self.events = JobEvents(member)
        member.add_listener(self.events.on_event)
        self.handlers = RequestHandlers(member, self.member_info, lambda: self.serving,
                                        self.events.starts)
        # another member of a cluster hands this member's clients' requests over here
        member.forwarded_request_handler = \
            lambda frame, client: self.handlers.respond(frame, client, route=False)
        service = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                service._handle_connection(self.request, self.client_address)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            # the listen backlog: socketserver's default of 5 made the kernel drop most of a
            # burst of connecting clients (they retry after 1 s, 3 s, ... or give up)
            request_queue_size = socket.SOMAXCONN

            def process_request(self, request: Any, client_address: Any) -> None:
                # decided on the accepting thread: a refused connection costs no thread
                if not service._gate.admit(request, client_address, service.address_text):
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    service._gate.release()
                    raise

        self.server = Server((host, port), Handler, bind_and_activate=bound is None)
        if bound is not None:
            serve_on(self.server, bound)
        # (host, port): the hints allow a bytes host, a bound socket has a str one
        self.address = cast(tuple[str, int], self.server.server_address[:2])
        self._thread: threading.Thread | None = None

    @property
    def address_text(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    @property
    def unauthenticated_connections(self) -> int:
        """Connections accepted whose hello has not been answered yet."""
        return self._gate.waiting

    @property
    def refused_connections(self) -> int:
        """Connections closed at once because too many were waiting for their hello."""
        return self._gate.refused

    def start(self) -> "MemberService":
        """Accepts clients on a thread of its own; returns self."""
        self.serving = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="jetwake-service")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops accepting clients and closes the listening socket."""
        self.serving = False
        if self._thread is not None:  # shutdown() waits for serve_forever: only if it ran
            self.server.shutdown()
        self.server.server_close()

    def member_info(self) -> dict:
        """The member and its service, as ``ping`` and the hello's reply describe them."""
        counts: dict[str, int] = {}
        for c in self.member.coordinators():
            counts[c.status.value] = counts.get(c.status.value, 0) + 1
        return {"address": self.address_text, "version": version(),
                "protocol": PROTOCOL_VERSION, "pid": os.getpid(),
                "data_dir": self.member.data_dir, "started": self.started,
                "uptime_s": round(time.time() - self.started, 1), "jobs": counts,
                "token_required": self.token is not None,
                "refused_connections": self.refused_connections}

    # --- one connection --------------------------------------------------------------------

    def _handle_connection(self, sock: socket.socket, peer: Any) -> None:
        """Runs on the connection's own thread: the hello, then requests until the client
        leaves."""
        peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        waiting = True  # counted by the gate until the hello is answered
        try:
            authenticated = accept_hello(sock, peer_text, self.token, self.hello_timeout,
                                         self.member_info)
            waiting = False
            self._gate.release()
            if not authenticated:
                return
            log.debug("client %s connected", peer_text)
            sock.settimeout(None)  # once authenticated, a client may stay idle
            while True:
                data = read_frame(sock)
                if data is None:
                    return
                write_frame(sock, self.handlers.respond(data, peer_text))
        except (ProtocolError, socket.timeout) as e:
            log.warning("client %s: %s; closing the connection", peer_text, e or "timed out")
        except OSError as e:
            log.debug("client %s: connection lost: %r", peer_text, e)
        finally:
            if waiting:
                self._gate.release()
            try:
                sock.close()
            except OSError:
                pass
