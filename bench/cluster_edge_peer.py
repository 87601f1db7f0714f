"""The two processes of the edge benchmark of ``python -m bench cluster``.

One process sends chunks over one member-to-member stream, the other receives them, each in a
process of its own (two GILs, as two members have). Three ways of moving the same chunks:

- ``edge``: :class:`~jetwake.engine.cluster.network_edges.EdgeTransport` between two
  :class:`~jetwake.engine.cluster.peer_network.PeerNetwork` instances: the sender's
  ``RemoteQueue.offer`` serializes each chunk (``dumps``), the connection's writer packs and
  writes, the receiver's reader decodes (``loads``) into the queue that the receiving loop
  drains (as a downstream processor would), acks flow back every 20 ms;
- ``raw``: a plain socket loop doing the same work by hand: ``dumps`` and one length-prefixed
  ``sendall`` per chunk, ``recv`` and ``loads`` per frame;
- ``raw-bytes``: the same loop sending chunks serialized before the clock starts and not
  decoding them: what loopback TCP moves when serialization costs nothing.

Each receiver reports the wall time of its first entry and of the end; the benchmark divides
by the time from the sender's start to the receiver's end (same host, same clock).
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

_LEN = struct.Struct(">I")
TOKEN = "bench-edge-token"
CLUSTER = "bench-edge"
EXEC_KEY = "bench-exec"
STREAM = (0, 0, 1)
_DISTINCT_CHUNKS = 8


def make_chunks(shape: str, chunk_items: int) -> list[list]:
    """A few distinct chunks of ``shape``: ``tuples`` (an int and a short str each, the
    shape of keyed items) or ``bytes1k`` (1 KiB bytes values)."""
    chunks = []
    for c in range(_DISTINCT_CHUNKS):
        base = c * chunk_items
        if shape == "tuples":
            chunks.append([(base + i, f"v{base + i}") for i in range(chunk_items)])
        elif shape == "bytes1k":
            chunks.append([bytes([(base + i) % 251]) * 1024 for i in range(chunk_items)])
        else:
            raise ValueError(f"unknown shape {shape!r}: 'tuples' or 'bytes1k'")
    return chunks


def receive(pipe: Any, mode: str) -> None:
    """The receiving process: sends its address on ``pipe``, then its report."""
    if mode == "edge":
        _receive_edge(pipe)
    else:
        _receive_raw(pipe, decode=(mode == "raw"))


def _receive_edge(pipe: Any) -> None:
    from jetwake.engine.cluster.peer_network import PeerNetwork
    from jetwake.engine.core.stream_items import DONE

    net = PeerNetwork(CLUSTER, "receiver", TOKEN).start()
    try:
        q = net.edges.inbound_queue(EXEC_KEY, STREAM, "bench-in")
        pipe.send(net.address)
        items = entries = 0
        t_first = None
        popleft = q.popleft
        while True:
            if not q:
                time.sleep(0.0002)
                continue
            entry = popleft()
            if t_first is None:
                t_first = time.time()
            if entry is DONE:
                break
            items += len(entry)
            entries += 1
        t_done = time.time()
        pipe.send({"t_first": t_first, "t_done": t_done, "items": items, "entries": entries,
                   "stats": net.edges.stats()})
    finally:
        net.stop()


def _receive_raw(pipe: Any, decode: bool) -> None:
    from jetwake.engine.core.serialization import loads

    listener = socket.create_server(("127.0.0.1", 0))
    pipe.send(f"127.0.0.1:{listener.getsockname()[1]}")
    sock, _ = listener.accept()
    listener.close()
    buf = bytearray()
    items = entries = 0
    t_first = None
    done = False
    with sock:
        while not done:
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the sender closed before its end marker")
            if t_first is None:
                t_first = time.time()
            buf += data
            pos, end = 0, len(buf)
            while end - pos >= 4:
                (n,) = _LEN.unpack_from(buf, pos)
                if n == 0:  # the end marker
                    done = True
                    pos += 4
                    break
                if end - pos - 4 < n:
                    break
                if decode:
                    with memoryview(buf) as view:
                        items += len(loads(view[pos + 4:pos + 4 + n]))
                entries += 1
                pos += 4 + n
            if pos:
                del buf[:pos]
    pipe.send({"t_first": t_first, "t_done": time.time(), "items": items, "entries": entries})


def send(pipe: Any, mode: str, address: str, shape: str, chunk_items: int,
         chunk_count: int) -> None:
    """The sending process: waits for ``"go"`` on ``pipe``, sends ``chunk_count`` chunks,
    then reports the wall time it started and the serialized bytes it sent."""
    from jetwake.engine.core.serialization import dumps

    chunks = make_chunks(shape, chunk_items)
    serialized = [dumps(c) for c in chunks]
    payload = sum(len(serialized[i % len(chunks)]) for i in range(chunk_count))
    if mode == "edge":
        _send_edge(pipe, address, chunks, chunk_count, payload)
    else:
        _send_raw(pipe, address, chunks, serialized, chunk_count, payload,
                  encode=(mode == "raw"))


def _send_edge(pipe: Any, address: str, chunks: list, count: int, payload: int) -> None:
    from jetwake.engine.cluster.peer_network import PeerNetwork
    from jetwake.engine.core.stream_items import DONE

    net = PeerNetwork(CLUSTER, "sender", TOKEN).start()
    try:
        rq = net.edges.remote_queue(EXEC_KEY, STREAM, "receiver", address)
        pipe.recv()  # "go"
        t_start = time.time()
        offer = rq.offer
        n = len(chunks)
        for i in range(count):
            chunk = chunks[i % n]
            while not offer(chunk):  # the window is full: as an outbound edge retries later
                time.sleep(0.0002)
        while not offer(DONE):
            time.sleep(0.0002)
        pipe.send({"t_start": t_start, "payload_bytes": payload})
        pipe.recv()  # "stop", once the receiver has everything
    finally:
        net.stop()


def _send_raw(pipe: Any, address: str, chunks: list, serialized: list[bytes], count: int,
              payload: int, encode: bool) -> None:
    from jetwake.engine.core.serialization import dumps

    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pack = _LEN.pack
    sendall = sock.sendall
    n = len(chunks)
    with sock:
        pipe.recv()  # "go"
        t_start = time.time()
        for i in range(count):
            data = dumps(chunks[i % n]) if encode else serialized[i % n]
            sendall(pack(len(data)) + data)
        sendall(pack(0))
        pipe.send({"t_start": t_start, "payload_bytes": payload})
        pipe.recv()  # "stop"
