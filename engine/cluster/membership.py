"""Cluster membership and the choice of coordinator, through Kafka's group protocol.

Every member of cluster ``NAME`` joins the consumer group ``jetwake-NAME`` on the control topic
``__jetwake_NAME_control``, which has exactly one partition. Kafka's group coordinator keeps the
group: a member that stops heartbeating (killed, paused, cut off) is dropped after the session
timeout, and the partition goes to another member. **The member that holds partition 0 is the
cluster's coordinator.** No consensus protocol of jetwake's own is involved: liveness, the
single holder of the partition and the hand-over are Kafka's.

A member's ``client.id`` carries its id and address (``jetwake/<member id>/<host:port>``), so
:meth:`KafkaMembership.members` can list the live members from the group's description, with
the coordinator marked.

Holding partition 0 is not enough to act as coordinator: a coordinator that was paused past the
session timeout may still believe it holds it. What it writes therefore goes through
:class:`CoordinatorFence`, a transactional producer with one fixed ``transactional.id`` per
cluster: when a new coordinator initializes it, Kafka fences the previous one, whose next
commit fails (:class:`FencedError`) instead of writing anything.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from jetwake.connectors.kafka.client_log import with_client_log
from jetwake.engine.cluster.admin_clients import RenewableAdmin
from jetwake.engine.cluster.cluster_topics import create_topic, replication_for
from jetwake.engine.cluster.group_leave import (
    GroupLeaveError, describe_group, remove_group_member,
)
from jetwake.engine.core.errors import JetwakeError

__all__ = ["KafkaMembership", "MemberInfo", "CoordinatorFence", "FencedError",
           "MembershipUnreachableError",
           "control_topic", "group_id", "check_cluster_name"]

log = logging.getLogger("jetwake.cluster")

_CLIENT_PREFIX = "jetwake/"


class FencedError(JetwakeError):
    """This member is no longer the coordinator: a newer one took over, and nothing it wrote
    after that was committed."""


class MembershipUnreachableError(JetwakeError):
    """The cluster's membership could not be read: Kafka, which holds it, did not answer. The
    message names the cluster, the brokers and Kafka's own error."""


def control_topic(cluster: str) -> str:
    return f"__jetwake_{cluster}_control"


def group_id(cluster: str) -> str:
    return f"jetwake-{cluster}"


def check_cluster_name(cluster: Any) -> str:
    if not isinstance(cluster, str) or not cluster or not all(
            c.isalnum() or c in "-_." for c in cluster):
        raise ValueError(f"a cluster name must be a non-empty string of letters, digits, '-', "
                         f"'_' or '.', got {cluster!r}")
    return cluster


@dataclass(frozen=True)
class MemberInfo:
    """A live member as the group shows it."""

    id: str
    address: str
    is_coordinator: bool


