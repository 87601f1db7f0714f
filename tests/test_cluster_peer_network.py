"""Members call each other and send one-way messages over authenticated connections: results and
errors come back faithfully, an unreachable or departed member is reported as such, a peer
without the token or of another cluster is refused on both sides, and slow calls never hold up
the connection. Real sockets on loopback, real threads."""

from __future__ import annotations

import datetime as dt
import socket
import threading

import pytest
from support.waiting import wait_until

from jetwake.engine.cluster.peer_network import (PeerCallError, PeerNetwork,
                                                 PeerUnreachableError)
from jetwake.engine.core.errors import JetwakeError, is_restartable_cause


@pytest.fixture
def pair():
    a = PeerNetwork("prod", "a", "s3cret").start()
    b = PeerNetwork("prod", "b", "s3cret").start()
    yield a, b
    a.stop()
    b.stop()


def test_a_call_returns_the_handlers_result_with_bytes_and_tuples_intact(pair):
    a, b = pair
    seen = []

    def handler(peer_id, method, args):
        seen.append((peer_id, method, args))
        return {"echo": args, "raw": b"\x80\x04cloudpickle\x00bytes", "pair": (1, ("x", 2.5))}

    b.set_call_handler(handler)
    when = dt.datetime(2024, 5, 1, 12, 30)
    result = a.call("b", b.address, "echo", [b"\x00\xff job", (1, 2), when, [3, (4,)]])
    assert seen == [("a", "echo", [b"\x00\xff job", (1, 2), when, [3, (4,)]])]
    assert result == {"echo": [b"\x00\xff job", (1, 2), when, [3, (4,)]],
                      "raw": b"\x80\x04cloudpickle\x00bytes", "pair": (1, ("x", 2.5))}
    assert type(result["pair"]) is tuple and type(result["pair"][1]) is tuple


def test_calls_reuse_one_connection_per_peer(pair):
    a, b = pair
    b.set_call_handler(lambda peer, method, args: args[0] * 2)
    assert [a.call("b", b.address, "double", [i]) for i in range(20)] == \
        [i * 2 for i in range(20)]
    assert a.peers() == {"b": {"outgoing": 1, "incoming": 0}}
    assert b.peers() == {"a": {"outgoing": 0, "incoming": 1}}


def test_calls_both_ways_and_replies_travel_on_the_connection_of_the_request(pair):
    a, b = pair
    a.set_call_handler(lambda peer, method, args: f"a answers {peer}")
    b.set_call_handler(lambda peer, method, args: f"b answers {peer}")
    assert a.call("b", b.address, "who", []) == "b answers a"
    assert b.call("a", a.address, "who", []) == "a answers b"
    assert a.peers() == {"b": {"outgoing": 1, "incoming": 1}}


def test_a_remote_exception_becomes_a_peer_call_error_naming_method_and_member(pair):
    a, b = pair

    def handler(peer_id, method, args):
        raise KeyError(f"no job {args[0]}")

    b.set_call_handler(handler)
    with pytest.raises(PeerCallError) as info:
        a.call("b", b.address, "job_status", ["j-42"])
    assert info.value.remote_type == "KeyError"
    assert "job_status" in str(info.value) and "member b" in str(info.value)
    assert "no job j-42" in str(info.value)
    # the connection survives a failed call
    b.set_call_handler(lambda peer, method, args: "fine")
    assert a.call("b", b.address, "job_status", ["j-42"]) == "fine"


def test_a_result_that_cannot_be_serialized_comes_back_as_a_call_error(pair):
    a, b = pair
    b.set_call_handler(lambda peer, method, args: object())
    with pytest.raises(PeerCallError, match="cannot serialize object") as info:
        a.call("b", b.address, "bad", [])
    assert info.value.remote_type == "SerializationError"


def test_an_argument_that_cannot_be_serialized_fails_in_the_caller(pair):
    a, b = pair
    with pytest.raises(TypeError, match="cannot serialize"):
        a.call("b", b.address, "m", [object()])


