"""The place of a member of a cluster: ``Member(data_dir, cluster="NAME",
kafka_bootstrap_servers="host:9092", token=...)``.

The member joins the cluster ``NAME`` through Kafka (:mod:`membership`), listens for its peers
(:mod:`peer_network`) and runs its share of every job of the cluster through its execution
participant. The member Kafka makes coordinator coordinates every job
(:mod:`coordinator_role`); jobs are submitted to it, and a member's service forwards what its
clients ask about jobs to it, so every member gives the same answers. Job records, commit
records, snapshot data and the named maps are kept in Kafka, where every member reads them.

The place is composed of the calls between members (:mod:`member_calls`), failure detection
(:mod:`failure_detection`) and the coordinator's role (:mod:`coordinator_role`).
"""

from __future__ import annotations

import logging
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from jetwake.engine.cluster.cluster_job_records import ClusterJobRecords
from jetwake.engine.cluster.cluster_maps import ClusterMaps
from jetwake.engine.cluster.cluster_records import ClusterRecords
from jetwake.engine.cluster.cluster_snapshot_store import ClusterSnapshotStore
from jetwake.engine.cluster.cluster_topics import check_internal_topic_replication
from jetwake.engine.cluster.coordinator_role import CoordinatorRole
from jetwake.engine.cluster.failure_detection import FailureDetector
from jetwake.engine.cluster.member_calls import MemberCalls, NotCoordinatorError
from jetwake.engine.cluster.membership import FencedError, KafkaMembership, control_topic
from jetwake.engine.cluster.peer_link import PeerRefusedError
from jetwake.engine.cluster.peer_network import PeerNetwork, PeerUnreachableError
from jetwake.engine.cluster.snapshot_data_topic import SnapshotDataTopic, files_under
from jetwake.engine.jobs.execution_messages import ExecutionMessage
from jetwake.engine.jobs.execution_participant import ExecutionParticipant
from jetwake.snapshot.store.snapshot_store import CommitRecord

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.jobs.member_context import PlacedMember

__all__ = ["ClusterPlace", "NotCoordinatorError"]

log = logging.getLogger("jetwake.cluster")


