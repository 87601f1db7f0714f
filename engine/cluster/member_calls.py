"""Calls between the members of a cluster: where each member is, a call to one (this member's
own in-process, through the same encoding), the calls a member serves, an execution's end sent
to its coordinator, and a client's request handed to another member."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from jetwake.engine.cluster.membership import MemberInfo, MembershipUnreachableError
from jetwake.engine.cluster.peer_network import PeerNotReachedError, PeerUnreachableError
from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.jobs.execution_messages import (
    REQUESTS, ExecutionEnded, ExecutionMessage, ForgetJob, InitExecution, decode,
    decode_request,
)
from jetwake.engine.jobs.member_place import LIGHT_PREFIX, deliver_execution_end

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.cluster.cluster_place import ClusterPlace

__all__ = ["MemberCalls", "NotCoordinatorError", "COORDINATOR_WAIT_S"]

log = logging.getLogger("jetwake.cluster")

# how long a request about jobs waits for the cluster to have a coordinator
COORDINATOR_WAIT_S = 15.0


class NotCoordinatorError(JetwakeError):
    """A job operation reached a member that does not coordinate the cluster's jobs.
    Restartable: the cluster is electing or has elected another coordinator."""

    restartable = True


class MemberCalls:
    """The calls between this member and the others of its cluster."""

    def __init__(self, place: "ClusterPlace") -> None:
        self.place = place
        #: member id -> its peer address
        self.addresses: dict[str, str] = {}
        #: the group's members at the last listing
        self.known_members: list[MemberInfo] = []

    def refresh_members(self) -> list[MemberInfo]:
        """The group's members now (and where they are)."""
        membership = self.place.membership
        assert membership is not None  # joined
        members = membership.members()
        for m in members:
            self.addresses[m.id] = m.address
        self.known_members = members
        return members

    def call_member(self, member_id: str, method: str, args: list, timeout: float) -> Any:
        """Calls ``method`` on a member of the cluster (this one directly)."""
        place = self.place
        if member_id == place.member_id:
            return self.dispatch(method, args)
        address = self.addresses.get(member_id)
        if address is None:
            self.refresh_members()
            address = self.addresses.get(member_id)
        if address is None:
            raise PeerUnreachableError(f"member {member_id} is not in cluster "
                                       f"'{place.cluster_name}' (any more)")
        assert place.network is not None  # joined
        return place.network.call(member_id, address, method, args, timeout)

    def on_call(self, peer_id: str, method: str, args: list) -> Any:
        """A call from member ``peer_id`` (the peer network's handler)."""
        return self.dispatch(method, args)

    def call_execution(self, member_id: str, message: ExecutionMessage,
                       timeout: float) -> ExecutionMessage | None:
        """Delivers an execution's request to a member (this one in-process, through the same
        encoding) and decodes its reply (the ExecutionTransport of the job coordinators)."""
        wire = self.call_member(member_id, message.OP, [message.to_wire()], timeout)
        reply = message.REPLY
        return None if reply is None else decode(reply, wire)

    def dispatch(self, method: str, args: list) -> Any:
        """Serves one call of another member (or of this one)."""
        place = self.place
        if method in REQUESTS:
            return self.serve_execution(decode_request(method, args))
        if method == "cluster.info":
            return place.local_info()
        if method == "cluster.is_current":
            c = place.member.find_coordinator(args[0].split(".")[0])
            return c is not None and c.is_current(args[0])
        if method == "cluster.leaving":
            return place.role.member_leaving(args[0])
        if method == "cluster.request":
            forward = place.member.forwarded_request_handler
            if forward is None:
                raise JetwakeError(f"member {place.member_id} serves no clients")
            frame, client = args
            return forward(frame, client)
        raise ValueError(f"unknown cluster call '{method}'")

    def serve_execution(self, message: ExecutionMessage) -> Any:
        """Serves an execution's request; returns the encoded reply."""
        place = self.place
        if isinstance(message, InitExecution):  # the execution's members, where to report
            for member_id, address in message.members:
                self.addresses.setdefault(member_id, address)
            current = place.role.coordinator_id(refresh=True)
            if not message.exec_key.startswith(LIGHT_PREFIX) and current is not None \
                    and message.coordinator != current:
                # a deposed coordinator (paused, cut off) must not start executions
                raise NotCoordinatorError(
                    f"member {place.member_id} refuses execution {message.exec_key} from "
                    f"{message.coordinator}: that member is not the coordinator of cluster "
                    f"'{place.cluster_name}'")
        reply = place.member.participant.handle(message)
        return None if reply is None else reply.to_wire()

    def report_end(self, coordinator: str, ended: ExecutionEnded,
                   cause: BaseException | None) -> None:
        """Sends the end of this member's share of an execution to its coordinator. The
        cause stays here: every member's end reaches the coordinator as its message."""
        place = self.place
        payload = ended.to_wire()
        if coordinator == place.member_id:
            self.on_execution_ended(payload)
            return
        address = self.addresses.get(coordinator)
        if address is None:
            self.refresh_members()
            address = self.addresses.get(coordinator)
        if address is None:
            raise PeerUnreachableError(f"coordinator {coordinator} is gone")
        assert place.network is not None  # joined
        place.network.send(coordinator, address, "exec.ended", payload)

    def on_execution_ended(self, payload: Any) -> None:
        """A member's share of an execution this member coordinates ended."""
        deliver_execution_end(self.place.member, decode(ExecutionEnded, payload))

    def forget_job_everywhere(self, job_id: str) -> None:
        """The job ended for good: every other member drops its copies of its snapshots."""
        place = self.place
        for m in self.known_members:
            if m.id != place.member_id:
                place.pool.submit(self._forget_on, m.id, job_id)

    def _forget_on(self, member_id: str, job_id: str) -> None:
        try:
            self.call_execution(member_id, ForgetJob(job_id=job_id), 10.0)
        except Exception as e:  # noqa: BLE001 - leftovers on a member are only clutter
            log.debug("member %s did not drop the snapshots of job %s: %r", member_id,
                      job_id, e)

    def forward_request(self, frame: bytes, client: str, timeout: float,
                        target: str | None = None) -> bytes:
        """Hands a client's request to member ``target`` (the coordinator when None); returns
        its encoded reply."""
        if target is not None:
            return self.call_member(target, "cluster.request", [frame, client], timeout)
        # the coordinator may be changing (a member left, or died and Kafka still names it):
        # ask again until one answers; a call that never reached it is safe to ask again
        deadline = time.monotonic() + COORDINATOR_WAIT_S
        while True:
            try:
                target = self.place.role.coordinator_id(refresh=True)
            except MembershipUnreachableError as e:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                # retryable for the client: the coordinator is found again once Kafka answers
                raise NotCoordinatorError(
                    f"no coordinator found for {COORDINATOR_WAIT_S:.0f} s: {e}") from e
            if target is not None:
                try:
                    reply = self.call_member(target, "cluster.request", [frame, client],
                                             timeout)
                except PeerNotReachedError:
                    if time.monotonic() >= deadline:
                        raise
                else:
                    if not _refused_as_not_coordinator(reply):
                        return reply
            if time.monotonic() >= deadline:
                raise NotCoordinatorError(
                    f"cluster '{self.place.cluster_name}' has no coordinator at the moment "
                    f"(for {COORDINATOR_WAIT_S:.0f} s); try again in a few seconds")
            time.sleep(0.2)

    def ask_other_members(self, frame: bytes, client: str, timeout: float = 10.0) -> list[dict]:
        """Sends a client request to every other member; their decoded replies (a member that
        does not answer is left out, and logged)."""
        from jetwake.engine.core.serialization import loads
        place = self.place
        others = [m.id for m in self.refresh_members() if m.id != place.member_id]
        futures = {m: place.pool.submit(self.forward_request, frame, client, timeout, m)
                   for m in others}
        out = []
        for m, f in futures.items():
            try:
                out.append(loads(f.result(timeout + 5)))
            except Exception as e:  # noqa: BLE001 - a member away: its jobs are not listed
                log.warning("member %s did not answer a request: %s", m, e)
        return out


def _refused_as_not_coordinator(reply: bytes) -> bool:
    """Whether a forwarded request's reply says the member was not the coordinator (it moved
    while the request travelled)."""
    from jetwake.engine.core.serialization import loads
    try:
        decoded = loads(reply)
    except Exception:  # noqa: BLE001 - not ours to judge: the client decodes it
        return False
    error = decoded.get("error") if isinstance(decoded, dict) and not decoded.get("ok") \
        else None
    return bool(error and error[0] == NotCoordinatorError.__name__)
