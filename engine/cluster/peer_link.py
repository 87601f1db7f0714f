"""The connection between two members: authenticated before anything is decoded.

Members exchange data (packets of many items per edge, barriers, watermarks, flow-control acks)
over one TCP connection per pair. Before any byte of a peer is decoded the two prove to each
other that they hold the cluster token, by a challenge and response over raw frames:

1. the accepting member sends a random 16-byte nonce;
2. the connecting member answers with a nonce of its own and
   ``HMAC-SHA256(token, "connect" + accepting nonce + connecting nonce)``;
3. the accepting member checks it (in constant time) and answers with
   ``HMAC-SHA256(token, "accept" + connecting nonce + accepting nonce)``, which the connecting
   member checks in turn.

Only then do both send a hello (msgpack: cluster name, member id, protocol version), and a
member of another cluster or an incompatible version is refused with a message that names the
difference, on both sides. Nothing from a peer is ever unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import threading
import time
from typing import Any

import msgpack

from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.net.framing import ProtocolError, read_frame, write_frame

__all__ = ["PeerLink", "PeerRefusedError", "PEER_PROTOCOL_VERSION", "connect_peer",
           "accept_peer", "nothing_listens"]

PEER_PROTOCOL_VERSION = 1
_NONCE = 16
_MAC = 32
_HANDSHAKE_LIMIT = 256  # bytes a handshake frame may have: nothing larger is read
_REFUSED = b"REFUSED:"
_OK = b"OK"


class PeerRefusedError(JetwakeError):
    """The connection between two members was refused; the message says why."""


def _mac(token: str | None, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new((token or "").encode(), label + first + second, hashlib.sha256).digest()


def _refuse(sock: socket.socket, why: str) -> None:
    try:
        write_frame(sock, _REFUSED + why.encode())
    except OSError:
        pass


def _read_raw(sock: socket.socket, deadline: float, what: str) -> bytes:
    try:
        data = read_frame(sock, _HANDSHAKE_LIMIT, deadline=deadline)
    except ProtocolError as e:
        raise PeerRefusedError(f"the peer's {what} is not a jetwake handshake: {e}") from e
    if data is None:
        raise PeerRefusedError(f"the peer closed the connection before its {what}")
    if data.startswith(_REFUSED):
        raise PeerRefusedError(f"the peer refused this member: {data[len(_REFUSED):].decode()}")
    return data


class PeerLink:
    """An authenticated connection to one peer member: ``send`` and ``receive`` msgpack
    messages (thread-safe sending; one reader)."""

    def __init__(self, sock: socket.socket, peer_id: str, peer_address: str) -> None:
        self.sock = sock
        self.peer_id = peer_id
        self.peer_address = peer_address
        self._send_lock = threading.Lock()

    def send(self, message: Any) -> None:
        data = msgpack.packb(message, use_bin_type=True)
        with self._send_lock:
            write_frame(self.sock, data)

    def receive(self) -> Any:
        """The next message, or None when the peer closed the connection."""
        data = read_frame(self.sock)
        if data is None:
            return None
        return msgpack.unpackb(data, raw=False, strict_map_key=False)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _exchange_hellos(sock: socket.socket, deadline: float, cluster: str, member_id: str,
                     version: int) -> dict:
    """Both sides send a hello, then a verdict on the other's (OK, or REFUSED with the
    reason), so that each side learns why when the other refuses."""
    write_frame(sock, msgpack.packb({"cluster": cluster, "member": member_id,
                                     "version": version}))
    data = _read_raw(sock, deadline, "hello")
    try:
        hello = msgpack.unpackb(data, raw=False)
        peer_cluster, peer_id, peer_version = hello["cluster"], hello["member"], hello["version"]
    except Exception as e:  # noqa: BLE001 - an authenticated peer with a broken hello
        raise PeerRefusedError(f"the peer's hello is malformed: {e}") from e
    why = None
    if peer_cluster != cluster:
        why = (f"member {peer_id} belongs to cluster '{peer_cluster}', member {member_id} to "
               f"'{cluster}': start both with the same --cluster")
    elif peer_version != version:
        why = (f"member {peer_id} speaks member protocol {peer_version}, member {member_id} "
               f"{version}: run the same jetwake version on every member")
    write_frame(sock, _REFUSED + why.encode() if why else _OK)
    verdict = read_frame(sock, _HANDSHAKE_LIMIT, deadline=deadline)
    if why is not None:
        raise PeerRefusedError(why)
    if verdict != _OK:
        text = verdict[len(_REFUSED):].decode() if verdict else "the connection closed"
        raise PeerRefusedError(f"the peer refused this member: {text}")
    return hello


def _deadline(timeout: float) -> float:
    return time.monotonic() + timeout


def nothing_listens(address: str, attempts: int = 3, spacing_s: float = 0.05,
                    timeout: float = 1.0) -> bool:
    """Whether ``attempts`` connections in a row to ``host:port`` are all refused: nothing
    listens there, so the member whose peer address it is has no process any more (a member
    listens from before it joins the group until after it left it). A paused process still
    listens (its kernel accepts the connection), and a machine out of reach does not refuse
    (the attempt times out): neither counts, nor does an unspecified host (``0.0.0.0``:
    connecting there reaches this machine, not the member's)."""
    host, _, port = address.rpartition(":")
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        return False
    for i in range(attempts):
        if i:
            time.sleep(spacing_s)
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return False
        except ConnectionRefusedError:
            continue
        except (OSError, ValueError):
            return False
    return True


def connect_peer(address: str, token: str | None, cluster: str, member_id: str, *,
                 timeout: float = 10.0, version: int = PEER_PROTOCOL_VERSION) -> PeerLink:
    """Connects to the member at ``host:port`` and authenticates both ways."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    try:
        deadline = _deadline(timeout)
        theirs = _read_raw(sock, deadline, "challenge")
        if len(theirs) != _NONCE:
            raise PeerRefusedError(f"the peer at {address} is not a jetwake member")
        mine = os.urandom(_NONCE)
        write_frame(sock, mine + _mac(token, b"connect", theirs, mine))
        proof = _read_raw(sock, deadline, "proof")
        if not hmac.compare_digest(proof, _mac(token, b"accept", mine, theirs)):
            raise PeerRefusedError(f"the member at {address} does not hold this cluster's token: "
                                   "start every member with the same --token")
        hello = _exchange_hellos(sock, deadline, cluster, member_id, version)
        sock.settimeout(None)
        return PeerLink(sock, hello["member"], address)
    except BaseException:
        sock.close()
        raise


def accept_peer(sock: socket.socket, token: str | None, cluster: str, member_id: str, *,
                timeout: float = 10.0, version: int = PEER_PROTOCOL_VERSION) -> PeerLink:
    """Authenticates a connection a peer made to this member; closes it and raises
    PeerRefusedError when the peer does not prove the token."""
    peer = "%s:%s" % sock.getpeername()[:2]
    try:
        deadline = _deadline(timeout)
        mine = os.urandom(_NONCE)
        write_frame(sock, mine)
        answer = _read_raw(sock, deadline, "answer")
        theirs, mac = answer[:_NONCE], answer[_NONCE:]
        if len(answer) != _NONCE + _MAC or not hmac.compare_digest(
                mac, _mac(token, b"connect", mine, theirs)):
            _refuse(sock, "wrong cluster token: start every member with the same --token")
            raise PeerRefusedError(f"the peer at {peer} does not hold this cluster's token")
        write_frame(sock, _mac(token, b"accept", theirs, mine))
        hello = _exchange_hellos(sock, deadline, cluster, member_id, version)
        sock.settimeout(None)
        return PeerLink(sock, hello["member"], peer)
    except BaseException:
        sock.close()
        raise
