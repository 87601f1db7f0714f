"""The member service against hostile or careless networks: it refuses to serve pickled code
to anyone on a reachable address without a token, gives a client one deadline for its whole
hello, caps the connections still waiting to authenticate, and queues a burst of connecting
clients instead of dropping them."""

from __future__ import annotations

import json
import logging
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import pytest

from jetwake import Client, Member, MemberUnreachableError
from jetwake.engine.net.framing import read_frame, write_frame
from jetwake.engine.server.member_service import MemberService
from support.waiting import wait_until

TOKEN = "hardening-token"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def member():
    m = Member()
    try:
        yield m
    finally:
        m.shutdown(graceful=False)


def serving(member, **kw) -> MemberService:
    kw.setdefault("token", TOKEN)
    return MemberService(member, kw.pop("host", "127.0.0.1"), 0, **kw).start()


def closed_by_peer(s: socket.socket, wait: float) -> bool:
    """True once the member closed (or reset) the connection, False if it is still open
    after ``wait`` seconds."""
    r, _, _ = select.select([s], [], [], wait)
    if not r:
        return False
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def hello_and_ping(s: socket.socket, token: str = TOKEN) -> dict:
    """Authenticates a raw connection and sends one ping; returns the ping's result."""
    from jetwake.engine.core.serialization import dumps, loads
    write_frame(s, msgpack.packb({"op": "hello", "token": token}))
    reply = msgpack.unpackb(read_frame(s), raw=False)
    assert reply["ok"] is True, reply
    write_frame(s, dumps({"op": "ping", "args": {}}))
    answer = loads(read_frame(s))
    assert answer["ok"] is True, answer
    return answer["result"]


def cli_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JETWAKE_")}
    env.update(extra)
    return env


# --- 1. no token on a reachable address: refuse to start ----------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_a_reachable_address_without_a_token_is_refused(member, host):
    with pytest.raises(ValueError) as e:
        MemberService(member, host, 0)
    text = str(e.value)
    assert host in text and "--token" in text and "JETWAKE_TOKEN" in text
    assert "127.0.0.1" in text  # the other way out: loopback only


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_loopback_addresses_need_no_token(member, host):
    svc = MemberService(member, host, 0).start()
    try:
        where = f"[{host}]:{svc.address[1]}" if ":" in host else f"{host}:{svc.address[1]}"
        with Client(where) as c:
            assert c.ping()["token_required"] is False
    finally:
        svc.stop()


def test_a_reachable_address_with_a_token_serves_clients_with_that_token(member):
    svc = serving(member, host="0.0.0.0")
    try:
        with Client(f"127.0.0.1:{svc.address[1]}", token=TOKEN) as c:
            assert c.ping()["token_required"] is True
    finally:
        svc.stop()


def test_member_start_on_a_reachable_address_without_a_token_exits_with_the_fix():
    proc = subprocess.Popen([sys.executable, "-m", "jetwake.engine.server.cli", "member", "start",
                             "--host", "0.0.0.0", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env())
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("the member started listening on 0.0.0.0 without a token")
    assert proc.returncode == 2, err
    assert "0.0.0.0" in err and "--token" in err and "JETWAKE_TOKEN" in err
    assert "ready" not in err


def _dockerfile_command() -> list[str]:
    text = (ROOT / "docker" / "Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD\s+(\[.*\])\s*$", text, re.M).group(1))
    assert entry == ["jetwake"]
    return cmd


@pytest.mark.integration
def test_the_docker_image_command_needs_a_token(tmp_path):
    """The image's own command (ENTRYPOINT + CMD, run here without Docker) listens on every
    interface of the container: it exits at once without JETWAKE_TOKEN and serves with it."""
    cmd = _dockerfile_command()
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    run = [sys.executable, "-m", "jetwake.engine.server.cli", *cmd]
    no_token = subprocess.run(run, capture_output=True, text=True, timeout=30, env=cli_env())
    assert no_token.returncode == 2
    assert "JETWAKE_TOKEN" in no_token.stderr and "0.0.0.0" in no_token.stderr

    # with a token the same command starts (free ports and a temporary data directory here)
    log_path = tmp_path / "member.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([*run, "--port", "0", "--metrics-port", "0",
                                 "--data-dir", str(tmp_path / "data")],
                                stdout=log_file, stderr=subprocess.STDOUT,
                                env=cli_env(JETWAKE_TOKEN=TOKEN))
        try:
            wait_until(lambda: "member ready on 0.0.0.0:" in log_path.read_text()
                       or proc.poll() is not None, timeout=30, what="the member to start")
            assert "token required" in log_path.read_text(), log_path.read_text()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    compose = (ROOT / "docker" / "compose.yaml").read_text()
    assert "JETWAKE_TOKEN: ${JETWAKE_TOKEN:?" in compose
    command = re.search(r"^\s+command:\s*(\[[^\]]*\])", compose, re.M).group(1)
    assert json.loads(command) == cmd


# --- 2. unauthenticated clients: one deadline for the hello, a cap on how many wait ---------