class KafkaMembership:
    """This member's place in the cluster: joins the group at :meth:`start`, leaves it at
    :meth:`stop`. ``on_change(is_coordinator)`` is called from the membership thread whenever
    this member becomes or stops being the coordinator.

    ``session_timeout_ms`` is how long a silent member stays in the group: the time a dead
    coordinator takes to be replaced is about that much.
    """

    def __init__(self, bootstrap_servers: str, cluster: str, member_id: str, address: str, *,
                 session_timeout_ms: int = 6000,
                 on_change: Callable[[bool], None] | None = None) -> None:
        if not isinstance(bootstrap_servers, str) or not bootstrap_servers:
            raise ValueError("KafkaMembership needs bootstrap servers, e.g. 'host:9092'")
        if "/" in member_id or "/" in address:
            raise ValueError("a member id and address must not contain '/'")
        self.bootstrap_servers = bootstrap_servers
        self.cluster = check_cluster_name(cluster)
        self.member_id = member_id
        self.address = address
        self.session_timeout_ms = session_timeout_ms
        self._on_change = on_change
        self._is_coordinator = False
        self._consumer: Consumer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._joined = threading.Event()
        self._lock = threading.Lock()
        self._admin_clients = RenewableAdmin(bootstrap_servers)
        self.error: BaseException | None = None
        self.joined_ms = int(time.time() * 1000)
        self._unreachable_since: float | None = None
        self._was_lost = False
        self._rejoin_on_lost = False
        self._rejoin_reason = "Kafka expelled it"

    @property
    def is_coordinator(self) -> bool:
        return self._is_coordinator

    def _admin(self) -> AdminClient:
        # one client, replaced only when it stops getting answers (admin_clients.py)
        return self._admin_clients.get()

    def ensure_control_topic(self, timeout: float = 30.0,
                             replication: int | None = None) -> None:
        """Creates the one-partition control topic unless it exists, with ``replication``
        replicas (None: as many as there are brokers, up to three)."""
        admin = self._admin()
        topic = control_topic(self.cluster)
        md = admin.list_topics(timeout=timeout)
        if topic in md.topics and md.topics[topic].error is None:
            if len(md.topics[topic].partitions) != 1:
                raise JetwakeError(f"the control topic {topic} has "
                                   f"{len(md.topics[topic].partitions)} partitions; it must have "
                                   "exactly one (delete it, and jetwake creates it again)")
            return
        create_topic(admin, topic, 1, replication_for(len(md.brokers), replication),
                     timeout=timeout)

    def start(self, timeout: float = 30.0) -> None:
        """Joins the cluster's group; returns once the group has given this member its
        assignment (coordinator or not)."""
        self.ensure_control_topic(timeout)
        self._subscribe()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"jetwake-membership-{self.member_id}")
        self._thread.start()
        if not self._joined.wait(timeout):
            self.stop()
            raise JetwakeError(f"member {self.member_id} could not join cluster "
                               f"'{self.cluster}' through Kafka at {self.bootstrap_servers} "
                               f"within {timeout:.0f} s")

    def _subscribe(self) -> None:
        self.joined_ms = int(time.time() * 1000)  # the age that orders the members
        conf = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": group_id(self.cluster),
            # the group's members are ordered by member id, which Kafka makes from the client
            # id: the join time first makes the oldest member the holder of partition 0, so
            # the coordinator stays put when members join (as in Jet, the oldest member
            # coordinates) and moves only when it leaves
            "client.id": f"{_CLIENT_PREFIX}{self.joined_ms:013d}/{self.member_id}/"
                         f"{self.address}",
            "session.timeout.ms": self.session_timeout_ms,
            "heartbeat.interval.ms": max(100, self.session_timeout_ms // 6),
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            # the eager protocol moves partition 0 as a whole: never two holders at once
            "partition.assignment.strategy": "range",
            "error_cb": self._client_error,
        }
        self._consumer = Consumer(with_client_log(conf))
        self._consumer.subscribe([control_topic(self.cluster)], on_assign=self._assigned,
                                 on_revoke=self._revoked, on_lost=self._lost)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stopping.is_set():
            consumer = self._consumer
            if consumer is None:
                return
            try:
                consumer.consume(16, timeout=0.2)  # the poll that keeps the member in the group
            except Exception as e:  # noqa: BLE001 - reported through .error and the log
                self.error = e
                log.error("cluster membership of %s failed: %r", self.member_id, e)
                time.sleep(0.5)
            now = time.monotonic()
            expelled = self._rejoin_on_lost
            if (now - last > self.session_timeout_ms / 1000 or expelled) \
                    and not self._stopping.is_set():
                self._rejoin_on_lost = False
                self._rejoin(self._rejoin_reason if expelled else
                             f"it was silent for {now - last:.1f} s, longer than the session "
                             "timeout")
                now = time.monotonic()
            last = now

    def _rejoin(self, why: str) -> None:
        """The group has expelled this member (its process was paused or starved, or Kafka
        did not hear from it) and may have a new coordinator. It joins again as the youngest
        member, so it never takes the coordinator's place back by age."""
        log.warning("member %s left cluster '%s' (%s) and joins again as a new member",
                    self.member_id, self.cluster, why)
        self._set_coordinator(False)
        old, self._consumer = self._consumer, None
        try:
            if old is not None:
                old.close()
        except Exception:  # noqa: BLE001 - a fresh consumer replaces it regardless
            log.debug("closing the expelled membership consumer failed", exc_info=True)
        self._subscribe()

    def _assigned(self, consumer: Any, partitions: list) -> None:
        if self._rejoin_on_lost:
            # the consumer the group expelled got in again by itself, under its old client id,
            # i.e. as the oldest: it takes no role; the membership loop replaces it by a
            # consumer that joins as the youngest
            return
        since, self._unreachable_since = self._unreachable_since, None
        if since is not None or self._was_lost:
            log.info("member %s reaches Kafka again and is back in cluster '%s'%s",
                     self.member_id, self.cluster,
                     f" after {time.monotonic() - since:.0f} s" if since is not None else "")
        self._was_lost = False
        self._set_coordinator(any(p.partition == 0 for p in partitions))
        self._joined.set()

    def _revoked(self, consumer: Any, partitions: list) -> None:
        """A rebalance takes every partition back before it hands them out again (the eager
        protocol): whether this member still coordinates is decided by the assignment that
        follows, so nothing changes here (a member that really lost partition 0 hears it
        then, and its writes were fenced by its successor anyway)."""

    def _client_error(self, error: Any) -> None:
        """librdkafka's errors about the connection to Kafka: said once per episode, in
        jetwake's words (librdkafka itself keeps retrying)."""
        if error.code() not in _UNREACHABLE or self._unreachable_since is not None:
            return
        self._unreachable_since = time.monotonic()
        log.warning("member %s cannot reach Kafka at %s (%s); it keeps trying. Until Kafka "
                    "answers, the cluster cannot change its members or commit snapshots",
                    self.member_id, self.bootstrap_servers, error.str())

    def _lost(self, consumer: Any, partitions: list) -> None:
        """The group expelled this member (its session expired, or another member had it
        removed as dead): it coordinates no more.
        (A pause is also caught by :meth:`_run`, which makes the member join again as the
        youngest.)"""
        self._was_lost = True
        # joining again with the same client id would make it the oldest again: it joins
        # as a new member (from the membership loop, not inside the client's callback)
        self._rejoin_reason = "Kafka expelled it"
        self._rejoin_on_lost = True
        log.warning("member %s lost its place in cluster '%s': Kafka expelled it (it did "
                    "not hear from it within the session timeout, %d ms, or another member "
                    "found its peer address refusing connections); it joins again when Kafka "
                    "answers", self.member_id, self.cluster, self.session_timeout_ms)
        self._set_coordinator(False)

    def deposed(self, why: str) -> None:
        """A newer coordinator fenced this member's writes: it is not the coordinator,
        whatever the group's last assignment said, and joins the group again as its youngest
        member (from the membership loop), giving partition 0 up to the older members."""
        self._rejoin_reason = f"a newer coordinator fenced it: {why}"
        self._rejoin_on_lost = True
        self._set_coordinator(False)

    def _set_coordinator(self, value: bool) -> None:
        with self._lock:
            changed = value != self._is_coordinator
            self._is_coordinator = value
        if changed:
            log.info("member %s %s the coordinator of cluster '%s'", self.member_id,
                     "is now" if value else "is no longer", self.cluster)
            if self._on_change is not None:
                self._on_change(value)

    def members(self, timeout: float = 10.0) -> list[MemberInfo]:
        """The live members as the group shows them, coordinator first."""
        out = [info for info, _ in self._group(timeout)]
        return sorted(out, key=lambda i: (not i.is_coordinator, i.id))

    def _group(self, timeout: float) -> list[tuple[MemberInfo, str]]:
        """The group's jetwake members, each with the member id Kafka gave its consumer.
        Asked on a plain socket (group_leave.py says why not through librdkafka's admin
        client: a broker lost during the call can abort the process)."""
        out = []
        try:
            described = describe_group(self.bootstrap_servers, group_id(self.cluster),
                                       timeout=timeout)
        except GroupLeaveError as e:
            raise MembershipUnreachableError(
                f"cluster '{self.cluster}' cannot read its membership: Kafka at "
                f"{self.bootstrap_servers} did not answer ({e}). The cluster's membership and "
                "its jobs' records live in Kafka: its jobs wait until Kafka answers again; "
                "check the brokers") from e
        for m in described:
            if not m.client_id.startswith(_CLIENT_PREFIX):
                continue
            _joined, _, rest = m.client_id[len(_CLIENT_PREFIX):].partition("/")
            member_id, _, address = rest.partition("/")
            out.append((MemberInfo(member_id, address, any(p == 0 for _, p in m.partitions)),
                        m.member_id))
        return out

    def coordinator_consumer(self, timeout: float = 5.0) -> tuple[MemberInfo, str] | None:
        """The coordinator as the group shows it now, with the member id Kafka gave its
        consumer (that consumer's alone: a later one of the same jetwake member has
        another); None while Kafka is moving partition 0."""
        found = [entry for entry in self._group(timeout) if entry[0].is_coordinator]
        return found[0] if found else None

    def remove_dead_consumer(self, kafka_member_id: str, timeout: float = 5.0) -> bool:
        """Makes Kafka drop the consumer ``kafka_member_id`` of a member whose process is
        gone, now instead of after the session timeout (group_leave.py). Only for a process
        known to be gone: a live member removed this way is expelled. True when Kafka
        removed it, False when it was no longer in the group."""
        return remove_group_member(self.bootstrap_servers, group_id(self.cluster),
                                   kafka_member_id, timeout=timeout)

    def stop(self) -> None:
        """Leaves the group at once (the others see it go without waiting for the session
        timeout)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001 - leaving regardless
                log.debug("closing the membership consumer failed", exc_info=True)
            self._consumer = None
        self._set_coordinator(False)


# librdkafka errors that mean Kafka cannot be reached (it retries them itself)
_UNREACHABLE = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
                KafkaError._RESOLVE, KafkaError._MSG_TIMED_OUT}


def _fenced(err: Any) -> bool:
    """Whether a transactional producer's error means a newer holder of its id fenced it."""
    return err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                         KafkaError.INVALID_PRODUCER_EPOCH)