def test_calling_a_stopped_member_raises_peer_unreachable_naming_it(pair):
    a, b = pair
    address = b.address
    b.stop()
    with pytest.raises(PeerUnreachableError, match=f"member b at {address}") as info:
        a.call("b", address, "status", [], timeout=5)
    assert "cannot connect" in str(info.value)
    assert isinstance(info.value, JetwakeError) and is_restartable_cause(info.value)


def test_a_member_that_stops_during_a_call_fails_the_call_at_once(pair):
    a, b = pair
    entered, release = threading.Event(), threading.Event()

    def handler(peer_id, method, args):
        entered.set()
        release.wait(10)
        return "too late"

    b.set_call_handler(handler)
    errors = []
    caller = threading.Thread(
        target=lambda: errors.append(_raises(lambda: a.call("b", b.address, "slow", []))))
    caller.start()
    assert entered.wait(5)
    b.stop()
    caller.join(5)
    release.set()
    assert len(errors) == 1 and isinstance(errors[0], PeerUnreachableError)
    assert "could not answer call 'slow'" in str(errors[0])


def test_a_peer_that_never_completes_the_handshake_is_unreachable_after_the_connect_timeout():
    silent = socket.create_server(("127.0.0.1", 0))  # connections wait in its backlog, unanswered
    a = PeerNetwork("prod", "a", "s3cret", connect_timeout=0.3).start()
    try:
        address = "127.0.0.1:%d" % silent.getsockname()[1]
        with pytest.raises(PeerUnreachableError, match=f"cannot connect to member b at {address}"):
            a.call("b", address, "status", [], timeout=10)
    finally:
        a.stop()
        silent.close()


def test_a_call_without_an_answer_times_out_as_unreachable(pair):
    a, b = pair
    release = threading.Event()
    b.set_call_handler(lambda peer, method, args: release.wait(10))
    with pytest.raises(PeerUnreachableError, match=r"did not answer call 'hang' within 0\.2 s"):
        a.call("b", b.address, "hang", [], timeout=0.2)
    release.set()


def test_a_slow_call_does_not_hold_up_other_calls_or_messages(pair):
    a, b = pair
    release = threading.Event()
    got = []

    def handler(peer_id, method, args):
        if method == "slow":
            release.wait(10)
        return method

    b.set_call_handler(handler)
    b.set_message_handler("note", lambda peer, payload: got.append(payload))
    slow = []
    caller = threading.Thread(target=lambda: slow.append(a.call("b", b.address, "slow", [])))
    caller.start()
    assert a.call("b", b.address, "fast", [], timeout=5) == "fast"
    a.send("b", b.address, "note", "passed")
    wait_until(lambda: got == ["passed"], what="the message behind the slow call")
    assert not slow
    release.set()
    caller.join(5)
    assert slow == ["slow"]


def test_a_broken_connection_is_made_again_on_the_next_call(pair):
    a, b = pair
    b.set_call_handler(lambda peer, method, args: "ok")
    assert a.call("b", b.address, "ping", []) == "ok"
    b.disconnect("a")
    wait_until(lambda: "b" not in a.peers(), what="member a to notice the broken connection")
    assert a.call("b", b.address, "ping", []) == "ok"
    assert a.peers() == {"b": {"outgoing": 1, "incoming": 0}}


def test_disconnect_fails_the_calls_waiting_on_that_member(pair):
    a, b = pair
    entered, release = threading.Event(), threading.Event()
    b.set_call_handler(lambda peer, method, args: (entered.set(), release.wait(10)))
    errors = []
    caller = threading.Thread(
        target=lambda: errors.append(_raises(lambda: a.call("b", b.address, "slow", []))))
    caller.start()
    assert entered.wait(5)
    a.disconnect("b")
    caller.join(5)
    release.set()
    assert len(errors) == 1 and isinstance(errors[0], PeerUnreachableError)
    assert "disconnected" in str(errors[0])


