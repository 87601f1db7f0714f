"""The member's listening ports, bound before it joins its cluster.

``jetwake member start`` binds its client port (and its metrics port) first, then starts the
member, whose peer listener takes a port the kernel chooses, and only then serves on the
sockets bound here. Bound in the other order, the kernel could hand the peer listener the very
port asked for the clients (it is free until bound), and the member would have joined its
cluster only to fail and leave it again; a port that is taken is also better refused before
the other members see a newcomer.

A bound socket does not listen yet: a client that connects before the member serves is
refused at once rather than left waiting in a queue.
"""

from __future__ import annotations

import socket
import socketserver

__all__ = ["bind_socket", "serve_on"]


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: one the kernel chooses), not listening.
    Raises OSError when the address cannot be bound (in use, not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # as socketserver does: a port left in TIME_WAIT by a member just stopped is reusable
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def serve_on(server: socketserver.TCPServer, sock: socket.socket) -> None:
    """Makes ``server`` (made with ``bind_and_activate=False``) accept on the bound ``sock``
    and starts listening on it."""
    server.socket.close()  # the unbound one socketserver made
    server.socket = sock
    server.server_address = sock.getsockname()
    server.server_activate()