class CoordinatorFence:
    """Writes of the coordinator, fenced: one transactional producer with the cluster's fixed
    ``transactional.id``. Initializing it fences every earlier holder; a fenced coordinator's
    :meth:`write` raises :class:`FencedError`, commits nothing, and first calls ``on_fenced``
    (the member then stops acting as the coordinator, whatever its view of the group says)."""

    def __init__(self, bootstrap_servers: str, cluster: str, timeout: float = 30.0,
                 on_fenced: Callable[[str], None] | None = None) -> None:
        self.cluster = check_cluster_name(cluster)
        self.on_fenced = on_fenced
        self._producer = Producer(with_client_log({
            "bootstrap.servers": bootstrap_servers,
            "transactional.id": f"jetwake-{self.cluster}-coordinator",
            "enable.idempotence": True,
        }))
        self._producer.init_transactions(timeout)
        self._lock = threading.Lock()

    def write(self, records: list[tuple[str, bytes | None, bytes | None]],
              timeout: float = 30.0) -> None:
        """Writes ``(topic, key, value)`` records in one transaction; raises FencedError when
        a newer coordinator has taken over."""
        with self._lock:
            p = self._producer
            deadline = time.monotonic() + timeout
            try:
                self._begin(p, timeout)
                for topic, key, value in records:
                    p.produce(topic, key=key, value=value)
                # a commit that timed out or met a retriable error is still in progress:
                # librdkafka wants the same call again (anything else gets "_CONFLICT")
                while True:
                    try:
                        p.commit_transaction(max(0.1, deadline - time.monotonic()))
                        return
                    except KafkaException as e:
                        err = e.args[0]
                        if not err.retriable() or err.fatal() or time.monotonic() >= deadline:
                            raise
            except KafkaException as e:
                err = e.args[0]
                if _fenced(err):
                    raise self._fenced_error(err) from e
                try:
                    p.abort_transaction(timeout)
                except KafkaException as abort_failed:
                    if _fenced(abort_failed.args[0]):
                        raise self._fenced_error(abort_failed.args[0]) from e
                raise

    def _begin(self, p: Any, timeout: float) -> None:
        """Begins a transaction; one left unfinished by an earlier write (its commit or abort
        timed out) is aborted first."""
        try:
            p.begin_transaction()
        except KafkaException as e:
            if e.args[0].fatal() or e.args[0].code() not in (KafkaError._CONFLICT,
                                                             KafkaError._STATE):
                raise
            p.abort_transaction(timeout)
            p.begin_transaction()

    def _fenced_error(self, err: Any) -> "FencedError":
        message = (f"this member is no longer the coordinator of cluster '{self.cluster}': "
                   f"{err.str()}")
        if self.on_fenced is not None:
            self.on_fenced(message)
        return FencedError(message)

    def close(self) -> None:
        try:
            self._producer.flush(5)
        except Exception:  # noqa: BLE001 - closing regardless
            pass
