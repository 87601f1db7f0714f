"""Kafka group requests written on a plain socket: removing one member from a consumer group
at once (LeaveGroup, sent on behalf of a member whose process is gone), and describing the
group (DescribeGroups: its consumers and the partitions each holds).

Kafka drops a silent member only after its session timeout (6 s at the defaults, and a broker
refuses a shorter one unless its ``group.min.session.timeout.ms`` is lowered). A member that
left gracefully sends LeaveGroup itself; one that was SIGKILLed cannot, so a survivor that knows
the process is gone sends it in its place, naming the dead consumer's own member id (the one
Kafka gave that consumer when it joined: a consumer started later, even with the same jetwake
member id, has another, and is never removed by it). Kafka's Java admin client calls this
``removeMembersFromConsumerGroup``; librdkafka has no such call, so the two requests it takes
(FindCoordinator, then LeaveGroup v3) are written here on a plain socket.

The group's description is asked the same way (FindCoordinator, then DescribeGroups v4), not
through librdkafka's admin client: its group calls go to the group's coordinator broker, and
when that broker goes away while a call is in flight (a broker killed or restarted),
librdkafka 2.x uses the call's state after freeing it and aborts the whole process on its assertion
``eonce->refcnt > 0`` (librdkafka issue #4605; the use-after-free in
``rd_kafka_admin_coord_request``'s error path). A member asks for the group's description
all the time (who is there, who coordinates), so on a plain socket a broker fault costs it
one failed question, never the process; each question is a new connection, so no client is
left with a stale view of the brokers either.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

from jetwake.engine.core.errors import JetwakeError

__all__ = ["remove_group_member", "GroupLeaveError", "describe_group", "GroupMember"]

_FIND_COORDINATOR = 10
_LEAVE_GROUP = 13
_DESCRIBE_GROUPS = 15
_NONE = 0
_UNKNOWN_MEMBER_ID = 25  # already gone: what was asked is done
_RETRIABLE = {14, 15, 16}  # coordinator loading, not available, not the coordinator
_CLIENT_ID = b"jetwake-group-leave"


class GroupLeaveError(JetwakeError):
    """Kafka did not remove the member (the message says why); the session timeout still
    will."""


def _string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def string(self) -> str | None:
        n = self.take(">h")
        if n < 0:
            return None
        raw = self.data[self.pos:self.pos + n]
        self.pos += n
        return raw.decode()

    def blob(self) -> bytes:
        n = self.take(">i")
        if n < 0:
            return b""
        raw = self.data[self.pos:self.pos + n]
        self.pos += n
        return raw


def _request(address: tuple[str, int], api_key: int, version: int, body: bytes,
             timeout: float) -> _Reader:
    """Sends one request (header v1) and returns a reader past the response header (v0)."""
    header = struct.pack(">hhi", api_key, version, 1) + _string(_CLIENT_ID.decode())
    frame = header + body
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read_exactly(sock, 4))[0]
        reader = _Reader(_read_exactly(sock, size))
    if reader.take(">i") != 1:
        raise GroupLeaveError("Kafka answered another request than the one sent")
    return reader


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    parts = bytearray()
    while len(parts) < n:
        chunk = sock.recv(n - len(parts))
        if not chunk:
            raise GroupLeaveError("Kafka closed the connection before it answered")
        parts += chunk
    return bytes(parts)


def _split(hostport: str) -> tuple[str, int]:
    host, _, port = hostport.strip().rpartition(":")
    return host.strip("[]"), int(port)


def _group_coordinator(bootstrap_servers: str, group: str, timeout: float) -> tuple[str, int]:
    """The broker that keeps ``group`` (FindCoordinator v2), asked of each bootstrap server
    in turn until one answers. Each gets its share of ``timeout`` (at least a second), so a
    paused broker, which takes the connection but never answers, leaves time for the others."""
    last: Exception | None = None
    servers = [s for s in bootstrap_servers.split(",") if s.strip()]
    each = max(1.0, timeout / max(1, len(servers)))
    for server in servers:
        try:
            r = _request(_split(server), _FIND_COORDINATOR, 2,
                         _string(group) + struct.pack(">b", 0), each)
        except (OSError, ValueError, struct.error, GroupLeaveError) as e:
            last = e
            continue
        r.take(">i")  # throttle time
        error = r.take(">h")
        message = r.string()
        r.take(">i")  # node id
        host = r.string() or ""
        port = r.take(">i")
        if error != _NONE:
            last = GroupLeaveError(f"Kafka error {error} finding the coordinator of group "
                                   f"'{group}': {message}")
            continue
        return host, port
    raise GroupLeaveError(f"no broker of {bootstrap_servers} named the coordinator of group "
                          f"'{group}': {last}")


def remove_group_member(bootstrap_servers: str, group: str, kafka_member_id: str, *,
                        timeout: float = 5.0, attempts: int = 3) -> bool:
    """Asks Kafka to remove the consumer ``kafka_member_id`` (Kafka's member id, not
    jetwake's) from ``group`` now, as if it had left: the group rebalances at once. Returns
    True when Kafka removed it, False when the group no longer had it; raises
    :class:`GroupLeaveError` otherwise."""
    body = (_string(group) + struct.pack(">i", 1) + _string(kafka_member_id)
            + _string(None))
    last = ""
    for _ in range(attempts):
        try:
            r = _request(_group_coordinator(bootstrap_servers, group, timeout), _LEAVE_GROUP,
                         3, body, timeout)
        except (OSError, struct.error) as e:
            last = f"{e!r}"
            continue
        r.take(">i")  # throttle time
        error = r.take(">h")
        if error == _NONE:
            for _member in range(r.take(">i")):
                r.string()
                r.string()
                error = r.take(">h")
        if error == _NONE:
            return True
        if error == _UNKNOWN_MEMBER_ID:
            return False
        last = f"Kafka error {error}"
        if error not in _RETRIABLE:
            break
    raise GroupLeaveError(f"Kafka did not remove member {kafka_member_id} from group "
                          f"'{group}': {last}")


@dataclass(frozen=True)
class GroupMember:
    """One consumer of a group as Kafka describes it: the member id Kafka gave it, its
    ``client.id``, and the partitions assigned to it (``(topic, partition)``)."""

    member_id: str
    client_id: str
    partitions: tuple[tuple[str, int], ...]


def _assigned(assignment: bytes) -> tuple[tuple[str, int], ...]:
    """The partitions of a consumer protocol assignment (every version starts with them)."""
    if len(assignment) < 6:
        return ()  # none yet: the group is rebalancing
    r = _Reader(assignment)
    r.take(">h")  # version
    out = []
    for _topic in range(r.take(">i")):
        topic = r.string() or ""
        for _p in range(r.take(">i")):
            out.append((topic, r.take(">i")))
    return tuple(out)


def _describe_once(bootstrap_servers: str, group: str, body: bytes, timeout: float
                   ) -> tuple[int, list[GroupMember]]:
    """One DescribeGroups v4 of ``group``: Kafka's error code and the members."""
    r = _request(_group_coordinator(bootstrap_servers, group, timeout), _DESCRIBE_GROUPS, 4,
                 body, timeout)
    r.take(">i")  # throttle time
    if r.take(">i") != 1:
        raise GroupLeaveError("Kafka described another number of groups than asked")
    error = r.take(">h")
    members: list[GroupMember] = []
    if error != _NONE:
        return error, members
    r.string()  # group id
    r.string()  # state
    r.string()  # protocol type
    r.string()  # protocol
    for _m in range(r.take(">i")):
        member_id = r.string() or ""
        r.string()  # group instance id
        client_id = r.string() or ""
        r.string()  # client host
        r.blob()  # subscription
        members.append(GroupMember(member_id, client_id, _assigned(r.blob())))
    return error, members


def describe_group(bootstrap_servers: str, group: str, *, timeout: float = 10.0
                   ) -> list[GroupMember]:
    """The consumers of ``group`` now, with the partitions each holds (DescribeGroups v4 to
    the group's coordinator broker). Retries a coordinator that is moving or loading, and a
    broker that does not answer, until ``timeout``; then raises :class:`GroupLeaveError`."""
    deadline = time.monotonic() + timeout
    body = struct.pack(">i", 1) + _string(group) + struct.pack(">b", 0)
    delay = 0.05
    while True:
        error = -1
        try:
            error, members = _describe_once(bootstrap_servers, group, body,
                                            max(0.2, deadline - time.monotonic()))
            last = f"Kafka error {error}"
        except (OSError, struct.error, UnicodeDecodeError, GroupLeaveError) as e:
            last = f"{e!r}"  # no broker answered this time
        if error == _NONE:
            return members
        if error >= 0 and error not in _RETRIABLE:
            raise GroupLeaveError(f"Kafka did not describe group '{group}': {last}")
        if time.monotonic() + delay > deadline:
            raise GroupLeaveError(f"Kafka did not describe group '{group}' within "
                                  f"{timeout:.1f} s: {last}")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