def test_a_client_dribbling_its_hello_is_closed_at_the_deadline(member):
    svc = serving(member, hello_timeout=0.5)
    try:
        hello = msgpack.packb({"op": "hello", "token": TOKEN, "padding": "x" * 40})
        frame = len(hello).to_bytes(4, "big") + hello
        socks = [socket.create_connection(svc.address, 5) for _ in range(5)]
        opened = time.monotonic()
        closed_at: dict[int, float] = {}
        sent = 0
        # one byte on every connection each 0.1 s: each read is quick, the whole hello is not
        while len(closed_at) < len(socks) and time.monotonic() - opened < 5.0:
            for i, s in enumerate(socks):
                if i in closed_at:
                    continue
                try:
                    s.sendall(frame[sent:sent + 1])
                    gone = closed_by_peer(s, 0.0)
                except (BrokenPipeError, ConnectionResetError):
                    gone = True
                if gone:
                    closed_at[i] = time.monotonic() - opened
            sent += 1
            time.sleep(0.1)  # the dribble's pace, not a wait for a condition
        assert sent < len(frame)  # no hello was ever complete
        assert len(closed_at) == len(socks), f"still open after 5 s: {closed_at}"
        assert all(0.4 <= t <= 1.5 for t in closed_at.values()), closed_at
        wait_until(lambda: svc.unauthenticated_connections == 0,
                   timeout=5, what="the slots to be freed")
        for s in socks:
            s.close()
    finally:
        svc.stop()


def test_an_authenticated_client_may_idle_past_the_hello_deadline(member):
    svc = serving(member, hello_timeout=0.3)
    try:
        with Client(svc.address_text, token=TOKEN) as c:
            time.sleep(0.8)  # idle for longer than the hello deadline, on purpose
            assert c.ping()["token_required"] is True
    finally:
        svc.stop()


def test_connections_beyond_the_unauthenticated_cap_are_closed_at_once(member, caplog):
    svc = serving(member, hello_timeout=30.0, max_unauthenticated=3)
    caplog.set_level(logging.WARNING, logger="jetwake.service")
    silent: list[socket.socket] = []
    try:
        with Client(svc.address_text, token=TOKEN) as served:  # authenticated before
            # the member stops counting it as waiting just after its hello's answer is sent
            wait_until(lambda: svc.unauthenticated_connections == 0,
                       timeout=5, what="the served client's hello answered")
            silent = [socket.create_connection(svc.address, 5) for _ in range(3)]
            wait_until(lambda: svc.unauthenticated_connections == 3,
                       timeout=5, what="3 waiting clients")
            extra = [socket.create_connection(svc.address, 5) for _ in range(4)]
            t0 = time.monotonic()
            for s in extra:  # one error reply saying why, then the connection is closed
                s.settimeout(5)
                reply = msgpack.unpackb(read_frame(s), raw=False)
                assert reply["ok"] is False and "waiting to authenticate" in reply["error"][1]
                assert closed_by_peer(s, 5.0)
            assert time.monotonic() - t0 < 2.0  # at once, long before the 30 s deadline
            assert svc.refused_connections == 4
            assert not any(closed_by_peer(s, 0.0) for s in silent)  # the 3 still wait
            assert served.ping()["refused_connections"] == 4
            with pytest.raises(MemberUnreachableError):  # the Client says so too
                Client(svc.address_text, token=TOKEN)
            for s in extra:
                s.close()
        refusals = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refusals) == 1, [r.getMessage() for r in refusals]  # rate-limited
        assert "--max-unauthenticated" in refusals[0].getMessage()
        # the silent clients leave: a new client gets a slot again
        for s in silent:
            s.close()
        wait_until(lambda: svc.unauthenticated_connections == 0,
                   timeout=5, what="the slots to be freed")
        with Client(svc.address_text, token=TOKEN) as c:
            assert c.ping()["refused_connections"] == 5
    finally:
        for s in silent:
            s.close()
        svc.stop()


@pytest.mark.parametrize("kw, message", [
    ({"hello_timeout": 0}, "hello_timeout"), ({"hello_timeout": -1.0}, "hello_timeout"),
    ({"max_unauthenticated": 0}, "max_unauthenticated"),
    ({"max_unauthenticated": 2.5}, "max_unauthenticated")])
def test_the_limits_are_checked(member, kw, message):
    with pytest.raises(ValueError, match=message):
        MemberService(member, "127.0.0.1", 0, **kw)


@pytest.mark.parametrize("option, value", [("--hello-timeout", "0"),
                                           ("--max-unauthenticated", "0"),
                                           ("--max-unauthenticated", "many")])
def test_member_start_checks_the_limits(option, value):
    r = subprocess.run([sys.executable, "-m", "jetwake.engine.server.cli", "member", "start",
                        "--port", "0", option, value], capture_output=True, text=True,
                       timeout=30, env=cli_env())
    assert r.returncode == 2
    assert option in r.stderr


# --- 3. a burst of connecting clients ------------------------------------------------------


def test_a_burst_of_150_clients_is_queued_not_dropped(member):
    """150 clients connect before the member accepts any: every TCP handshake completes
    (the kernel queues them all), then every client authenticates and gets a ping answer."""
    svc = MemberService(member, "127.0.0.1", 0, token=TOKEN)  # listening, not yet accepting
    socks: list[socket.socket] = []
    try:
        for _ in range(150):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(svc.address)
            socks.append(s)
        # a dropped SYN is retried after 1 s at the earliest: all must connect before that
        deadline = time.monotonic() + 0.9
        pending = set(socks)
        while pending and time.monotonic() < deadline:
            _, ready, _ = select.select([], list(pending), [], 0.05)
            for s in ready:
                assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                pending.discard(s)
        assert not pending, f"{len(pending)} of 150 connections were not accepted by the kernel"

        svc.start()
        results: list[dict] = []
        errors: list[BaseException] = []
        start = threading.Barrier(len(socks))

        def client(s: socket.socket) -> None:
            s.setblocking(True)
            s.settimeout(30)
            start.wait()
            try:
                results.append(hello_and_ping(s))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=client, args=(s,)) for s in socks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors[:3]
        assert len(results) == 150
    finally:
        for s in socks:
            s.close()
        svc.stop()
