"""The member users create: ``Member(...)``, embedded, serving clients, or part of a cluster.

``Member()`` runs embedded in the calling process, everything in memory. ``Member(data_dir)``
keeps maps, job records and snapshots under ``data_dir``, which it locks for its whole life:
one data directory, one member (see engine/jobs/data_dir_lock.py). ``port=`` also serves
clients (a :class:`Client`, the CLI) on that port (0: a free one; :attr:`address` says which).
``cluster=`` makes it a member of a cluster, whose members find each other through Kafka::

    Member(data_dir="d1", cluster="prod", kafka_bootstrap_servers="kafka:9092", port=0,
           token="s3cret")

A member is composed of its services, not stacked classes: the execution service that runs
processors, its maps and lists, its jobs (:class:`~jetwake.engine.jobs.job_service.JobService`),
the participant that runs its share of every execution, its *place* (alone:
:class:`~jetwake.engine.jobs.member_place.Alone`; in a cluster:
:class:`~jetwake.engine.cluster.cluster_place.ClusterPlace`) and, with ``port``, the service
that serves its clients. A member alone is a cluster of one: its jobs run exactly as a
cluster's do, their coordinator calling its participant in-process.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any, Callable

from jetwake.engine.cluster.cluster_place import ClusterPlace, NotCoordinatorError
from jetwake.engine.core.errors import SnapshotNotFoundError
from jetwake.engine.data.named_list import NamedList
from jetwake.engine.data.named_maps import MapStore
from jetwake.engine.execution.execution_service import ExecutionService
from jetwake.engine.jobs.data_dir_lock import DataDirectoryLock
from jetwake.engine.jobs.execution_messages import ExecutionMessage
from jetwake.engine.jobs.execution_participant import ExecutionParticipant
from jetwake.engine.jobs.job import Job
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_coordinator import JobCoordinator
from jetwake.engine.jobs.job_records import JobRecords
from jetwake.engine.jobs.job_service import JobService, new_job_id
from jetwake.engine.jobs.member_place import LIGHT_PREFIX, Alone, MemberPlace, light_job_owner
from jetwake.engine.jobs.upgrade_plan import UpgradePlan
from jetwake.engine.server.authentication import check_listen_address
from jetwake.engine.server.listen_socket import bind_socket
from jetwake.engine.server.member_service import MemberService
from jetwake.engine.server.snapshot_inspection import SAMPLE_KEYS, find_snapshot, inspect_snapshot
from jetwake.snapshot.store.snapshot_store import CommitRecord, SnapshotStore

__all__ = ["Member", "NotCoordinatorError"]

log = logging.getLogger("jetwake.member")

# how long a graceful shutdown waits for all jobs to stop (terminal snapshots included)
SHUTDOWN_TIMEOUT_S = 60.0
# how long a request about jobs waits for the cluster to have a coordinator
COORDINATOR_WAIT_S = 15.0


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what} name must be a non-empty string, got {name!r}")
    return name


class Member:
    """A member: ``with Member() as m: m.new_job(pipeline).join()`` (see the module doc).

    ``local_parallelism``: processors per vertex when a stage or job sets none (default 1).
    ``cooperative_threads``: worker threads for cooperative tasklets (default 2).
    ``journal_capacity``: events kept in each map's event journal.
    ``port``/``host``: serve clients there (loopback by default; any other address needs a
    ``token``); ``advertise``: the ``host:port`` clients should use, if not the listening one.

    In a cluster (``cluster=NAME``): ``kafka_bootstrap_servers``, the Kafka cluster through
    which members find each other and choose the coordinator, and where records and snapshot
    data are kept; ``token``, the cluster's shared secret (peers prove they hold it before
    anything is decoded); ``peer_port`` (0: a free port); ``session_timeout_ms``, how long a
    silent member stays in the cluster; ``scale_up_delay_ms``, how long after the last member
    joined the coordinator restarts auto-scaling jobs to use the new members; ``member_id``;
    ``internal_topic_replication``, the replicas of each topic the cluster keeps in Kafka
    (default: as many as there are brokers, up to three; a member warns when they have one);
    ``serves_clients``: True when the caller starts the member's client service itself (as
    ``jetwake member start`` does; with ``port`` the member starts it): until it serves, the
    cluster lists the member ``JOINING``.
    joined the coordinator restarts auto-scaling jobs to use the new members;
    ``fast_failover``, whether a coordinator whose process is gone is removed from the group
    at once rather than after the session timeout (failure_detection.py); ``member_id``.

    With a data directory the member locks it (another member on it fails at once with
    :class:`DataDirectoryLockedError`), removes RocksDB working state left by executions of a
    process that crashed, and resumes each job that was running, each on its own: a job that
    cannot start for a restartable cause keeps being retried with back-off, one with a
    permanent cause is marked FAILED, and neither keeps the others from running (in a cluster
    the coordinator resumes the cluster's jobs when it is elected).
    """

    def __init__(self, data_dir: str | os.PathLike | None = None, *,
                 cluster: str | None = None, kafka_bootstrap_servers: str | None = None,
                 port: int | None = None, host: str = "127.0.0.1", token: str | None = None,
                 advertise: str | None = None, peer_port: int = 0, member_id: str | None = None,
                 session_timeout_ms: int = 6000, scale_up_delay_ms: int = 10_000,
                 fast_failover: bool = True,
                 cooperative_threads: int | None = None, local_parallelism: int | None = None,
                 journal_capacity: int = 1_000_000,
                 internal_topic_replication: int | None = None,
                 serves_clients: bool = False) -> None:
        if port is not None and (type(port) is not int or not 0 <= port <= 65535):
            raise ValueError(f"port must be an int in [0, 65535] (0: a free port), got {port!r}")
        cpus = os.cpu_count() or 1
        threads = cooperative_threads if cooperative_threads is not None else min(2, cpus)
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"cooperative_threads must be a positive int, got {threads!r}")
        # one processor per vertex by default: under the GIL a member does about one core of
        # Python work, and more processors on one member cost switching, not speed (measured
        # in docs/performance.md); more cores are used by more members
        lp = local_parallelism if local_parallelism is not None else 1
        if not isinstance(lp, int) or lp < 1:
            raise ValueError(f"local_parallelism must be a positive int, got {lp!r}")
        if port is not None:
            check_listen_address(host, token)
        place: MemberPlace
        if cluster is None:
            if kafka_bootstrap_servers is not None or internal_topic_replication is not None:
                raise ValueError("kafka_bootstrap_servers and internal_topic_replication are "
                                 "for a member of a cluster: give cluster='NAME' too")
            place = Alone()
        else:
            place = ClusterPlace(data_dir, cluster=cluster,
                                 kafka_bootstrap_servers=kafka_bootstrap_servers, token=token,
                                 member_id=member_id, peer_host=host, peer_port=peer_port,
                                 advertise=_peer_advertise(advertise),
                                 session_timeout_ms=session_timeout_ms,
                                 scale_up_delay_ms=scale_up_delay_ms,
                                 internal_topic_replication=internal_topic_replication,
                                 serves_clients=serves_clients or port is not None,
                                 fast_failover=fast_failover)
        #: where the member stands: alone, or in a cluster
        self.place = place
        self.member_id = place.member_id
        self.data_dir = os.fspath(data_dir) if data_dir is not None else None
        self.default_local_parallelism = lp
        self._dir_lock: DataDirectoryLock | None = None
        self._lists: dict[str, NamedList] = {}
        self._shut_down = False
        #: the member's jobs
        self.job_service = JobService(self)
        self.execution_service: ExecutionService | None = None
        self._maps: MapStore | None = None
        #: the client service (with ``port``)
        self.service: MemberService | None = None
        #: handles a client request forwarded by another member: (frame, client) -> reply
        self.forwarded_request_handler: Callable[[bytes, str], bytes] | None = None
        self.participant: ExecutionParticipant
        bound = None
        try:
            # the client port first, as ``jetwake member start`` does (see listen_socket):
            # taken, it fails the start before the peer port is chosen and the cluster joined
            if port is not None:
                bound = bind_socket(host, port)
            if self.data_dir is not None:
                os.makedirs(self.data_dir, exist_ok=True)
                # first of all: nothing in the directory is touched before it is ours
                self._dir_lock = DataDirectoryLock(self.data_dir)
                self._dir_lock.acquire()
            self.execution_service = ExecutionService(threads)
            self._maps = MapStore(self.data_dir, journal_capacity=journal_capacity)
            self.snapshot_store: SnapshotStore = place.new_snapshot_store(self.data_dir)
            self.job_records: JobRecords = place.new_job_records(self.data_dir)
            if self.data_dir is not None:
                self._remove_stale_state()
            self.participant = place.join(self)
            if self.data_dir is not None and place.recovers_jobs_at_start:
                self.recover_jobs()
        except BaseException:
            if bound is not None:
                bound.close()
            self._abandon_start()
            raise
        if port is None:
            return
        try:
            self.service = MemberService(self, host, port, token, bound=bound)
            # listening already: serving (no longer JOINING) before a client can ask
            self.place.client_address = advertise or self.service.address_text
            self.service.start()
        except BaseException:
            self.shutdown(graceful=False)
            raise

    def _abandon_start(self) -> None:
        """Undoes a start that failed: nothing may keep the directory locked."""
        self._shut_down = True
        self.place.leave()
        self.job_service.stop_retrying()
        if self.execution_service is not None:
            self.execution_service.shutdown()
        if self._maps is not None:
            self._maps.close()
        if self._dir_lock is not None:
            self._dir_lock.release()

    def _remove_stale_state(self) -> None:
        """Removes the RocksDB working state of every execution found: at member start none
        runs, and the directory lock guarantees no other member uses it, so it is what
        executions of a crashed process left behind (a restore rebuilds state from the
        snapshot, never from these)."""
        root = os.path.join(self.data_dir, "state")  # type: ignore[arg-type]
        try:
            jobs = os.listdir(root)
        except FileNotFoundError:
            return
        removed = 0
        for job_id in jobs:
            job_dir = os.path.join(root, job_id)
            try:
                executions = os.listdir(job_dir)
            except (NotADirectoryError, FileNotFoundError):
                continue
            removed += len(executions)
            shutil.rmtree(job_dir, ignore_errors=True)
        if removed:
            log.info("removed the RocksDB state of %d execution(s) that did not end cleanly "
                     "(in %s)", removed, root)

    def recover_jobs(self) -> None:
        """Resumes the jobs whose records say they were running and takes over the others
        (a member at start; a cluster's coordinator when it is elected)."""
        known = self.job_service.known_ids()
        records = [r for r in self.job_records.load_all() if r.job_id not in known]
        self.job_service.recover(records, self.job_records)

    # --- where the member stands -------------------------------------------------------------

    @property
    def in_cluster(self) -> bool:
        """Whether the member is part of a cluster."""
        return self.place.cluster_name is not None

    @property
    def cluster_name(self) -> str | None:
        return self.place.cluster_name

    @property
    def is_coordinator(self) -> bool:
        """Whether this member coordinates the jobs (always, for a member alone)."""
        return self.place.is_coordinator

    @property
    def address(self) -> str | None:
        """Where clients reach this member (``host:port``); None when it serves none."""
        return self.place.client_address

    @property
    def client_address(self) -> str | None:
        return self.place.client_address

    @client_address.setter
    def client_address(self, address: str | None) -> None:
        """Set by the service that serves the member's clients."""
        self.place.client_address = address

    @property
    def shutting_down(self) -> bool:
        """Whether the member is shutting down (or has)."""
        return self._shut_down

    @property
    def recovery_errors(self) -> dict[str, str]:
        """Job id -> why its record could not be turned into a job at this start."""
        return self.job_service.recovery_errors

    def await_coordination(self, timeout: float = COORDINATOR_WAIT_S) -> None:
        """On a member that has just become the coordinator: waits until it has taken over,
        so that what it answers about the jobs is complete."""
        self.place.await_coordination(timeout)

    def cluster_info(self) -> dict:
        """The cluster: its name, coordinator, quorum and every member (in a cluster)."""
        return self.place.cluster_info()

    def forward_request(self, frame: bytes, client: str, timeout: float,
                        target: str | None = None) -> bytes:
        """Hands a client's request to member ``target`` (the coordinator when None)."""
        return self.place.forward_request(frame, client, timeout, target)

    def ask_other_members(self, frame: bytes, client: str, timeout: float = 10.0) -> list[dict]:
        """Sends a client request to every other member; their decoded replies."""
        return self.place.ask_other_members(frame, client, timeout)

    def light_job_owner(self, job_ref: str) -> str | None:
        """The member coordinating the light job ``job_ref``; None for another job."""
        return light_job_owner(job_ref)

    # --- executions (the member as its jobs see it: MemberContext) ---------------------------

    def execution_members(self) -> list[tuple[str, str]]:
        return self.place.execution_members()

    def call_execution(self, member_id: str, message: ExecutionMessage,
                       timeout: float) -> ExecutionMessage | None:
        return self.place.call_execution(member_id, message, timeout)

    def publish_commit_record(self, rec: CommitRecord) -> None:
        self.place.publish_commit_record(rec)

    def note_unreachable(self, member_id: str) -> None:
        self.place.note_unreachable(member_id)

    def emit_event(self, job: JobCoordinator, event: str) -> None:
        self.job_service.emit_event(job, event)

    def retry_record_later(self, coordinator: JobCoordinator) -> None:
        self.job_service.retry_record_later(coordinator)

    # --- events ------------------------------------------------------------------------------

    def add_listener(self, fn: Callable[[str, str, str], None]) -> None:
        """``fn(job_id, job_name, event)`` is called for every job lifecycle event."""
        self.job_service.add_listener(fn)

    # --- jobs --------------------------------------------------------------------------------

    def new_job(self, pipeline: Any, config: JobConfig | None = None) -> Any:
        """Submits a Pipeline (or a core-API DAG) and starts it; returns its Job. With
        ``JobConfig(initial_snapshot_name=..., dry_run=True)`` it starts nothing and returns
        the :class:`UpgradePlan` (see :meth:`plan_upgrade`)."""
        if isinstance(config, JobConfig) and config.dry_run:
            return self.plan_upgrade(pipeline, config)
        coordinator = self.add_job(pipeline, config)
        coordinator.start(restore="initial", persist_definition=False)
        return Job(coordinator)

    def add_job(self, pipeline: Any, config: JobConfig | None = None) -> JobCoordinator:
        """Checks and registers a job and saves its definition, without starting it (its
        ``start(restore="initial", persist_definition=False)`` does). :meth:`new_job` starts it
        at once; the member service starts it on a thread of its own, so that a client hears
        about the job while it starts. A submission refused here leaves nothing behind. In a
        cluster only the coordinator takes jobs."""
        self._check_running()
        self.place.require_coordinator("submit a job")
        return self.job_service.add(pipeline, config)

    def plan_upgrade(self, pipeline: Any, config: JobConfig) -> UpgradePlan:
        """What a job of ``pipeline`` started from ``config.initial_snapshot_name`` would do
        with the snapshot's saved state, stage by stage: which state it takes over, which it
        drops and which stages start empty; nothing is submitted."""
        self._check_running()
        if not isinstance(config, JobConfig):
            raise TypeError(f"plan_upgrade() expects a JobConfig, got "
                            f"{type(config).__qualname__}")
        return self.job_service.plan_upgrade(pipeline, config)

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
        return self.job_service.add_light(f"{LIGHT_PREFIX}{self.member_id}-{new_job_id()}",
                                          pipeline, config)

    def get_job(self, name_or_id: str) -> Job | None:
        """The job with this id, or the newest job with this name; None if there is none."""
        return self.job_service.get(name_or_id)

    def job(self, name_or_id: str) -> Job:
        """Like :meth:`get_job` but raises :class:`JobNotFoundError` for an unknown job."""
        return self.job_service.job(name_or_id)

    # the coordinators behind the Job handles, for the member's own services (network
    # service, metrics); user code works with Job
    def coordinators(self) -> list[JobCoordinator]:
        """Every job's coordinator, oldest first."""
        return self.job_service.coordinators()

    def find_coordinator(self, name_or_id: str) -> JobCoordinator | None:
        """The coordinator of the job with this id, or of the newest job with this name."""
        return self.job_service.find(name_or_id)

    def jobs(self) -> list[Job]:
        """Every job this member knows, oldest first."""
        return [Job(c) for c in self.job_service.coordinators()]

    # --- exported snapshots ------------------------------------------------------------------

    def snapshots(self) -> list:
        """The named (exported) snapshots, as commit records (name, job, time, size)."""
        return self.snapshot_store.exports()

    def inspect_snapshot(self, ref: str, sample: int = SAMPLE_KEYS) -> dict:
        """What a committed snapshot holds: ``ref`` names an exported snapshot, or a job
        (its last committed snapshot). Its id, time, job and checksums; per stage its kind,
        entries, bytes, keys and a sample of them (decoded); each source's positions per
        partition and the stages' watermarks (engine/server/snapshot_inspection.py)."""
        self._check_running()
        if not isinstance(ref, str) or not ref:
            raise ValueError(f"inspect_snapshot() takes a snapshot's or a job's name, got "
                             f"{ref!r}")
        if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
            raise ValueError(f"inspect_snapshot(): sample must be an int >= 0, got {sample!r}")
        rec, definition = find_snapshot(self, ref)
        return inspect_snapshot(self.snapshot_store, rec, definition, sample)

    def delete_snapshot(self, name: str) -> None:
        """Deletes a named snapshot; raises SnapshotNotFoundError if there is none."""
        if not self.snapshot_store.delete_export(name):
            raise SnapshotNotFoundError(f"no exported snapshot named '{name}'")

    # --- data --------------------------------------------------------------------------------

    def sync_maps(self) -> None:
        """Makes every map change made so far durable; a snapshot calls it before its commit
        record, which may point into a map's journal (a map journal source's position) or
        count on its contents (a map sink under exactly-once). Raises OSError when a map's
        log cannot be synced (the snapshot then fails)."""
        maps = self._maps
        if maps is not None:
            maps.sync()
        self.place.sync_shared_maps()

    def get_map(self, name: str) -> Any:
        """The named map (created empty on first use): a Mapping with put/remove/...; in a
        cluster the cluster's map, the same from every member and kept in Kafka."""
        _check_name(name, "a map")
        shared = self.place.shared_map(name)
        if shared is not None:
            return shared
        assert self._maps is not None  # a started member
        return self._maps.get_map(name)

    def get_list(self, name: str) -> Any:
        """The named list (created empty on first use), a Sequence; in a cluster the
        cluster's list."""
        _check_name(name, "a list")
        shared = self.place.shared_list(name)
        if shared is not None:
            return shared
        lst = self._lists.get(name)
        if lst is None:
            lst = self._lists.setdefault(name, NamedList(name))
        return lst

    # --- lifecycle ---------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self._shut_down:
            raise RuntimeError("this member is shut down; create a new Member")

    def shutdown(self, graceful: bool | None = None) -> None:
        """Stops the member.

        With a data directory (and by default), every job with a processing guarantee that is
        running, starting or retrying a restart stops so that the next start resumes it: a
        running one takes a terminal snapshot first (if that fails, it resumes from its last
        good snapshot). Its record says it was running whatever happens, unless it completes
        or fails meanwhile. Other running jobs are cancelled; suspended jobs stay suspended.
        Without a data directory running jobs are cancelled. A member of a cluster then hands
        its share of the jobs over and leaves the cluster.

        The data directory's lock is released when every job has stopped; if one did not stop
        within SHUTDOWN_TIMEOUT_S, the lock stays held until this process ends, since that job
        could still write into the directory.
        """
        service = self.service
        if service is not None and service.serving:
            service.stop()  # no new requests while the jobs stop
        if self._shut_down:
            return
        self._shut_down = True
        if graceful is None:
            graceful = self.data_dir is not None
        stuck = self.job_service.stop_all(graceful, SHUTDOWN_TIMEOUT_S)
        self.job_service.stop_background_writes()
        self.place.leave()
        assert self.execution_service is not None  # a started member
        self.execution_service.shutdown()
        if self._maps is not None:
            self._maps.close()
        self.job_service.write_stale_records()
        if stuck:
            log.error("job(s) %s did not stop within %.0f s; their records say they resume on "
                      "the next start. The data directory stays locked until this process "
                      "ends, since they could still write into it", stuck, SHUTDOWN_TIMEOUT_S)
        elif self._dir_lock is not None:
            self._dir_lock.release()

    def __enter__(self) -> "Member":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return self.place.describe(self.data_dir, len(self.job_service))


def _peer_advertise(advertise: str | None) -> str | None:
    """Peers reach a member advertised as ``HOST:PORT`` on HOST (at its own peer port)."""
    if advertise is None:
        return None
    if not isinstance(advertise, str) or ":" not in advertise:
        raise ValueError(f"advertise must be 'HOST:PORT', got {advertise!r}")
    return advertise.rpartition(":")[0]
