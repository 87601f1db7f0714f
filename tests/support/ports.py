"""Loopback ports for the member processes and services a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on now (the OS picks it; a test binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """``count`` different loopback ports nothing listens on now: held open together while
    the OS picks them, so that two servers started later never get the same one."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
