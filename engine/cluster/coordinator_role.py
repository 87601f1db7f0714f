"""The coordinator's role in a cluster: the member Kafka makes coordinator (the owner of the
membership group's partition 0) coordinates every job. Taking the role fences every earlier
coordinator and resumes the jobs the cluster's records say were running; losing it (paused or
cut off past the session timeout) stops coordinating them without writing anything. A member
shutting down gracefully asks the coordinator to move its work away first."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from jetwake.engine.cluster.member_calls import NotCoordinatorError

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.cluster.cluster_place import ClusterPlace

__all__ = ["CoordinatorRole"]

log = logging.getLogger("jetwake.cluster")

# how long a member elected coordinator may take to take over before a submission gives up
TAKE_OVER_WAIT_S = 30.0
# the pause before a member holding the role tries again to take over after Kafka failed it
TAKE_OVER_RETRY_S = 1.0


class CoordinatorRole:
    """Whether this member coordinates its cluster's jobs, and what changes when it starts or
    stops doing so."""

    def __init__(self, place: "ClusterPlace") -> None:
        self.place = place
        self._lock = threading.Lock()
        self._took_over = threading.Event()

    @property
    def is_coordinator(self) -> bool:
        """Whether this member coordinates the cluster's jobs."""
        membership = self.place.membership
        return membership is not None and membership.is_coordinator

    def coordinator_id(self, refresh: bool = False) -> str | None:
        """The member coordinating the cluster's jobs, as the group shows it (None while
        Kafka is moving partition 0)."""
        place = self.place
        if self.is_coordinator:
            return place.member_id
        calls = place.calls
        members = calls.refresh_members() if refresh or not calls.known_members \
            else calls.known_members
        found = [m.id for m in members if m.is_coordinator and m.id != place.member_id]
        if not found and not refresh:
            found = [m.id for m in calls.refresh_members()
                     if m.is_coordinator and m.id != place.member_id]
        return found[0] if found else None

    def require(self, action: str) -> None:
        """Raises NotCoordinatorError unless this member coordinates the cluster's jobs and
        has taken over (a member just elected gets a moment to)."""
        place = self.place
        deadline = time.monotonic() + 2.0
        while not self.is_coordinator and time.monotonic() < deadline \
                and self.coordinator_id(refresh=True) is None:
            time.sleep(0.1)  # partition 0 is moving: it may come here
        if not self.is_coordinator:
            coordinator = self.coordinator_id()
            raise NotCoordinatorError(
                f"cannot {action} on member {place.member_id}: member {coordinator} "
                f"coordinates the jobs of cluster '{place.cluster_name}'. Use a Client "
                "connected to any member (it forwards to the coordinator), or that member")
        if not self._took_over.wait(TAKE_OVER_WAIT_S):
            raise NotCoordinatorError(
                f"member {place.member_id} was chosen coordinator but could not take over "
                f"within {TAKE_OVER_WAIT_S:.0f} s (see its log); try again")

    def await_take_over(self, timeout: float) -> None:
        """On a member that has just become the coordinator: waits until it has taken over
        (fenced its predecessor and read the cluster's job records), so that what it answers
        about the jobs is complete."""
        if self.is_coordinator:
            self._took_over.wait(timeout)

    def changed(self, is_coordinator: bool) -> None:
        """Kafka gave this member the role, or took it away (the membership's callback)."""
        place = self.place
        if place.detector.stopped:
            return
        place.pool.submit(self._take_over if is_coordinator else self._step_down)

    def _step_down(self) -> None:
        """This member is no longer the coordinator (it was paused or cut off past the session
        timeout, and Kafka gave partition 0 to another): it stops coordinating the cluster's
        jobs without writing anything (its writes would be fenced anyway) and goes on as a
        plain member; the new coordinator resumes the jobs from their records."""
        place = self.place
        with self._lock:
            self._took_over.clear()
            count = place.member.job_service.abandon_all(keep=lambda c: c.light)
            if count:
                log.warning("member %s is no longer the coordinator of cluster '%s': it "
                            "stopped coordinating %d job(s); the new coordinator resumes them",
                            place.member_id, place.cluster_name, count)

    def _take_over(self) -> None:
        """Becomes the cluster's coordinator: fences every earlier one, then resumes the jobs
        the cluster's records say were running."""
        place = self.place
        with self._lock:
            if place.detector.stopped:
                return  # leaving the cluster
            if not self.is_coordinator:
                # queued while the member held the role, run after Kafka moved it on (two
                # members joining close together): fencing now would fence the real coordinator
                log.info("member %s is no longer the coordinator: no take-over",
                         place.member_id)
                return
            # Kafka may not answer in time (a broker just killed or restarting, the transaction
            # coordinator moving): no new election would follow, so the member tries again as
            # long as it holds the role; giving up left the cluster without a coordinator
            while True:
                try:
                    place.records.open_writer(on_fenced=self.fenced)
                    break
                except Exception as e:  # noqa: BLE001 - tried again while the role is ours
                    if place.detector.stopped:
                        # the member is leaving: its records were closed under the take-over
                        log.info("member %s leaves the cluster: take-over abandoned (%r)",
                                 place.member_id, e)
                        return
                    if not self.is_coordinator:
                        log.error("member %s could not take over as coordinator: %r",
                                  place.member_id, e)
                        return
                    log.warning("member %s could not take over as coordinator yet (%r); "
                                "trying again in %.0f s", place.member_id, e, TAKE_OVER_RETRY_S)
                    time.sleep(TAKE_OVER_RETRY_S)
            log.info("member %s coordinates cluster '%s'", place.member_id, place.cluster_name)
            try:
                place.member.recover_jobs()
            except Exception:  # noqa: BLE001 - the member goes on, the log says why
                log.exception("member %s could not resume the cluster's jobs", place.member_id)
            self._took_over.set()

    def fenced(self, why: str) -> None:
        """A newer coordinator fenced this member's writes (the fenced producer's callback):
        whatever the group last told this member, another one coordinates now. It stops
        coordinating and joins the group again as its youngest member, so that it cannot hold
        partition 0 against the member that fenced it (two members starting together on a
        loaded machine once both coordinated, and the fenced one never stepped down)."""
        membership = self.place.membership
        log.warning("member %s was fenced by a newer coordinator of cluster '%s' (%s): it "
                    "steps down", self.place.member_id, self.place.cluster_name, why)
        if membership is not None:
            membership.deposed(why)

    def member_leaving(self, member_id: str) -> int:
        """On the coordinator: ``member_id`` is shutting down gracefully. Every running job it
        takes part in takes a terminal snapshot with it still there, then restarts on the
        others, so nothing is replayed that need not be; returns how many jobs moved."""
        place = self.place
        place.detector.leaving.add(member_id)
        moved = 0
        for c in place.member.coordinators():
            execution = c.running_execution()
            if execution is not None and member_id in execution.members:
                c.member_changes.rescale(f"member {member_id} is leaving")
                moved += 1
        return moved

    def hand_over(self) -> None:
        """Before a graceful leave: asks the coordinator to move this member's work away."""
        place = self.place
        coordinator = self.coordinator_id()
        if coordinator is None or coordinator == place.member_id or \
                not place.member.participant.running():
            return
        try:
            moved = place.calls.call_member(coordinator, "cluster.leaving", [place.member_id],
                                            150.0)
            log.info("member %s handed its share of %d job(s) over before leaving",
                     place.member_id, moved)
        except Exception as e:  # noqa: BLE001 - leaving regardless: the jobs restart
            log.warning("member %s could not hand its work over before leaving (%s); its jobs "
                        "restart from their last snapshot", place.member_id, e)
