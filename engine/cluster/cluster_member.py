"""A member of a cluster: the member's engine, plus its place in the cluster.

``ClusterMember(data_dir, cluster="NAME", kafka_bootstrap_servers="host:9092", token=...)``
joins the cluster ``NAME`` through Kafka (:mod:`membership`), listens for its peers
(:mod:`peer_network`) and runs its share of every job of the cluster
(:mod:`jetwake.engine.jobs.execution_participant`). The member Kafka makes coordinator
coordinates every job (:mod:`jetwake.engine.jobs.job_coordinator`): it fences any earlier coordinator, reads the job records of the
cluster and resumes the jobs that were running. Jobs are submitted to the coordinator; a
member's service forwards what its clients ask about jobs to it, so every member gives the same
answers.

Without ``cluster`` it is a plain single-process member, exactly as before.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from jetwake.engine.cluster.cluster_job_records import ClusterJobRecords
from jetwake.engine.cluster.cluster_maps import ClusterMaps
from jetwake.engine.cluster.cluster_records import ClusterRecords
from jetwake.engine.cluster.cluster_snapshot_store import ClusterSnapshotStore
from jetwake.engine.jobs.execution_participant import ExecutionParticipant
from jetwake.engine.cluster.membership import FencedError, KafkaMembership, MemberInfo
from jetwake.engine.cluster.peer_link import PeerRefusedError
from jetwake.engine.cluster.peer_network import PeerNetwork, PeerUnreachableError
from jetwake.engine.cluster.snapshot_data_topic import SnapshotDataTopic, files_under
from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.jobs.job import Job
from jetwake.engine.jobs.execution_messages import (
    REQUESTS, ExecutionEnded, ExecutionMessage, ForgetJob, InitExecution, decode, decode_request,
)
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_coordinator import JobCoordinator
from jetwake.engine.jobs.member import Member, new_job_id
from jetwake.snapshot.store.snapshot_store import CommitRecord

__all__ = ["ClusterMember", "NotCoordinatorError"]

log = logging.getLogger("jetwake.cluster")

# a light job's id: light-<member id>-<job id>, so any member knows where to ask about it
LIGHT_PREFIX = "light-"

# how long a request about jobs waits for the cluster to have a coordinator
COORDINATOR_WAIT_S = 15.0

# how often the coordinator compares the group's members with those of its executions
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


class NotCoordinatorError(JetwakeError):
    """A job operation reached a member that does not coordinate the cluster's jobs.
    Restartable: the cluster is electing or has elected another coordinator."""

    restartable = True


class ClusterMember(Member):
    """A member that, given ``cluster``, takes part in a cluster (see the module doc).

    ``kafka_bootstrap_servers``: the Kafka cluster through which members find each other and
    choose the coordinator, and where records and snapshot data are kept.
    ``token``: the cluster's shared secret; peers prove they hold it before anything is decoded.
    ``peer_host``/``peer_port``: where to listen for peers (port 0: a free port);
    ``advertise``: the ``host:port`` peers should connect to, if not the listening address.
    ``session_timeout_ms``: how long a silent member stays in the cluster.
    ``scale_up_delay_ms``: how long after the last member joined the coordinator restarts
    auto-scaling jobs to use the new members (Jet's scale-up delay).
    """

    def __init__(self, data_dir: str | os.PathLike | None = None, *,
                 cluster: str | None = None, kafka_bootstrap_servers: str | None = None,
                 token: str | None = None, member_id: str | None = None,
                 peer_host: str = "127.0.0.1", peer_port: int = 0,
                 advertise: str | None = None, session_timeout_ms: int = 6000,
                 scale_up_delay_ms: int = 10_000, **member_options: Any) -> None:
        self.cluster_name = cluster
        self.client_address: str | None = None  # set by the member's service, if any
        #: handles a client request forwarded by another member: (frame, client) -> reply
        self.forwarded_request_handler: Callable[[bytes, str], bytes] | None = None
        if cluster is None:
            if kafka_bootstrap_servers is not None:
                raise ValueError("kafka_bootstrap_servers is for a member of a cluster: give "
                                 "cluster='NAME' too")
            super().__init__(data_dir, **member_options)
            return
        if not isinstance(kafka_bootstrap_servers, str) or not kafka_bootstrap_servers.strip():
            raise ValueError(f"a member of cluster '{cluster}' needs kafka_bootstrap_servers "
                             "('host:9092'): the cluster's members find each other through Kafka")
        if data_dir is None:
            raise ValueError(f"a member of cluster '{cluster}' needs a data directory "
                             "(data_dir=...): its share of snapshots is written there first")
        if type(session_timeout_ms) is not int or not 1000 <= session_timeout_ms <= 300_000:
            raise ValueError(f"session_timeout_ms must be an int in [1000, 300000] (Kafka's "
                             f"group limits), got {session_timeout_ms!r}")
        if type(scale_up_delay_ms) is not int or scale_up_delay_ms < 0:
            raise ValueError(f"scale_up_delay_ms must be an int >= 0, got {scale_up_delay_ms!r}")
        self.scale_up_delay_s = scale_up_delay_ms / 1000
        self.member_id = member_id or f"m-{secrets.token_hex(4)}"
        self.bootstrap_servers = kafka_bootstrap_servers
        self.cluster_token = token
        self._addresses: dict[str, str] = {}
        self._verified: set[str] = set()  # members whose peer connection was accepted
        self._leaving: set[str] = set()  # members handing their work over before they go
        self._unreachable: set[str] = set()  # in the group, but did not answer a probe
        self._seen: set[str] = set()  # members the watcher has seen in the group
        self._absent: dict[str, int] = {}  # member -> listings in a row that missed it
        self._unanswered: dict[str, int] = {}  # member -> probes in a row it did not answer
        self._probing: set[str] = set()  # members with a liveness probe under way
        self._known_members: list[MemberInfo] = []
        self._coordinator_lock = threading.Lock()
        self._became_coordinator = threading.Event()
        self._stop_watch = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="jetwake-cluster")
        self.records = ClusterRecords(kafka_bootstrap_servers, cluster)
        # the cluster's maps and lists, kept in Kafka; None: this member's own
        self.cluster_maps = ClusterMaps(kafka_bootstrap_servers, cluster)
        self.data_topic = SnapshotDataTopic(kafka_bootstrap_servers, cluster)
        self.network: PeerNetwork | None = None
        self.membership: KafkaMembership | None = None
        try:
            self.records.ensure_topic()
            self.data_topic.ensure_topic()
            super().__init__(data_dir, **member_options)
            self.network = PeerNetwork(cluster, self.member_id, token, host=peer_host,
                                       port=peer_port, advertise=advertise).start()
            self._addresses[self.member_id] = self.network.address
            self.participant = ExecutionParticipant(
                self, self.member_id, self.network.edges, self._report_end, self._share_part)
            self.network.set_call_handler(self._on_call)
            self.network.set_message_handler("exec.ended",
                                             lambda peer, payload: self._on_exec_ended(payload))
            self.membership = KafkaMembership(
                kafka_bootstrap_servers, cluster, self.member_id, self.network.address,
                session_timeout_ms=session_timeout_ms, on_change=self._coordinator_changed)
            # a ClusterSnapshotStore in a cluster (_new_snapshot_store)
            self.snapshot_store.on_job_deleted = self._forget_job_everywhere  # type: ignore[attr-defined]
            self.membership.start()
            self._verify_with_cluster()
        except BaseException:
            self._leave()
            if not self._shut_down:
                self._abandon_start()
            raise
        self._watcher = threading.Thread(target=self._watch_members, daemon=True,
                                         name=f"jetwake-members-{self.member_id}")
        self._watcher.start()
        log.info("member %s joined cluster '%s' (peers at %s)", self.member_id, cluster,
                 self.network.address)

    # --- the parts a cluster replaces ------------------------------------------------------------

    @property
    def in_cluster(self) -> bool:
        return self.cluster_name is not None

    def _new_job_records(self):  # type: ignore[override]
        if not self.in_cluster:
            return super()._new_job_records()
        return ClusterJobRecords(self.records)

    def _new_snapshot_store(self):  # type: ignore[override]
        if not self.in_cluster:
            return super()._new_snapshot_store()
        return ClusterSnapshotStore(self.data_dir, self.data_topic, self.records)

    def _recover_jobs(self, records: list | None = None) -> None:
        if not self.in_cluster:
            super()._recover_jobs(records)
        # in a cluster the coordinator resumes the cluster's jobs when it is elected

    def _new_coordinator(self, job_id: str, definition: Any, config: JobConfig,
                         submission_time: float | None = None) -> JobCoordinator:
        return JobCoordinator(self, job_id, definition, config, submission_time)

    # --- maps and lists ------------------------------------------------------------------------

    def get_map(self, name: str):
        """The named map: in a cluster the cluster's map, the same from every member and kept
        in Kafka (see cluster_maps.py); otherwise this member's."""
        if not self.in_cluster or self.cluster_maps is None:
            return super().get_map(name)
        return self.cluster_maps.get_map(name)

    def get_list(self, name: str):
        if not self.in_cluster or self.cluster_maps is None:
            return super().get_list(name)
        return self.cluster_maps.get_list(name)

    def sync_maps(self) -> None:
        super().sync_maps()
        if self.in_cluster and self.cluster_maps is not None:
            self.cluster_maps.sync()

    # --- jobs ----------------------------------------------------------------------------------

    @property
    def is_coordinator(self) -> bool:
        """Whether this member coordinates the cluster's jobs (always, without a cluster)."""
        return not self.in_cluster or (self.membership is not None
                                       and self.membership.is_coordinator)

    def add_job(self, pipeline: Any, config: JobConfig | None = None) -> JobCoordinator:
        if self.in_cluster:
            self._require_coordinator("submit a job")
            if not self._became_coordinator.wait(30):
                raise NotCoordinatorError(
                    f"member {self.member_id} was chosen coordinator but could not take over "
                    "within 30 s (see its log); try again")
        return super().add_job(pipeline, config)

    def await_coordination(self, timeout: float = COORDINATOR_WAIT_S) -> None:
        """On a member that has just become the coordinator: waits until it has taken over
        (fenced its predecessor and read the cluster's job records), so that what it answers
        about the jobs is complete."""
        if self.in_cluster and self.is_coordinator:
            self._became_coordinator.wait(timeout)

    def _require_coordinator(self, action: str) -> None:
        deadline = time.monotonic() + 2.0
        while not self.is_coordinator and time.monotonic() < deadline \
                and self.coordinator_id(refresh=True) is None:
            time.sleep(0.1)  # partition 0 is moving: it may come here
        if not self.is_coordinator:
            coordinator = self.coordinator_id()
            raise NotCoordinatorError(
                f"cannot {action} on member {self.member_id}: member {coordinator} coordinates "
                f"the jobs of cluster '{self.cluster_name}'. Use a Client connected to any "
                "member (it forwards to the coordinator), or that member")

    def new_light_job(self, pipeline: Any, config: JobConfig | None = None) -> Job:
        """Starts a light job: one request starts it on every member, this member coordinates
        it; no snapshots, no job record, and it ends if this member goes away."""
        c = self.add_light_job(pipeline, config)
        c.start(restore="none", persist_definition=False)
        return Job(c)

    def add_light_job(self, pipeline: Any, config: JobConfig | None = None) -> JobCoordinator:
        """Registers a light job coordinated by this member, without starting it."""
        self._check_running()
        config = config or JobConfig()
        if not isinstance(config, JobConfig):
            raise TypeError(f"new_light_job() expects a JobConfig, got "
                            f"{type(config).__qualname__}")
        if config.processing_guarantee != "none":
            raise ValueError("a light job takes no snapshots: submit it with "
                             "JobConfig(processing_guarantee='none') (the default), or use "
                             "new_job() for a job with a processing guarantee")
        if config.initial_snapshot_name:
            raise ValueError("a light job cannot start from a snapshot "
                             "(JobConfig.initial_snapshot_name): use new_job()")
        if not self.in_cluster:
            return Member.add_job(self, pipeline, config)
        with self._lock:
            c = JobCoordinator(self, f"{LIGHT_PREFIX}{self.member_id}-{new_job_id()}",
                               pipeline, config, light=True)
            self._jobs[c.job_id] = c
        return c

    def light_job_owner(self, job_ref: str) -> str | None:
        """The member coordinating the light job ``job_ref`` (its id names it); None for a
        job that is not light (or a name)."""
        if not job_ref.startswith(LIGHT_PREFIX):
            return None
        return job_ref[len(LIGHT_PREFIX):].rsplit("-", 4)[0]

    # --- calls between members -----------------------------------------------------------------

    def call_member(self, member_id: str, method: str, args: list, timeout: float) -> Any:
        """Calls ``method`` on a member of the cluster (this one directly)."""
        if member_id == self.member_id:
            return self._dispatch(method, args)
        address = self._addresses.get(member_id)
        if address is None:
            self._refresh_members()
            address = self._addresses.get(member_id)
        if address is None:
            raise PeerUnreachableError(f"member {member_id} is not in cluster "
                                       f"'{self.cluster_name}' (any more)")
        return self.network.call(member_id, address, method, args, timeout)  # type: ignore

    def _on_call(self, peer_id: str, method: str, args: list) -> Any:
        return self._dispatch(method, args)

    def call_execution(self, member_id: str, message: ExecutionMessage,
                       timeout: float) -> ExecutionMessage | None:
        """Delivers an execution's request to a member (this one in-process, through the same
        encoding) and decodes its reply (the ExecutionTransport of the job coordinators)."""
        if not self.in_cluster:
            return super().call_execution(member_id, message, timeout)
        wire = self.call_member(member_id, message.OP, [message.to_wire()], timeout)
        reply = message.REPLY
        return None if reply is None else decode(reply, wire)

    def _dispatch(self, method: str, args: list) -> Any:
        if method in REQUESTS:
            return self._serve_execution(decode_request(method, args))
        if method == "cluster.info":
            return self.local_info()
        if method == "cluster.is_current":
            return self.is_current_execution(args[0])
        if method == "cluster.leaving":
            return self.member_leaving(args[0])
        if method == "cluster.request":
            forward = self.forwarded_request_handler
            if forward is None:
                raise JetwakeError(f"member {self.member_id} serves no clients")
            frame, client = args
            return forward(frame, client)
        raise ValueError(f"unknown cluster call '{method}'")

    def _serve_execution(self, message: ExecutionMessage) -> Any:
        """Serves an execution's request; returns the encoded reply."""
        if isinstance(message, InitExecution):  # the execution's members, where to report
            for member_id, address in message.members:
                self._addresses.setdefault(member_id, address)
            current = self.coordinator_id(refresh=True)
            if not message.exec_key.startswith(LIGHT_PREFIX) and current is not None \
                    and message.coordinator != current:
                # a deposed coordinator (paused, cut off) must not start executions
                raise NotCoordinatorError(
                    f"member {self.member_id} refuses execution {message.exec_key} from "
                    f"{message.coordinator}: that member is not the coordinator of cluster "
                    f"'{self.cluster_name}'")
        reply = self.participant.handle(message)
        return None if reply is None else reply.to_wire()

    def forward_request(self, frame: bytes, client: str, timeout: float,
                        target: str | None = None) -> bytes:
        """Hands a client's request to member ``target`` (the coordinator when None); returns
        its encoded reply."""
        if target is not None:
            return self.call_member(target, "cluster.request", [frame, client], timeout)
        # the coordinator may be changing (a member left): ask again until one answers
        deadline = time.monotonic() + COORDINATOR_WAIT_S
        while True:
            target = self.coordinator_id(refresh=True)
            if target is not None:
                reply = self.call_member(target, "cluster.request", [frame, client], timeout)
                if not _refused_as_not_coordinator(reply):
                    return reply
            if time.monotonic() >= deadline:
                raise NotCoordinatorError(
                    f"cluster '{self.cluster_name}' has no coordinator at the moment (for "
                    f"{COORDINATOR_WAIT_S:.0f} s); try again in a few seconds")
            time.sleep(0.2)

    def ask_other_members(self, frame: bytes, client: str, timeout: float = 10.0) -> list[dict]:
        """Sends a client request to every other member; their decoded replies (a member that
        does not answer is left out, and logged)."""
        from jetwake.engine.core.serialization import loads
        others = [m.id for m in self._refresh_members() if m.id != self.member_id]
        futures = {m: self._pool.submit(self.forward_request, frame, client, timeout, m)
                   for m in others}
        out = []
        for m, f in futures.items():
            try:
                out.append(loads(f.result(timeout + 5)))
            except Exception as e:  # noqa: BLE001 - a member away: its jobs are not listed
                log.warning("member %s did not answer a request: %s", m, e)
        return out

    def _share_part(self, directory: str, prefix: str) -> dict:
        """Copies a snapshot part's files into the cluster's snapshot data topic."""
        paths = files_under(directory, os.listdir(directory))
        return self.data_topic.upload(directory, paths, prefix) if paths else {}

    def _report_end(self, coordinator: str, ended: ExecutionEnded,
                    cause: BaseException | None) -> None:
        # the cause stays here: every member's end reaches the coordinator as its message
        payload = ended.to_wire()
        if coordinator == self.member_id:
            self._on_exec_ended(payload)
            return
        address = self._addresses.get(coordinator)
        if address is None:
            self._refresh_members()
            address = self._addresses.get(coordinator)
        if address is None:
            raise PeerUnreachableError(f"coordinator {coordinator} is gone")
        self.network.send(coordinator, address, "exec.ended", payload)  # type: ignore

    def _on_exec_ended(self, payload: Any) -> None:
        self.deliver_execution_end(decode(ExecutionEnded, payload))

    def _forget_job_everywhere(self, job_id: str) -> None:
        for m in self._known_members:
            if m.id != self.member_id:
                self._pool.submit(self._forget_on, m.id, job_id)

    def _forget_on(self, member_id: str, job_id: str) -> None:
        try:
            self.call_execution(member_id, ForgetJob(job_id=job_id), 10.0)
        except Exception as e:  # noqa: BLE001 - leftovers on a member are only clutter
            log.debug("member %s did not drop the snapshots of job %s: %r", member_id,
                      job_id, e)

    # --- membership ----------------------------------------------------------------------------

    def _refresh_members(self) -> list[MemberInfo]:
        assert self.membership is not None
        members = self.membership.members()
        for m in members:
            self._addresses[m.id] = m.address
        self._known_members = members
        return members

    def _verify_with_cluster(self) -> None:
        """Proves this member to the others over the peer network: a member with another
        token, cluster name or an incompatible version is refused there, and leaves at once
        with the reason instead of sitting in the group (where Kafka could even make it the
        coordinator)."""
        others = [m.id for m in self._refresh_members() if m.id != self.member_id]
        for other in others:
            try:
                self.call_member(other, "cluster.info", [], 15.0)
            except PeerUnreachableError as e:
                if "refused" in str(e):
                    raise PeerRefusedError(
                        f"member {self.member_id} cannot join cluster '{self.cluster_name}': "
                        f"{e}") from None
                log.warning("member %s cannot reach member %s yet: %s", self.member_id,
                            other, e)
                continue
            self._verified.add(other)

    def execution_members(self) -> list[tuple[str, str]]:
        """The members an execution starting now runs on: (id, peer address), by id.

        Every other member is asked first (in parallel, briefly): one that does not answer
        (its process is gone while Kafka still lists it, until the session timeout) or that
        refuses this member (another token, cluster or version) is left out, so a job
        restarts on the survivors at once instead of waiting for Kafka to drop the dead; a
        member left out that is alive joins again through auto-scaling."""
        if not self.in_cluster:
            return super().execution_members()
        members = self._refresh_members()
        if not any(m.id == self.member_id for m in members):
            assert self.network is not None  # a member of a cluster
            members = members + [MemberInfo(self.member_id, self.network.address, True)]
        candidates = [m for m in members if m.id not in self._leaving]
        probes = {m.id: self._pool.submit(self.call_member, m.id, "cluster.info", [],
                                          PROBE_TIMEOUT_S)
                  for m in candidates if m.id != self.member_id}
        usable = []
        for m in candidates:
            if m.id != self.member_id:
                try:
                    probes[m.id].result(PROBE_TIMEOUT_S + 5)
                except Exception as e:  # noqa: BLE001 - left out, with why
                    log.warning("member %s is left out of the execution starting now: %s",
                                m.id, e)
                    self.note_unreachable(m.id)
                    continue
                self._verified.add(m.id)
                self._unreachable.discard(m.id)
            usable.append((m.id, m.address))
        return sorted(usable)

    def note_unreachable(self, member_id: str) -> None:
        """``member_id`` did not answer: it is not used (nor scaled up to) until it answers a
        probe again or leaves the group."""
        self._unreachable.add(member_id)

    def _reprobe_unreachable(self, present: set[str]) -> None:
        self._unreachable &= present
        for m in list(self._unreachable):
            try:
                self.call_member(m, "cluster.info", [], PROBE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - still out of reach
                continue
            self._unreachable.discard(m)

    def coordinator_id(self, refresh: bool = False) -> str | None:
        """The member coordinating the cluster's jobs, as the group shows it (None while
        Kafka is moving partition 0)."""
        if self.is_coordinator:
            return self.member_id
        members = self._refresh_members() if refresh or not self._known_members \
            else self._known_members
        found = [m.id for m in members if m.is_coordinator and m.id != self.member_id]
        if not found and not refresh:
            found = [m.id for m in self._refresh_members()
                     if m.is_coordinator and m.id != self.member_id]
        return found[0] if found else None

    def _coordinator_changed(self, is_coordinator: bool) -> None:
        if self._stop_watch.is_set():
            return
        self._pool.submit(self._take_over if is_coordinator else self._step_down)

    def _step_down(self) -> None:
        """This member is no longer the coordinator (it was paused or cut off past the session
        timeout, and Kafka gave partition 0 to another): it stops coordinating the cluster's
        jobs without writing anything (its writes would be fenced anyway) and goes on as a
        plain member; the new coordinator resumes the jobs from their records."""
        with self._coordinator_lock:
            self._became_coordinator.clear()
            with self._lock:
                jobs = [c for c in self._jobs.values() if not c.light]
                for c in jobs:
                    self._jobs.pop(c.job_id, None)
            for c in jobs:
                c.abandon()
            if jobs:
                log.warning("member %s is no longer the coordinator of cluster '%s': it "
                            "stopped coordinating %d job(s); the new coordinator resumes them",
                            self.member_id, self.cluster_name, len(jobs))

    def _take_over(self) -> None:
        """Becomes the cluster's coordinator: fences every earlier one, then resumes the jobs
        the cluster's records say were running."""
        with self._coordinator_lock:
            if self._stop_watch.is_set():
                return  # leaving the cluster
            try:
                self.records.open_writer()
            except Exception as e:  # noqa: BLE001 - retried at the next election
                log.error("member %s could not take over as coordinator: %r", self.member_id, e)
                return
            log.info("member %s coordinates cluster '%s'", self.member_id, self.cluster_name)
            try:
                with self._lock:
                    known = set(self._jobs)
                Member._recover_jobs(self, [r for r in self.job_records.load_all()
                                            if r.job_id not in known])
            except Exception:  # noqa: BLE001 - the member goes on, the log says why
                log.exception("member %s could not resume the cluster's jobs", self.member_id)
            self._became_coordinator.set()

    def _watch_members(self) -> None:
        """Compares the group's members with the executions every second: an execution a
        member that left took part in cannot go on (its coordinator restarts or fails it),
        and this member's share of an execution whose coordinator left is stopped (a light
        job dies with its coordinator; a new coordinator restarts the others)."""
        rounds = 0
        while not self._stop_watch.wait(MEMBER_CHECK_INTERVAL_S):
            try:
                present = {m.id for m in self._refresh_members()}
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
            self._leaving &= present
            if self._unreachable and self.is_coordinator:
                self._pool.submit(self._reprobe_unreachable, set(present))
            if self.is_coordinator:
                self._probe_execution_members(present)
            usable = present - self._leaving - self._unreachable
            for c in self.coordinators():
                execution = c.running_execution()
                if execution is None:
                    continue
                for m in execution.members:
                    if m not in usable:
                        c.member_changes.member_left(m)
                joined = usable - set(execution.members)
                if joined and self.is_coordinator:
                    c.member_changes.members_joined(joined, self.scale_up_delay_s)
            rounds += 1
            for ex in self.participant.running():
                if ex.coordinator not in present:
                    log.warning("member %s stops its share of %s: its coordinator %s left "
                                "the cluster", self.member_id, ex.exec_key, ex.coordinator)
                    self.participant.cancel(ex.exec_key)
                elif ex.coordinator != self.member_id and rounds % STALE_CHECK_ROUNDS == 0:
                    self._pool.submit(self._drop_if_stale, ex.exec_key, ex.coordinator)

    def _probe_execution_members(self, present: set[str]) -> None:
        """Asks every member of a running execution whether it is there (one probe each at a
        time). Kafka only notices a member whose process or machine is gone; one that its
        peers cannot reach while Kafka still lists it would otherwise hold its execution
        until the barrier of a snapshot cannot align without it."""
        members: set[str] = set()
        for c in self.coordinators():
            execution = c.running_execution()
            if execution is not None:
                members.update(execution.members)
        members = (members & present) - self._unreachable - {self.member_id}
        for m in set(self._unanswered) - members:
            self._unanswered.pop(m, None)
        for m in members - self._probing:
            self._probing.add(m)
            self._pool.submit(self._probe_member, m)

    def _probe_member(self, member_id: str) -> None:
        try:
            self.call_member(member_id, "cluster.info", [], PROBE_TIMEOUT_S)
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
        try:
            current = self.call_member(coordinator, "cluster.is_current", [exec_key],
                                       PROBE_TIMEOUT_S)
        except PeerUnreachableError as e:
            # the coordinator's process is gone (or cut off): the share cannot snapshot any
            # more, and what it still did would only be replayed after the failover
            log.warning("member %s stops its share of %s: its coordinator %s is out of reach "
                        "(%s)", self.member_id, exec_key, coordinator, e)
            self.participant.cancel(exec_key)
            return
        except Exception as e:  # noqa: BLE001 - asked again at the next round
            log.debug("asking %s about %s failed: %r", coordinator, exec_key, e)
            return
        if not current:
            log.warning("member %s stops its share of %s: its coordinator %s no longer runs "
                        "it", self.member_id, exec_key, coordinator)
            self.participant.cancel(exec_key)

    def is_current_execution(self, exec_key: str) -> bool:
        c = self.find_coordinator(exec_key.split(".")[0])
        return c is not None and c.is_current(exec_key)

    def publish_commit_record(self, rec: CommitRecord) -> None:
        """Writes a snapshot's commit record where every member can read it: the commit point
        of a cluster-wide snapshot. Raises FencedError when this member was deposed."""
        if not self.in_cluster:
            return
        try:
            self.records.put(f"commit/{rec.job_id}/{rec.snapshot_id}", rec.to_json().encode())
        except FencedError:
            log.error("member %s was deposed as coordinator: snapshot %d of job %s is not "
                      "committed", self.member_id, rec.snapshot_id, rec.job_name)
            raise

    # --- what the cluster looks like ----------------------------------------------------------

    def local_info(self) -> dict:
        """This member as `jetwake cluster` shows it."""
        return {"id": self.member_id, "address": self.client_address,
                "peer_address": self.network.address if self.network else None,
                "jobs": len(self.participant.running()),
                "state": "ACTIVE" if not self._shut_down else "SHUTTING_DOWN",
                "coordinator": self.is_coordinator, "pid": os.getpid(),
                "data_dir": self.data_dir}

    def cluster_info(self) -> dict:
        """The cluster: its name, coordinator, quorum and every member with its address (the
        client address), running executions and state; a member that does not answer is
        listed as UNREACHABLE."""
        if not self.in_cluster:
            raise JetwakeError("this member is not part of a cluster")
        members = self._refresh_members()
        futures = {m.id: self._pool.submit(self.call_member, m.id, "cluster.info", [], 5.0)
                   for m in members}
        out = []
        for m in members:
            try:
                info = futures[m.id].result(10)
            except Exception as e:  # noqa: BLE001 - listed as unreachable, with why
                info = {"id": m.id, "address": None, "peer_address": m.address, "jobs": None,
                        "state": "UNREACHABLE", "error": str(e)}
            info["coordinator"] = m.is_coordinator
            out.append(info)
        coordinator = next((m.id for m in members if m.is_coordinator), None)
        return {"name": self.cluster_name, "coordinator": coordinator,
                "quorum": len(members) // 2 + 1, "size": len(members),
                "members": sorted(out, key=lambda i: i["id"])}

    # --- leaving -------------------------------------------------------------------------------

    def member_leaving(self, member_id: str) -> int:
        """On the coordinator: ``member_id`` is shutting down gracefully. Every running job it
        takes part in takes a terminal snapshot with it still there, then restarts on the
        others, so nothing is replayed that need not be; returns how many jobs moved."""
        self._leaving.add(member_id)
        moved = 0
        for c in self.coordinators():
            execution = c.running_execution()
            if execution is not None and member_id in execution.members:
                c.member_changes.rescale(f"member {member_id} is leaving")
                moved += 1
        return moved

    def _hand_over(self) -> None:
        """Before a graceful leave: asks the coordinator to move this member's work away."""
        coordinator = self.coordinator_id()
        if coordinator is None or coordinator == self.member_id or \
                not self.participant.running():
            return
        try:
            moved = self.call_member(coordinator, "cluster.leaving", [self.member_id], 150.0)
            log.info("member %s handed its share of %d job(s) over before leaving",
                     self.member_id, moved)
        except Exception as e:  # noqa: BLE001 - leaving regardless: the jobs restart
            log.warning("member %s could not hand its work over before leaving (%s); its jobs "
                        "restart from their last snapshot", self.member_id, e)

    def _after_jobs_stopped(self) -> None:
        if self.in_cluster:
            self._hand_over()
            self.participant.cancel_all()
            self._leave()

    def _leave(self) -> None:
        self._stop_watch.set()
        if self.membership is not None:
            self.membership.stop()
        if self.network is not None:
            self.network.stop()
        for part in (self.cluster_maps, self.records, self.data_topic):
            if part is None:
                continue
            try:
                part.close()
            except Exception:  # noqa: BLE001 - leaving regardless
                log.debug("closing %s failed", part, exc_info=True)
        self._pool.shutdown(wait=False)

    def __repr__(self) -> str:
        if not self.in_cluster:
            return super().__repr__()
        return f"ClusterMember({self.member_id} of '{self.cluster_name}', {self.data_dir})"


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
