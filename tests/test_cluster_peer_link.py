"""Members connect to each other only with the cluster's token, proved before anything from the
peer is decoded; another cluster or protocol version is refused on both sides, by name."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from jetwake.engine.cluster.peer_link import PeerRefusedError, accept_peer, connect_peer


class Acceptor:
    """A listening socket whose one accepted connection is authenticated on a thread."""

    def __init__(self, token: str | None, cluster: str = "prod", version: int | None = None):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.link = None
        self.error: BaseException | None = None
        kw = {} if version is None else {"version": version}

        def run() -> None:
            conn, _ = self.server.accept()
            try:
                self.link = accept_peer(conn, token, cluster, "acceptor", timeout=5, **kw)
            except BaseException as e:  # noqa: BLE001 - the test looks at it
                self.error = e
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join(10)
        self.server.close()


def test_members_with_the_same_token_connect_and_exchange_messages():
    acc = Acceptor("s3cret")
    link = connect_peer(acc.address, "s3cret", "prod", "connector", timeout=5)
    acc.join()
    assert acc.error is None
    assert link.peer_id == "acceptor" and acc.link.peer_id == "connector"
    link.send(["data", 7, [1, 2, 3]])
    assert acc.link.receive() == ["data", 7, [1, 2, 3]]
    acc.link.send(["ack", 7, 4096])
    assert link.receive() == ["ack", 7, 4096]
    link.close()
    assert acc.link.receive() is None
    acc.link.close()


def test_a_wrong_token_is_refused_on_both_sides():
    acc = Acceptor("s3cret")
    with pytest.raises(PeerRefusedError, match="wrong cluster token"):
        connect_peer(acc.address, "guess", "prod", "intruder", timeout=5)
    acc.join()
    assert isinstance(acc.error, PeerRefusedError)
    assert "does not hold this cluster's token" in str(acc.error)


def test_another_cluster_is_refused_on_both_sides_naming_both_clusters():
    acc = Acceptor("s3cret", cluster="prod")
    with pytest.raises(PeerRefusedError, match="'staging'.*'prod'|'prod'.*'staging'"):
        connect_peer(acc.address, "s3cret", "staging", "other", timeout=5)
    acc.join()
    assert isinstance(acc.error, PeerRefusedError) and "--cluster" in str(acc.error)


def test_another_protocol_version_is_refused_on_both_sides():
    acc = Acceptor("s3cret", version=99)
    with pytest.raises(PeerRefusedError, match="same jetwake version"):
        connect_peer(acc.address, "s3cret", "prod", "old", timeout=5)
    acc.join()
    assert isinstance(acc.error, PeerRefusedError) and "protocol 1" in str(acc.error)


def test_bytes_of_an_unauthenticated_peer_are_never_decoded():
    """A client that skips the handshake and sends a large msgpack (or pickle) payload is
    refused after reading at most a handshake-sized frame; nothing it sent is decoded."""
    acc = Acceptor("s3cret")
    host, port = acc.address.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.recv(64)  # the challenge
        payload = b"\x80\x04" + b"x" * 10_000  # looks like a pickle, far over the limit
        raw.sendall(struct.pack(">I", len(payload)) + payload)
        acc.join()
    assert isinstance(acc.error, PeerRefusedError)
    assert "not a jetwake handshake" in str(acc.error)
