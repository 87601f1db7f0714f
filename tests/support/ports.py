"""Loopback ports for the member processes and services a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on now (the OS picks it; a test binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
