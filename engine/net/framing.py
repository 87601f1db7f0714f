"""Frames on a socket: how the member service, its clients and peer members cut a TCP stream
into messages.

A frame is a 4-byte big-endian length followed by that many bytes (msgpack, see
:mod:`jetwake.engine.server.protocol`). A frame longer than the reader's limit is refused
before its body is read, so a peer cannot make the reader allocate more than the limit.
"""

from __future__ import annotations

import socket
import struct
import time

__all__ = ["FRAME_MAX_BYTES", "ProtocolError", "read_frame", "write_frame"]

#: the largest frame read from an authenticated peer (a submitted pipeline, a map's items)
FRAME_MAX_BYTES = 1 << 30
_LEN = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:  # the time left for the whole frame, not for this read
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline passed")
            sock.settimeout(left)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            if not buf:
                return None
            raise ProtocolError("connection closed in the middle of a frame")
        buf += chunk
    return bytes(buf)


def read_frame(sock: socket.socket, limit: int = FRAME_MAX_BYTES,
               deadline: float | None = None) -> bytes | None:
    """The next frame's bytes, or None when the peer closed the connection cleanly. With a
    ``deadline`` (a :func:`time.monotonic` time) the whole frame must arrive before it, or
    :class:`socket.timeout` is raised; the socket's timeout is left changed."""
    head = _recv_exact(sock, 4, deadline)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > limit:
        raise ProtocolError(f"frame of {n} bytes exceeds the limit of {limit} bytes")
    data = _recv_exact(sock, n, deadline)
    if data is None:
        raise ProtocolError("connection closed in the middle of a frame")
    return data


def write_frame(sock: socket.socket, data: bytes) -> None:
    """Sends ``data`` as one frame."""
    sock.sendall(_LEN.pack(len(data)) + data)
