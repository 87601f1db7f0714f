"""Failure detection in a cluster: which members are there, which answer, and what the jobs do
about a member that is gone or out of reach.

Kafka's group says which members are there, but only notices a member whose process or machine
is gone, after its session timeout. So the member watching the group also asks: every second
it compares the group with the executions (an execution a member that left took part in cannot
go on; its coordinator restarts or fails it), the coordinator probes the members of running
executions (one that does not answer twice in a row is out of reach), a member stops its share
of an execution whose coordinator left or no longer runs it, and a member that did not answer
is left out of the next execution until it answers again.

A coordinator whose process is gone is not left to Kafka's session timeout: when a connection
to or from it closes, a survivor checks its peer address, and if every connection there is
refused (nothing listens: the process is gone, see :func:`peer_link.nothing_listens`), asks
Kafka to remove that coordinator's consumer from the group (group_leave.py), naming the member
id Kafka gave that very consumer. The group rebalances at once and partition 0, the
coordinator's role, goes to the oldest survivor, which fences the old coordinator as on any
election. A paused coordinator keeps its connections and its listener, so it is never removed
this way: Kafka expels it after the session timeout, and the fence stops its writes, as before.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from jetwake.engine.cluster.membership import MemberInfo
from jetwake.engine.cluster.peer_link import nothing_listens
from jetwake.engine.cluster.peer_network import PeerUnreachableError

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.cluster.cluster_place import ClusterPlace

__all__ = ["FailureDetector"]

log = logging.getLogger("jetwake.cluster")

# how often the group's members are compared with those of the executions
MEMBER_CHECK_INTERVAL_S = 1.0
# how long a member may take to answer before an execution starts without it
PROBE_TIMEOUT_S = 3.0
# listings in a row that must miss a member before it counts as gone
ABSENT_ROUNDS = 2
# probes in a row a member of a running execution must leave unanswered before the
# coordinator counts it out of reach (Kafka may still list it: cut off from its peers only)
UNANSWERED_PROBES = 2
# every this many rounds a member asks the coordinators of its shares whether they still run
STALE_CHECK_ROUNDS = 1


class FailureDetector:
    """Watches this member's cluster (see the module doc)."""

    def __init__(self, place: "ClusterPlace", fast_failover: bool = True) -> None:
        self.place = place
        #: whether a coordinator whose process is gone is removed from the group at once
        #: (else Kafka drops it after the session timeout)
        self.fast_failover = fast_failover
        #: coordinators this member had Kafka remove because their process was gone
        self.removed_coordinators = 0
        self._checking_coordinator = False
        self.leaving: set[str] = set()  # members handing their work over before they go
        self.unreachable: set[str] = set()  # in the group, but did not answer a probe
        self._seen: set[str] = set()  # members the watcher has seen in the group
        self._absent: dict[str, int] = {}  # member -> listings in a row that missed it
        self._unanswered: dict[str, int] = {}  # member -> probes in a row it did not answer
        self._probing: set[str] = set()  # members with a liveness probe under way
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Starts watching the group."""
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"jetwake-members-{self.place.member_id}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def connection_lost(self, peer_id: str) -> None:
        """A connection to or from ``peer_id`` closed (the peer network's hook, on the thread
        that noticed), or a call to it went unanswered: if ``peer_id`` coordinates the
        cluster, whether its process is gone is checked on the pool."""
        place = self.place
        if not self.fast_failover or self.stopped or self._checking_coordinator \
                or place.role.is_coordinator:
            return
        known = [m.id for m in place.calls.known_members if m.is_coordinator]
        if known and known[0] != peer_id:
            return
        self._checking_coordinator = True
        try:
            place.pool.submit(self._remove_coordinator_if_gone, peer_id)
        except RuntimeError:  # the pool shut down: leaving the cluster
            self._checking_coordinator = False

    def _remove_coordinator_if_gone(self, peer_id: str) -> None:
        """Removes the coordinator ``peer_id`` from the group when its process is gone (the
        module doc says why that is safe)."""
        place = self.place
        membership = place.membership
        try:
            found = membership.coordinator_consumer() if membership is not None else None
            if found is None or found[0].id != peer_id or peer_id == place.member_id:
                return
            info, consumer = found
            if not nothing_listens(info.address):
                log.info("member %s: coordinator %s does not answer, but its process still "
                         "listens at %s (paused or busy?): Kafka's session timeout decides",
                         place.member_id, peer_id, info.address)
                return
            removed = membership.remove_dead_consumer(consumer)  # type: ignore[union-attr]
            if removed:
                self.removed_coordinators += 1
                log.warning("member %s had Kafka remove coordinator %s from cluster '%s': "
                            "nothing listens at its peer address %s (its process is gone); "
                            "the oldest survivor takes over now", place.member_id, peer_id,
                            place.cluster_name, info.address)
        except Exception as e:  # noqa: BLE001 - the session timeout still removes it
            log.warning("member %s could not have coordinator %s removed at once (%s); Kafka "
                        "drops it after the session timeout", place.member_id, peer_id, e)
        finally:
            self._checking_coordinator = False

    def note_unreachable(self, member_id: str) -> None:
        """``member_id`` did not answer: it is not used (nor scaled up to) until it answers a
        probe again or leaves the group."""
        self.unreachable.add(member_id)

    def execution_members(self) -> list[tuple[str, str]]:
        """The members an execution starting now runs on: (id, peer address), by id.

        Every other member is asked first (in parallel, briefly): one that does not answer
        (its process is gone while Kafka still lists it, until the session timeout) or that
        refuses this member (another token, cluster or version) is left out, so a job
        restarts on the survivors at once instead of waiting for Kafka to drop the dead; a
        member left out that is alive joins again through auto-scaling."""
        place = self.place
        calls = place.calls
        members = calls.refresh_members()
        if not any(m.id == place.member_id for m in members):
            assert place.network is not None  # joined
            members = members + [MemberInfo(place.member_id, place.network.address, True)]
        candidates = [m for m in members if m.id not in self.leaving]
        probes = {m.id: place.pool.submit(calls.call_member, m.id, "cluster.info", [],
                                          PROBE_TIMEOUT_S)
                  for m in candidates if m.id != place.member_id}
        usable = []
        for m in candidates:
            if m.id != place.member_id:
                try:
                    probes[m.id].result(PROBE_TIMEOUT_S + 5)
                except Exception as e:  # noqa: BLE001 - left out, with why
                    log.warning("member %s is left out of the execution starting now: %s",
                                m.id, e)
                    self.note_unreachable(m.id)
                    continue
                self.unreachable.discard(m.id)
            usable.append((m.id, m.address))
        return sorted(usable)

    def _reprobe_unreachable(self, present: set[str]) -> None:
        self.unreachable &= present
        for m in list(self.unreachable):
            try:
                self.place.calls.call_member(m, "cluster.info", [], PROBE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - still out of reach
                continue
            self.unreachable.discard(m)

    def _watch(self) -> None:
        """Compares the group's members with the executions every second: an execution a
        member that left took part in cannot go on (its coordinator restarts or fails it),
        and this member's share of an execution whose coordinator left is stopped (a light
        job dies with its coordinator; a new coordinator restarts the others)."""
        place = self.place
        member = place.member
        rounds = 0
        while not self._stop.wait(MEMBER_CHECK_INTERVAL_S):
            try:
                present = {m.id for m in place.calls.refresh_members()}
            except Exception as e:  # noqa: BLE001 - Kafka away: the next round tries again
                log.debug("listing the cluster's members failed: %r", e)
                continue
            # a member missing from one listing may be in the middle of a rebalance: it
            # counts as gone when two listings in a row miss it
            for m in present:
                self._absent.pop(m, None)
            for m in self._seen - present:
                self._absent[m] = self._absent.get(m, 0) + 1
            self._seen |= present
            gone = {m for m, n in self._absent.items() if n >= ABSENT_ROUNDS}
            self._seen -= gone
            for m in gone:
                self._absent.pop(m, None)
            present |= {m for m in self._absent}  # missed once: still counted present
            self.leaving &= present
            coordinator = place.role.is_coordinator
            if self.unreachable and coordinator:
                place.pool.submit(self._reprobe_unreachable, set(present))
            if coordinator:
                self._probe_execution_members(present)
            usable = present - self.leaving - self.unreachable
            for c in member.coordinators():
                execution = c.running_execution()
                if execution is None:
                    continue
                for m in execution.members:
                    if m not in usable:
                        c.member_changes.member_left(m)
                joined = usable - set(execution.members)
                if joined and place.role.is_coordinator:
                    c.member_changes.members_joined(joined, place.scale_up_delay_s)
            rounds += 1
            participant = member.participant
            for ex in participant.running():
                if ex.coordinator not in present:
                    log.warning("member %s stops its share of %s: its coordinator %s left "
                                "the cluster", place.member_id, ex.exec_key, ex.coordinator)
                    participant.cancel(ex.exec_key)
                elif ex.coordinator != place.member_id and rounds % STALE_CHECK_ROUNDS == 0:
                    place.pool.submit(self._drop_if_stale, ex.exec_key, ex.coordinator)

    def _probe_execution_members(self, present: set[str]) -> None:
        """Asks every member of a running execution whether it is there (one probe each at a
        time). Kafka only notices a member whose process or machine is gone; one that its
        peers cannot reach while Kafka still lists it would otherwise hold its execution
        until the barrier of a snapshot cannot align without it."""
        place = self.place
        members: set[str] = set()
        for c in place.member.coordinators():
            execution = c.running_execution()
            if execution is not None:
                members.update(execution.members)
        members = (members & present) - self.unreachable - {place.member_id}
        for m in set(self._unanswered) - members:
            self._unanswered.pop(m, None)
        for m in members - self._probing:
            self._probing.add(m)
            place.pool.submit(self._probe_member, m)

    def _probe_member(self, member_id: str) -> None:
        try:
            self.place.calls.call_member(member_id, "cluster.info", [], PROBE_TIMEOUT_S)
        except PeerUnreachableError as e:
            count = self._unanswered.get(member_id, 0) + 1
            self._unanswered[member_id] = count
            if count >= UNANSWERED_PROBES:
                log.warning("member %s is out of reach (%d probes in a row: %s); its "
                            "executions go on without it", member_id, count, e)
                self._unanswered.pop(member_id, None)
                self.note_unreachable(member_id)
            return
        except Exception as e:  # noqa: BLE001 - it answered, with an error: it is there
            log.debug("probing member %s: %r", member_id, e)
        else:
            self._unanswered.pop(member_id, None)
        finally:
            self._probing.discard(member_id)

    def _drop_if_stale(self, exec_key: str, coordinator: str) -> None:
        """Stops this member's share of an execution its coordinator no longer runs (this
        member was paused or cut off, and the job went on without it)."""
        place = self.place
        participant = place.member.participant
        try:
            current = place.calls.call_member(coordinator, "cluster.is_current", [exec_key],
                                              PROBE_TIMEOUT_S)
        except PeerUnreachableError as e:
            # the coordinator's process is gone (or cut off): the share cannot snapshot any
            # more, and what it still did would only be replayed after the failover
            log.warning("member %s stops its share of %s: its coordinator %s is out of reach "
                        "(%s)", place.member_id, exec_key, coordinator, e)
            participant.cancel(exec_key)
            self.connection_lost(coordinator)
            return
        except Exception as e:  # noqa: BLE001 - asked again at the next round
            log.debug("asking %s about %s failed: %r", coordinator, exec_key, e)
            return
        if not current:
            log.warning("member %s stops its share of %s: its coordinator %s no longer runs "
                        "it", place.member_id, exec_key, coordinator)
            participant.cancel(exec_key)
