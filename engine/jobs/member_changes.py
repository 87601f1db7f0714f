"""How a job follows the members it runs on: a quorum (split-brain protection), a member that
left, members that joined (auto-scaling).

A member alone is a cluster of one that never changes, so none of this ever acts there; in a
cluster the member watching the group tells each job's coordinator (Jet's
``MasterJobContext`` reacts to membership the same way).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from jetwake.engine.core.errors import RestartableError
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.jobs.stop_reason import StopReason

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.jobs.job_coordinator import JobCoordinator

__all__ = ["MemberChanges", "QuorumLostError"]

log = logging.getLogger("jetwake.cluster")


class QuorumLostError(RestartableError):
    """Fewer members than the job's quorum are present (split-brain protection): the job
    waits until enough are back."""


class MemberChanges:
    """One job's reactions to its members coming and going."""

    def __init__(self, job: "JobCoordinator") -> None:
        self.job = job
        #: split-brain protection: more than half of the most members the job ran on
        self.quorum_size = 0
        self._timer: threading.Timer | None = None
        self._joined: set[str] = set()
        self._rescaling = False  # a rescale is taking its snapshot or restarting the job
        self._lock = threading.Lock()  # the rescale's timer and flag

    def check_quorum(self, count: int) -> None:
        """Raises the quorum as members join (saving the job record when it grows); refuses
        to run below it under split-brain protection (a restartable cause: the job waits and
        tries again)."""
        job = self.job
        quorum = count // 2 + 1
        if quorum > self.quorum_size:
            self.quorum_size = quorum
            job.save_record()
        if job.config.split_brain_protection and count < self.quorum_size:
            raise QuorumLostError(
                f"job '{job.name}' runs only with a quorum of {self.quorum_size} members "
                f"(split_brain_protection=True); {count} present. It waits until enough "
                "members are back")

    def member_left(self, member_id: str) -> None:
        """A member left the cluster: an execution it took part in cannot go on. It restarts
        on the others, or, with ``auto_scaling=False`` and snapshots, the job is suspended."""
        job = self.job
        execution = job.running_execution()
        if execution is None or member_id not in execution.members:
            return
        if not job.config.auto_scaling and job.config.snapshots_enabled and not job.light:
            job.claim_stop(StopReason.SUSPEND)
            job.member.emit_event(job, f"member {member_id} left: suspended "
                                       "(auto_scaling=False)")
        execution.member_left(member_id)

    def member_lost(self, member_id: str) -> None:
        """A member of the running execution did not answer while it was being stopped."""
        self.job.member.note_unreachable(member_id)
        self.member_left(member_id)

    def members_joined(self, member_ids: set[str], delay_s: float) -> None:
        """Members that the running execution does not use joined: with auto-scaling the job
        restarts from a fresh snapshot to use them, ``delay_s`` after the last of them joined
        (so a group of members starting together costs one restart)."""
        job = self.job
        if not job.config.auto_scaling or job.light or not member_ids:
            return
        with self._lock:
            if self._rescaling:
                return  # the restart under way uses every member there when it starts
            if self._timer is not None:
                if member_ids <= self._joined:
                    return  # already scheduled for these members: the delay runs on
                self._timer.cancel()
            self._joined = set(member_ids)
            timer = threading.Timer(delay_s, self.rescale, args=(f"member(s) "
                                    f"{', '.join(sorted(member_ids))} joined",))
            timer.daemon = True
            self._timer = timer
        timer.start()

    def rescale(self, why: str) -> None:
        """Restarts the running job on the cluster's current members, from a terminal
        snapshot taken first (nothing is replayed that need not be). One rescale at a time;
        none when the execution changed meanwhile (a restart already uses the members)."""
        job = self.job
        with self._lock:
            self._timer = None
            execution = job.current_execution
            if job.status != JobStatus.RUNNING or job.is_stopping \
                    or job.deposed or self._rescaling or execution is None:
                return
            self._rescaling = True
        try:
            log.info("job %s: %s; restarting on the cluster's members", job.name, why)
            job.member.emit_event(job, f"rescaling: {why}")
            if job.config.snapshots_enabled:
                try:
                    job.take_snapshot(terminal=True)
                except Exception as e:  # noqa: BLE001 - restarts from its last snapshot instead
                    log.warning("job %s: the snapshot before rescaling failed (%s); restarting "
                                "from the last one", job.name, e)
            if not job.claim_stop(StopReason.RESTART, execution):
                return  # it stopped or restarted meanwhile
            execution.cancel()
        finally:
            with self._lock:
                self._rescaling = False

    def stop(self) -> None:
        """No rescale happens any more (the job is no longer this member's)."""
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