class ClusterPlace:
    """Where a member of cluster ``cluster`` stands (see the module doc).

    ``kafka_bootstrap_servers``: the Kafka cluster through which members find each other and
    choose the coordinator, and where records and snapshot data are kept.
    ``token``: the cluster's shared secret; peers prove they hold it before anything is decoded.
    ``peer_host``/``peer_port``: where to listen for peers (port 0: a free port);
    ``advertise``: the host peers should connect to, if not the listening address.
    ``session_timeout_ms``: how long a silent member stays in the cluster.
    ``scale_up_delay_ms``: how long after the last member joined the coordinator restarts
    auto-scaling jobs to use the new members (Jet's scale-up delay).
    ``internal_topic_replication``: the replicas of each topic the cluster creates (control,
    records, snapshot data, maps, lists); None: as many as the Kafka cluster has brokers, up
    to three.
    ``serves_clients``: whether the member will serve clients (a client port); until it does
    the cluster lists it ``JOINING``.
    ``fast_failover``: whether a coordinator whose process is gone is removed from the group at
    once (failure_detection.py) instead of after the session timeout.
    """

    def __init__(self, data_dir: str | os.PathLike | None, *, cluster: str,
                 kafka_bootstrap_servers: str | None, token: str | None = None,
                 member_id: str | None = None, peer_host: str = "127.0.0.1",
                 peer_port: int = 0, advertise: str | None = None,
                 session_timeout_ms: int = 6000, scale_up_delay_ms: int = 10_000,
                 internal_topic_replication: int | None = None,
                 serves_clients: bool = False,
                 fast_failover: bool = True) -> None:
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
        replication = check_internal_topic_replication(internal_topic_replication)
        self.internal_topic_replication = replication
        self.cluster_name: str | None = cluster
        self.member_id = member_id or f"m-{secrets.token_hex(4)}"
        self.bootstrap_servers = kafka_bootstrap_servers
        self.cluster_token = token
        self.client_address: str | None = None  # set by the member's service, if any
        self.serves_clients = serves_clients
        self.scale_up_delay_s = scale_up_delay_ms / 1000
        self._peer = (peer_host, peer_port, advertise)
        self._session_timeout_ms = session_timeout_ms
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="jetwake-cluster")
        self.records = ClusterRecords(kafka_bootstrap_servers, cluster, replication)
        #: the cluster's maps and lists, kept in Kafka
        self.cluster_maps = ClusterMaps(kafka_bootstrap_servers, cluster, replication)
        self.data_topic = SnapshotDataTopic(kafka_bootstrap_servers, cluster, replication)
        self.network: PeerNetwork | None = None
        self.membership: KafkaMembership | None = None
        self.calls = MemberCalls(self)
        self.detector = FailureDetector(self, fast_failover)
        self.role = CoordinatorRole(self)
        self._member: "PlacedMember | None" = None
        self._joined = False

    @property
    def member(self) -> "PlacedMember":
        """The member this is the place of."""
        assert self._member is not None  # joined
        return self._member

    # --- where the member's records and snapshots are kept ----------------------------------

    def new_job_records(self, data_dir: str | None) -> ClusterJobRecords:
        return ClusterJobRecords(self.records)

    def new_snapshot_store(self, data_dir: str | None) -> ClusterSnapshotStore:
        assert data_dir is not None  # checked when the place was made
        return ClusterSnapshotStore(data_dir, self.data_topic, self.records)

    @property
    def recovers_jobs_at_start(self) -> bool:
        return False  # the coordinator resumes the cluster's jobs when it is elected

    # --- joining and leaving -------------------------------------------------------------------

    def join(self, member: "PlacedMember") -> ExecutionParticipant:
        """Joins the cluster: listens for peers, joins the group, proves itself to the other
        members (a member they refuse leaves at once with the reason) and starts watching the
        group. Returns the member's participant, whose distributed edges cross the peer
        network."""
        self._member = member
        self.records.ensure_topic()
        self.data_topic.ensure_topic()
        host, port, advertise = self._peer
        assert self.cluster_name is not None
        self.network = PeerNetwork(self.cluster_name, self.member_id, self.cluster_token,
                                   host=host, port=port, advertise=advertise).start()
        self.calls.addresses[self.member_id] = self.network.address
        participant = ExecutionParticipant(member, self.member_id, self.network.edges,
                                           self.calls.report_end, self._share_part)
        member.participant = participant  # the calls below may reach it
        self.network.set_call_handler(self.calls.on_call)
        self.network.set_lost_handler(self.detector.connection_lost)
        self.network.set_message_handler(
            "exec.ended", lambda peer, payload: self.calls.on_execution_ended(payload))
        self.membership = KafkaMembership(
            self.bootstrap_servers, self.cluster_name, self.member_id, self.network.address,
            session_timeout_ms=self._session_timeout_ms, on_change=self.role.changed)
        store = member.snapshot_store
        assert isinstance(store, ClusterSnapshotStore)  # new_snapshot_store's
        store.on_job_deleted = self.calls.forget_job_everywhere
        self.membership.ensure_control_topic(replication=self.internal_topic_replication)
        self.records.warn_if_single_replica([control_topic(self.cluster_name),
                                             self.records.topic, self.data_topic.topic])
        self.membership.start()
        self._verify_with_cluster()
        self._joined = True
        self.detector.start()
        log.info("member %s joined cluster '%s' (peers at %s)", self.member_id,
                 self.cluster_name, self.network.address)
        return participant

    def _verify_with_cluster(self) -> None:
        """Proves this member to the others over the peer network: a member with another
        token, cluster name or an incompatible version is refused there, and leaves at once
        with the reason instead of sitting in the group (where Kafka could even make it the
        coordinator)."""
        calls = self.calls
        others = [m.id for m in calls.refresh_members() if m.id != self.member_id]
        for other in others:
            try:
                calls.call_member(other, "cluster.info", [], 15.0)
            except PeerUnreachableError as e:
                if "refused" in str(e):
                    raise PeerRefusedError(
                        f"member {self.member_id} cannot join cluster '{self.cluster_name}': "
                        f"{e}") from None
                log.warning("member %s cannot reach member %s yet: %s", self.member_id,
                            other, e)

    def leave(self) -> None:
        """Leaves the cluster once the member's jobs stopped: hands this member's share of
        the jobs over to the others (after a start that failed there is none), stops its
        shares and every service of the cluster."""
        if self._joined:
            self._joined = False
            self.role.hand_over()
            self.member.participant.cancel_all()
        self.detector.stop()
        if self.membership is not None:
            self.membership.stop()
        if self.network is not None:
            self.network.stop()
        for part in (self.cluster_maps, self.records, self.data_topic):
            try:
                part.close()
            except Exception:  # noqa: BLE001 - leaving regardless
                log.debug("closing %s failed", part, exc_info=True)
        self.pool.shutdown(wait=False)

    def _share_part(self, directory: str, prefix: str) -> dict:
        """Copies a snapshot part's files into the cluster's snapshot data topic."""
        paths = files_under(directory, os.listdir(directory))
        return self.data_topic.upload(directory, paths, prefix) if paths else {}

    # --- the cluster's maps and lists ---------------------------------------------------------

    def shared_map(self, name: str) -> Any:
        """The cluster's map: the same from every member, kept in Kafka (cluster_maps.py)."""
        return self.cluster_maps.get_map(name)

    def shared_list(self, name: str) -> Any:
        return self.cluster_maps.get_list(name)

    def sync_shared_maps(self) -> None:
        self.cluster_maps.sync()

    # --- the coordinator -----------------------------------------------------------------------

    @property
    def is_coordinator(self) -> bool:
        return self.role.is_coordinator

    def require_coordinator(self, action: str) -> None:
        self.role.require(action)

    def await_coordination(self, timeout: float) -> None:
        self.role.await_take_over(timeout)

    def publish_commit_record(self, rec: CommitRecord) -> None:
        """Writes a snapshot's commit record where every member can read it: the commit point
        of a cluster-wide snapshot. Raises FencedError when this member was deposed."""
        try:
            self.records.put(f"commit/{rec.job_id}/{rec.snapshot_id}", rec.to_json().encode())
        except FencedError:
            log.error("member %s was deposed as coordinator: snapshot %d of job %s is not "
                      "committed", self.member_id, rec.snapshot_id, rec.job_name)
            raise

    # --- executions ----------------------------------------------------------------------------

    def execution_members(self) -> list[tuple[str, str]]:
        return self.detector.execution_members()

    def call_execution(self, member_id: str, message: ExecutionMessage,
                       timeout: float) -> ExecutionMessage | None:
        return self.calls.call_execution(member_id, message, timeout)

    def note_unreachable(self, member_id: str) -> None:
        self.detector.note_unreachable(member_id)

    # --- clients' requests ---------------------------------------------------------------------

    def forward_request(self, frame: bytes, client: str, timeout: float,
                        target: str | None = None) -> bytes:
        return self.calls.forward_request(frame, client, timeout, target)

    def ask_other_members(self, frame: bytes, client: str,
                          timeout: float = 10.0) -> list[dict]:
        return self.calls.ask_other_members(frame, client, timeout)

    # --- what the cluster looks like ----------------------------------------------------------

    def local_info(self) -> dict:
        """This member as `jetwake cluster` shows it."""
        member = self.member
        return {"id": self.member_id, "address": self.client_address,
                "peer_address": self.network.address if self.network else None,
                "jobs": len(member.participant.running()),
                "state": self.state(),
                "coordinator": self.is_coordinator, "pid": os.getpid(),
                "data_dir": member.data_dir}

    def state(self) -> str:
        """``JOINING`` until the member has joined and, if it serves clients, its client
        port answers (a client may connect to it); ``ACTIVE`` then; ``SHUTTING_DOWN``."""
        if self._member is not None and self._member.shutting_down:
            return "SHUTTING_DOWN"
        if not self._joined or (self.serves_clients and self.client_address is None):
            return "JOINING"
        return "ACTIVE"

    def cluster_info(self) -> dict:
        """The cluster: its name, coordinator, quorum and every member with its address (the
        client address), running executions and state; a member that does not answer is
        listed as UNREACHABLE."""
        members = self.calls.refresh_members()
        futures = {m.id: self.pool.submit(self.calls.call_member, m.id, "cluster.info", [],
                                          5.0)
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

    def describe(self, data_dir: str | None, jobs: int) -> str:
        return f"Member({self.member_id} of '{self.cluster_name}', {data_dir})"