def test_one_way_messages_arrive_in_order_with_their_payloads():
    a = PeerNetwork("prod", "a", "s3cret").start()
    b = PeerNetwork("prod", "b", "s3cret").start()
    try:
        got = []
        b.set_message_handler("progress", lambda peer, payload: got.append((peer, payload)))
        for i in range(2000):
            a.send("b", b.address, "progress", (i, b"blob"))
        wait_until(lambda: len(got) == 2000, what="2000 messages")
        assert got == [("a", (i, b"blob")) for i in range(2000)]
    finally:
        a.stop()
        b.stop()


def test_a_message_of_a_kind_without_handler_is_dropped_and_the_next_ones_arrive(pair):
    a, b = pair
    got = []
    b.set_message_handler("known", lambda peer, payload: got.append(payload))
    a.send("b", b.address, "unknown", 1)
    a.send("b", b.address, "known", 2)
    wait_until(lambda: got == [2], what="the message after the unhandled one")


def test_a_wrong_token_is_refused_on_both_sides_with_the_reason():
    a = PeerNetwork("prod", "a", "guess").start()
    b = PeerNetwork("prod", "b", "s3cret").start()
    try:
        with pytest.raises(PeerUnreachableError, match="was refused: .*wrong cluster token"):
            a.call("b", b.address, "status", [], timeout=5)
        assert a.refused == 1 and "wrong cluster token" in a.last_refusal
        wait_until(lambda: b.refused == 1, what="the accepting member to record the refusal")
        assert "does not hold this cluster's token" in b.last_refusal
    finally:
        a.stop()
        b.stop()


def test_a_member_of_another_cluster_is_refused_on_both_sides_naming_both_clusters():
    a = PeerNetwork("staging", "a", "s3cret").start()
    b = PeerNetwork("prod", "b", "s3cret").start()
    try:
        with pytest.raises(PeerUnreachableError, match="'staging'") as info:
            a.call("b", b.address, "status", [], timeout=5)
        assert "'prod'" in str(info.value) and "--cluster" in str(info.value)
        wait_until(lambda: b.refused == 1, what="the accepting member to record the refusal")
        assert "'staging'" in b.last_refusal and "'prod'" in b.last_refusal
    finally:
        a.stop()
        b.stop()


def test_a_member_at_an_address_that_belongs_to_another_member_is_not_used(pair):
    a, b = pair
    with pytest.raises(PeerUnreachableError, match="is 'b', not 'c'"):
        a.call("c", b.address, "status", [], timeout=5)


def test_a_listener_that_cannot_bind_says_where():
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen for peers on 127.0.0.1:{port}"):
            PeerNetwork("prod", "a", None, port=port).start()
    finally:
        taken.close()


def test_bad_arguments_fail_with_a_clear_message(pair):
    a, b = pair
    with pytest.raises(ValueError, match="cluster must be a non-empty string"):
        PeerNetwork("", "a", None)
    with pytest.raises(TypeError, match="args must be a list"):
        a.call("b", b.address, "m", (1, 2))
    with pytest.raises(ValueError, match="must be 'host:port'"):
        a.call("b", "nowhere", "m", [])
    with pytest.raises(RuntimeError, match="call start"):
        PeerNetwork("prod", "c", None).send("b", b.address, "k", 1)


def test_the_advertised_address_is_what_peers_dial():
    a = PeerNetwork("prod", "a", None, advertise="localhost").start()
    try:
        assert a.address == f"localhost:{a._listener.getsockname()[1]}"
    finally:
        a.stop()
    b = PeerNetwork("prod", "b", None, advertise="10.0.0.7:5701").start()
    try:
        assert b.address == "10.0.0.7:5701"
    finally:
        b.stop()


def _raises(fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - the test inspects it
        return e
    return None
