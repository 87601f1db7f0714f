"""The network between the members of a cluster: calls, one-way messages and edge data.

Each member runs one :class:`PeerNetwork`: a listener (loopback by default) and the connections
to its peers, every one authenticated with the cluster token before anything from the peer is
decoded (``engine/cluster/peer_link.py``). What a member initiates (calls, one-way messages,
the data of its distributed edges) goes over the one connection it opens to that peer, made on
first use and made again when it broke; replies and flow-control acks go back on the connection
the request or the data came on.

Each connection has a reader thread and a writer thread. The writer drains a send queue: what
callers queue (already encoded, on their own thread) goes out in few socket writes, many
messages and many edge entries together, so a caller never waits on the socket. The reader
decodes frames and hands them on without ever blocking on anything but the socket: replies
complete the waiting call, calls run on a small thread pool (a slow call never stalls data),
one-way messages go to one dispatch thread (so they keep their order), edge packets go into
their queues (``engine/cluster/network_edges.py``).

Messages are msgpack frames (a 4-byte length, then the body), encoded with jetwake's own
serialization, so tuples, datetimes and registered classes survive and bytes (a job definition
the caller serialized itself) pass through untouched. Nothing from a peer is ever unpickled.

- a call: ``[TAG_CALL, call_id, method, args]``, answered by
  ``[TAG_REPLY, call_id, True, result]`` or
  ``[TAG_REPLY, call_id, False, [type, message, restartable]]`` (the called member's verdict
  on its own error, :func:`is_restartable_cause`: the caller never judges an error by name);
- a one-way message: ``[TAG_MESSAGE, kind, payload]``;
- edge packets and acks: see ``engine/cluster/network_edges.py``.
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
import struct
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from jetwake.engine.cluster.network_edges import (PACKET_TARGET_BYTES, TAG_ACKS, TAG_PACKET,
                                                  EdgeTransport)
from jetwake.engine.cluster.peer_link import PeerLink, PeerRefusedError, accept_peer, connect_peer
from jetwake.engine.core.errors import JetwakeError, RemoteCallError, is_restartable_cause
from jetwake.engine.core.serialization import dumps, loads
from jetwake.engine.net.framing import FRAME_MAX_BYTES

__all__ = ["PeerNetwork", "PeerCallError", "PeerUnreachableError", "PeerNotReachedError",
           "CONNECT_TIMEOUT"]

log = logging.getLogger("jetwake.cluster")

CONNECT_TIMEOUT = 10.0
"""Seconds a connection (TCP and the token handshake) may take by default before the peer
counts as unreachable. A peer that stops while a connection to it is being made can leave it
half-open (the connecting side believes it connected, the other side never answers), so this
is also how long such a connection can take to fail."""

TAG_CALL = 0
TAG_REPLY = 1
TAG_MESSAGE = 2

_WRITE_TARGET_BYTES = 4 << 20  # one socket write takes up to about this much
_RECV_BYTES = 1 << 20
_LEN = struct.Struct(">I")


class PeerCallError(RemoteCallError):
    """The peer's handler raised: ``remote_type`` is its exception's type name, the message
    names the member and the method, ``restartable`` is the peer's verdict on its error."""


class PeerUnreachableError(JetwakeError):
    """The peer could not be reached, refused this member, or its connection broke before it
    answered. Restartable: a job that failed with it may run again once the cluster settles."""

    restartable = True


class PeerNotReachedError(PeerUnreachableError):
    """A call that never left this member: no connection to the peer could be made (refused,
    no route). The peer cannot have acted on it, so asking again, or asking another member,
    is safe whatever the call does."""


class _PendingCall:
    __slots__ = ("method", "done", "result", "error")

    def __init__(self, method: str) -> None:
        self.method = method
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class _ConnectionClosed(Exception):
    """A call was to be queued on a connection that has just closed: take a new one."""


class _Connection:
    """One authenticated connection to a peer, with its reader and writer threads.

    An outgoing connection is created unconnected: its writer thread connects first, so that
    queueing on it never blocks the caller; what was queued meanwhile goes out once connected.
    """

    def __init__(self, net: PeerNetwork, peer_id: str, address: str,
                 link: PeerLink | None = None) -> None:
        self.net = net
        self.peer_id = peer_id
        self.address = address
        self.outgoing = link is None
        self.link = link
        self.closed = False
        self.connected = link is not None  # the handshake has succeeded
        self.reason = ""
        self._out: deque = deque()
        self._wake = threading.Event()
        self._pending: dict[int, _PendingCall] = {}
        self._lock = threading.Lock()
        role = "to" if self.outgoing else "from"
        self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                        name=f"jetwake-peer-writer-{role}-{peer_id}")
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"jetwake-peer-reader-{role}-{peer_id}")

    def __repr__(self) -> str:
        role = "to" if self.outgoing else "from"
        return f"<connection {role} member {self.peer_id} at {self.address}>"

    # --- queueing (any thread) -------------------------------------------------------------------

    def enqueue_frame(self, body: bytes) -> None:
        self._out.append(body)
        if not self._wake.is_set():
            self._wake.set()

    def enqueue_entry(self, entry: tuple) -> None:
        self._out.append(entry)
        if not self._wake.is_set():
            self._wake.set()

    def register_call(self, call_id: int, method: str) -> _PendingCall:
        pending = _PendingCall(method)
        with self._lock:
            if self.closed:
                raise _ConnectionClosed()
            self._pending[call_id] = pending
        return pending

    def forget_call(self, call_id: int) -> None:
        with self._lock:
            self._pending.pop(call_id, None)

    def broken_error(self, what: str) -> PeerUnreachableError:
        return PeerUnreachableError(f"{what} needs the connection to member {self.peer_id} at "
                                    f"{self.address}, which broke: {self.reason}")

    # --- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._writer.start()
        if not self.outgoing:
            self._reader.start()

    def close(self, reason: str) -> None:
        """Closes the connection once; calls waiting for a reply fail with ``reason``."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.reason = reason
            pending, self._pending = self._pending, {}
        queued = list(self._out)  # one step under the GIL, while callers may still append
        self._out.clear()
        lost = sum(1 for x in queued if type(x) is bytes)
        if self.link is not None:
            try:
                self.link.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.link.close()
        self._wake.set()
        # before the handshake nothing queued has left this member: the peer never saw it
        error = PeerUnreachableError if self.connected else PeerNotReachedError
        for call in pending.values():
            call.error = error(f"member {self.peer_id} at {self.address} could not answer call "
                               f"'{call.method}': {reason}")
            call.done.set()
        self.net._forget_connection(self)
        self.net._connection_lost(self.peer_id)
        if self.net.stopping:
            log.debug("closed %r: %s", self, reason)
        else:
            log.info("closed %r: %s%s", self, reason,
                     f" (queued messages lost: {lost})" if lost else "")

    def join(self, timeout: float) -> None:
        for t in (self._writer, self._reader):
            if t.is_alive() and t is not threading.current_thread():
                t.join(timeout)

    # --- the writer ------------------------------------------------------------------------------

    def _connect(self) -> bool:
        net = self.net
        try:
            link = connect_peer(self.address, net.token, net.cluster, net.member_id,
                                timeout=net.connect_timeout)
        except PeerRefusedError as e:
            why = f"the connection to member {self.peer_id} at {self.address} was refused: {e}"
            net._note_refusal(why)
            self.close(why)
            return False
        except (OSError, ValueError) as e:
            self.close(f"cannot connect to member {self.peer_id} at {self.address}: {e}")
            return False
        if link.peer_id != self.peer_id:
            link.close()
            self.close(f"the member at {self.address} is '{link.peer_id}', not "
                       f"'{self.peer_id}' (a stale address?)")
            return False
        _tune(link.sock)
        with self._lock:
            if self.closed:  # closed (stop, disconnect) while connecting
                link.close()
                return False
            self.link = link
            self.connected = True
        self._reader.start()
        return True

    def _write_loop(self) -> None:
        if self.outgoing and not self._connect():
            return
        out = self._out
        wake = self._wake
        sock = self.link.sock  # type: ignore[union-attr]
        edges = self.net.edges
        peer_id = self.peer_id
        pack = _LEN.pack
        while True:
            wake.wait()
            wake.clear()
            if self.closed:
                return
            parts: list[bytes] = []
            size = 0
            batch: list[tuple] = []
            batch_bytes = 0
            while out and size < _WRITE_TARGET_BYTES:
                x = out.popleft()
                if type(x) is tuple:
                    batch.append(x)
                    batch_bytes += x[2]
                    if batch_bytes < PACKET_TARGET_BYTES:
                        continue
                    body = edges.pack_packet(batch, peer_id)
                    batch, batch_bytes = [], 0
                else:
                    if batch:  # what was queued before this message goes first
                        packet = edges.pack_packet(batch, peer_id)
                        parts.append(pack(len(packet)))
                        parts.append(packet)
                        size += len(packet)
                        batch, batch_bytes = [], 0
                    body = x
                parts.append(pack(len(body)))
                parts.append(body)
                size += len(body)
            if batch:
                packet = edges.pack_packet(batch, peer_id)
                parts.append(pack(len(packet)))
                parts.append(packet)
            if out:  # stopped at the write target: go round again after this write
                wake.set()
            try:
                sock.sendall(b"".join(parts))
            except OSError as e:
                self.close(f"writing to the peer failed: {e}")
                return

    # --- the reader ------------------------------------------------------------------------------

    def _read_loop(self) -> None:
        sock = self.link.sock  # type: ignore[union-attr]
        buf = bytearray()
        reason = "the peer closed the connection"
        try:
            while True:
                chunk = sock.recv(_RECV_BYTES)
                if not chunk:
                    break
                buf += chunk
                pos = 0
                end = len(buf)
                while end - pos >= 4:
                    (n,) = _LEN.unpack_from(buf, pos)
                    if n > FRAME_MAX_BYTES:
                        raise _ProtocolViolation(f"a frame of {n} bytes exceeds the limit")
                    if end - pos - 4 < n:
                        break
                    with memoryview(buf) as view:
                        message = loads(view[pos + 4:pos + 4 + n])
                    self._dispatch(message, n + 4)
                    pos += 4 + n
                if pos:
                    del buf[:pos]
        except OSError as e:
            reason = f"reading from the peer failed: {e}" if not self.closed else self.reason
        except _ProtocolViolation as e:
            reason = f"the peer broke the protocol: {e}"
            log.error("member %s sent something that is not this protocol: %s", self.peer_id, e)
        except Exception as e:  # noqa: BLE001 - an undecodable frame ends the connection
            reason = f"a message from the peer could not be handled: {e!r}"
            log.exception("a message from member %s could not be handled", self.peer_id)
        self.close(reason)

    def _dispatch(self, message: Any, frame_bytes: int) -> None:
        if type(message) is not list or not message:
            raise _ProtocolViolation(f"a message is a non-empty array, got {type(message)}")
        tag = message[0]
        if tag == TAG_PACKET:
            self.net.edges.on_packet(self, message[1], frame_bytes)
        elif tag == TAG_ACKS:
            self.net.edges.on_acks(self, message[1])
        elif tag == TAG_REPLY:
            _, call_id, ok, value = message
            with self._lock:
                call = self._pending.pop(call_id, None)
            if call is None:
                return  # the caller gave up waiting (timeout)
            if ok:
                call.result = value
            else:
                remote_type, text, restartable = value
                call.error = PeerCallError(
                    remote_type, f"call '{call.method}' on member {self.peer_id} raised "
                                 f"{remote_type}: {text}", bool(restartable))
            call.done.set()
        elif tag == TAG_CALL:
            _, call_id, method, args = message
            self.net._serve_call(self, call_id, method, args)
        elif tag == TAG_MESSAGE:
            _, kind, payload = message
            self.net._messages.put((self.peer_id, kind, payload))
        else:
            raise _ProtocolViolation(f"unknown message tag {tag!r}")


class _ProtocolViolation(Exception):
    pass


def _tune(sock: socket.socket) -> None:
    """No Nagle delay (the writer batches already), and keepalive probes, so that a connection
    to a host that vanished without closing it is noticed even when nothing is being sent."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class PeerNetwork:
    """One member's end of the cluster network: listener, connections, calls, messages and
    the data plane of distributed edges (:attr:`edges`)."""

    def __init__(self, cluster: str, member_id: str, token: str | None, *,
                 host: str = "127.0.0.1", port: int = 0, advertise: str | None = None,
                 call_threads: int = 8, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        if not isinstance(cluster, str) or not cluster:
            raise ValueError(f"PeerNetwork: cluster must be a non-empty string, got {cluster!r}")
        if not isinstance(member_id, str) or not member_id:
            raise ValueError(f"PeerNetwork: member_id must be a non-empty string, "
                             f"got {member_id!r}")
        if token is not None and not isinstance(token, str):
            raise TypeError("PeerNetwork: token must be a string or None")
        if type(port) is not int or not 0 <= port <= 65535:
            raise ValueError(f"PeerNetwork: port must be an int in [0, 65535], got {port!r}")
        if type(call_threads) is not int or call_threads < 1:
            raise ValueError(f"PeerNetwork: call_threads must be an int >= 1, "
                             f"got {call_threads!r}")
        if not isinstance(connect_timeout, (int, float)) or connect_timeout <= 0:
            raise ValueError(f"PeerNetwork: connect_timeout must be a number of seconds > 0, "
                             f"got {connect_timeout!r}")
        if advertise is not None and (not isinstance(advertise, str) or not advertise):
            raise ValueError(f"PeerNetwork: advertise must be 'host' or 'host:port', "
                             f"got {advertise!r}")
        self.cluster = cluster
        self.member_id = member_id
        self.token = token
        self.host = host
        self.port = port
        self._advertise = advertise
        self._call_threads = call_threads
        self.connect_timeout = float(connect_timeout)
        self.address = ""
        self.refused = 0
        self.last_refusal: str | None = None
        self.stopping = False
        self.edges = EdgeTransport(self._outgoing)
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._outgoing_conns: dict[str, _Connection] = {}
        self._incoming_conns: dict[str, set[_Connection]] = {}
        self._call_handler: Callable[[str, str, list], Any] | None = None
        self._message_handlers: dict[str, Callable[[str, Any], None]] = {}
        self._lost_handler: Callable[[str], None] | None = None
        self._unhandled_kinds: set[str] = set()
        self._messages: queue.SimpleQueue = queue.SimpleQueue()
        self._message_thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._call_ids = itertools.count(1)

    # --- life cycle ------------------------------------------------------------------------------

    def start(self) -> PeerNetwork:
        """Binds the listener and starts accepting peers; :attr:`address` is then valid."""
        if self._listener is not None or self.stopping:
            raise RuntimeError(f"PeerNetwork of member {self.member_id} was already started")
        try:
            listener = socket.create_server((self.host, self.port))
        except OSError as e:
            raise OSError(e.errno, f"member {self.member_id} cannot listen for peers on "
                                   f"{self.host}:{self.port}: {e.strerror}; choose another "
                                   "host or port") from e
        self._listener = listener
        port = listener.getsockname()[1]
        advertise = self._advertise
        if advertise is None:
            self.address = f"{self.host}:{port}"
        else:  # "host:port" as given, or "host" with the port bound
            host, sep, given = advertise.rpartition(":")
            has_port = sep and given.isdigit() and (":" not in host or host.endswith("]"))
            self.address = advertise if has_port else f"{advertise}:{port}"
        self._pool = ThreadPoolExecutor(self._call_threads,
                                        thread_name_prefix=f"jetwake-peer-calls-{self.member_id}")
        self._message_thread = threading.Thread(target=self._message_loop, daemon=True,
                                                name=f"jetwake-peer-messages-{self.member_id}")
        self._message_thread.start()
        self.edges.start()
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name=f"jetwake-peer-accept-{self.member_id}")
        self._accept_thread.start()
        log.info("member %s listens for peers on %s", self.member_id, self.address)
        return self

    def stop(self) -> None:
        """Closes the listener and every connection and joins the threads."""
        if self.stopping:
            return
        self.stopping = True
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in progress
            except OSError:
                pass
            self._listener.close()
        with self._lock:
            conns = list(self._outgoing_conns.values())
            for group in self._incoming_conns.values():
                conns.extend(group)
        for conn in conns:
            conn.close(f"member {self.member_id} stopped")
        self.edges.stop()
        self._messages.put(None)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for t in (self._accept_thread, self._message_thread):
            if t is not None and t is not threading.current_thread():
                t.join(5)
        for conn in conns:
            conn.join(5)

    def __enter__(self) -> PeerNetwork:
        return self.start() if self._listener is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- handlers --------------------------------------------------------------------------------

    def set_call_handler(self, handler: Callable[[str, str, list], Any]) -> None:
        """``handler(peer_id, method, args) -> result`` serves the calls peers make; it runs
        on a thread pool of ``call_threads``, never on a connection's reader."""
        if not callable(handler):
            raise TypeError("set_call_handler: handler must be a callable "
                            "(peer_id, method, args) -> result")
        self._call_handler = handler

    def set_lost_handler(self, handler: Callable[[str], None]) -> None:
        """``handler(peer_id)`` is called, on the thread that noticed, whenever a connection
        to or from a peer closes while this network runs (the peer's process may be gone):
        it must return at once."""
        self._lost_handler = handler

    def _connection_lost(self, peer_id: str) -> None:
        handler = self._lost_handler
        if handler is None or self.stopping:
            return
        try:
            handler(peer_id)
        except Exception:  # noqa: BLE001 - a hint only: the connection is closed regardless
            log.debug("the lost-connection handler failed for %s", peer_id, exc_info=True)

    def set_message_handler(self, kind: str, fn: Callable[[str, Any], None]) -> None:
        """``fn(peer_id, payload)`` receives the one-way messages of ``kind``, in order, on one
        dispatch thread."""
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"set_message_handler: kind must be a non-empty string, "
                             f"got {kind!r}")
        if not callable(fn):
            raise TypeError("set_message_handler: fn must be a callable (peer_id, payload)")
        self._message_handlers[kind] = fn

    # --- calls and messages ----------------------------------------------------------------------

    def call(self, peer_id: str, address: str, method: str, args: list,
             timeout: float = 30.0) -> Any:
        """Calls ``method`` on member ``peer_id`` and returns its handler's result.

        Raises :class:`PeerCallError` when the remote handler raised, and
        :class:`PeerUnreachableError` when the peer cannot be reached, refuses this member, its
        connection broke before the reply, or ``timeout`` seconds passed.
        """
        if not isinstance(method, str) or not method:
            raise ValueError(f"call: method must be a non-empty string, got {method!r}")
        if not isinstance(args, list):
            raise TypeError(f"call: args must be a list, got {type(args).__qualname__}")
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"call: timeout must be a number of seconds > 0, got {timeout!r}")
        call_id = next(self._call_ids)
        body = dumps([TAG_CALL, call_id, method, args])  # a bad argument fails here, at once
        pending = None
        for _ in range(2):
            conn = self._outgoing(peer_id, address)
            try:
                pending = conn.register_call(call_id, method)
            except _ConnectionClosed:
                if conn.connected:
                    continue  # an established connection broke just now: try a new one
                break  # the connection made for this call failed already: that is the answer
            conn.enqueue_frame(body)
            break
        if pending is None:
            raise PeerNotReachedError(f"member {peer_id} at {address} could not answer call "
                                      f"'{method}': {conn.reason}")
        if not pending.done.wait(timeout):
            conn.forget_call(call_id)
            raise PeerUnreachableError(f"member {peer_id} at {address} did not answer call "
                                       f"'{method}' within {timeout} s")
        if pending.error is not None:
            raise pending.error
        return pending.result

    def send(self, peer_id: str, address: str, kind: str, payload: Any) -> None:
        """Queues a one-way message for ``set_message_handler(kind, ...)`` on the peer; never
        waits on the socket. Messages to one peer arrive in the order sent; those queued on a
        connection that breaks are lost (and logged)."""
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"send: kind must be a non-empty string, got {kind!r}")
        body = dumps([TAG_MESSAGE, kind, payload])
        self._outgoing(peer_id, address).enqueue_frame(body)

    def disconnect(self, peer_id: str) -> None:
        """Drops every connection to ``peer_id`` (a member that left); calls waiting on them
        fail with :class:`PeerUnreachableError`."""
        with self._lock:
            conns = list(self._incoming_conns.get(peer_id, ()))
            out = self._outgoing_conns.get(peer_id)
            if out is not None:
                conns.append(out)
        for conn in conns:
            conn.close(f"member {peer_id} was disconnected by member {self.member_id}")
        for conn in conns:
            conn.join(5)

    def peers(self) -> dict[str, dict[str, int]]:
        """The open connections by peer: ``{peer_id: {"outgoing": 0 or 1, "incoming": n}}``
        (for metrics and to see when a broken connection has been noticed)."""
        with self._lock:
            result = {p: {"outgoing": 1, "incoming": 0} for p, c in
                      self._outgoing_conns.items() if not c.closed}
            for p, group in self._incoming_conns.items():
                open_ = sum(1 for c in group if not c.closed)
                if open_:
                    result.setdefault(p, {"outgoing": 0, "incoming": 0})["incoming"] = open_
            return result

    # --- connections -------------------------------------------------------------------------

    def _outgoing(self, peer_id: str, address: str) -> _Connection:
        """This member's connection to ``peer_id``, made (without waiting) when there is none,
        the last one broke, or the peer's address changed."""
        if not isinstance(peer_id, str) or not peer_id:
            raise ValueError(f"peer_id must be a non-empty string, got {peer_id!r}")
        if not isinstance(address, str) or ":" not in address:
            raise ValueError(f"the address of member {peer_id} must be 'host:port', "
                             f"got {address!r}")
        if self._listener is None or self.stopping:
            raise RuntimeError(f"the PeerNetwork of member {self.member_id} is not running: "
                               "call start() before talking to peers")
        stale = None
        with self._lock:
            conn = self._outgoing_conns.get(peer_id)
            if conn is not None and not conn.closed:
                if conn.address == address:
                    return conn
                stale = conn
            conn = _Connection(self, peer_id, address)
            self._outgoing_conns[peer_id] = conn
        if stale is not None:
            stale.close(f"member {peer_id} moved to {address}")
        conn.start()
        return conn

    def _forget_connection(self, conn: _Connection) -> None:
        with self._lock:
            if conn.outgoing:
                if self._outgoing_conns.get(conn.peer_id) is conn:
                    del self._outgoing_conns[conn.peer_id]
            else:
                group = self._incoming_conns.get(conn.peer_id)
                if group is not None:
                    group.discard(conn)
                    if not group:
                        del self._incoming_conns[conn.peer_id]

    def _note_refusal(self, why: str) -> None:
        self.refused += 1
        self.last_refusal = why
        log.warning("member %s: %s", self.member_id, why)

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self.stopping:
            try:
                sock, _ = listener.accept()
            except OSError as e:
                if self.stopping:
                    return
                log.warning("member %s: accepting a peer failed: %s", self.member_id, e)
                continue
            threading.Thread(target=self._handshake, args=(sock,), daemon=True,
                             name=f"jetwake-peer-handshake-{self.member_id}").start()

    def _handshake(self, sock: socket.socket) -> None:
        try:
            where = "%s:%s" % sock.getpeername()[:2]
        except OSError:
            sock.close()
            return
        try:
            link = accept_peer(sock, self.token, self.cluster, self.member_id,
                               timeout=self.connect_timeout)
        except PeerRefusedError as e:
            self._note_refusal(f"refused the peer at {where}: {e}")
            return
        except Exception as e:  # noqa: BLE001 - a peer that vanished mid-handshake, say
            log.info("member %s: the handshake with %s failed: %s", self.member_id, where, e)
            return
        _tune(link.sock)
        conn = _Connection(self, link.peer_id, link.peer_address, link)
        with self._lock:
            if self.stopping:
                link.close()
                return
            self._incoming_conns.setdefault(link.peer_id, set()).add(conn)
        conn.start()

    # --- serving ---------------------------------------------------------------------------------

    def _serve_call(self, conn: _Connection, call_id: int, method: str, args: list) -> None:
        pool = self._pool
        if pool is None or self.stopping:
            return
        try:
            pool.submit(self._run_call, conn, call_id, method, args)
        except RuntimeError:  # the pool shut down: this member is stopping
            pass

    def _run_call(self, conn: _Connection, call_id: int, method: str, args: list) -> None:
        handler = self._call_handler
        try:
            if handler is None:
                raise LookupError(f"member {self.member_id} has no call handler (yet)")
            body = dumps([TAG_REPLY, call_id, True, handler(conn.peer_id, method, args)])
        except Exception as e:  # noqa: BLE001 - the caller gets it as a PeerCallError
            log.debug("call '%s' from member %s raised %r", method, conn.peer_id, e)
            body = dumps([TAG_REPLY, call_id, False,
                          [type(e).__name__, str(e), is_restartable_cause(e)]])
        if not conn.closed:
            conn.enqueue_frame(body)

    def _message_loop(self) -> None:
        while True:
            item = self._messages.get()
            if item is None:
                return
            peer_id, kind, payload = item
            fn = self._message_handlers.get(kind)
            if fn is None:
                if kind not in self._unhandled_kinds:
                    self._unhandled_kinds.add(kind)
                    log.warning("member %s got a '%s' message from member %s and has no "
                                "handler for that kind: dropped", self.member_id, kind, peer_id)
                continue
            try:
                fn(peer_id, payload)
            except Exception:  # noqa: BLE001 - one bad message must not stop the others
                log.exception("the handler of '%s' messages failed on one from member %s",
                              kind, peer_id)
