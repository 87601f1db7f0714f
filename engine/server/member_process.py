"""Running a member as a process (``jetwake member start``): logging, signals, the service and
the metrics endpoint, and a graceful shutdown.

The first SIGTERM or SIGINT shuts down gracefully: the service stops accepting clients, jobs
with a processing guarantee take a terminal snapshot and resume on the next start on the same
data directory. A second signal exits at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.server.authentication import (
    HELLO_TIMEOUT_S, MAX_UNAUTHENTICATED, InsecureAddressError, check_listen_address,
)
from jetwake.engine.server.listen_socket import bind_socket
from jetwake.engine.server.member_service import MemberService
from jetwake.engine.server.protocol import DEFAULT_PORT, version

__all__ = ["serve", "configure_logging", "ready_line"]

log = logging.getLogger("jetwake.service")


class _LifecycleFilter(logging.Filter):
    """Drops the records the service's own lifecycle lines replace (no line twice)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "jetwake.member" and record.msg == "job %s (%s): %s":
            return False
        msg = str(record.msg)
        if record.name == "jetwake.job" and msg.startswith("job %s failed in"):
            return False
        if record.name in ("jetwake.job", "jetwake.member") and msg.startswith("job %s (%s)"):
            record.msg = "job '%s' (%s)" + msg[len("job %s (%s)"):]  # the service's style
        return True


def configure_logging(level: str = "INFO") -> None:
    """One line per record on stderr, jetwake's loggers at ``level``, others at WARNING."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s",
                                           "%Y-%m-%d %H:%M:%S"))
    handler.addFilter(_LifecycleFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("jetwake").setLevel(getattr(logging, level.upper(), logging.INFO))


def _install_signal_handlers(stop: threading.Event) -> None:
    """The first SIGTERM/SIGINT sets ``stop``; a second one exits the process at once."""
    received = {"count": 0}

    def on_signal(signum: int, frame: Any) -> None:
        received["count"] += 1
        name = signal.Signals(signum).name
        if received["count"] == 1:
            log.info("%s received: shutting down gracefully (send it again to exit at once)",
                     name)
            stop.set()
        else:
            log.warning("%s received again: exiting now without waiting for the jobs", name)
            logging.shutdown()
            os._exit(130)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def serve(*, data_dir: str | None = None, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          token: str | None = None, metrics_port: int | None = None,
          cluster: str | None = None, kafka_bootstrap_servers: str | None = None,
          advertise: str | None = None, peer_port: int = 0,
          scale_up_delay_ms: int | None = None, session_timeout_ms: int | None = None,
          internal_topic_replication: int | None = None,
          fast_failover: bool | None = None,
          cooperative_threads: int | None = None, local_parallelism: int | None = None,
          log_level: str = "INFO", install_signals: bool = True, ui_auth: str = "open",
          stop_event: threading.Event | None = None, hello_timeout: float = HELLO_TIMEOUT_S,
          max_unauthenticated: int = MAX_UNAUTHENTICATED) -> int:
    """Runs a member in the foreground until SIGTERM/SIGINT (or ``stop_event``); returns the
    process exit code. The first signal shuts down gracefully (jobs with a guarantee take a
    terminal snapshot and resume on the next start on the same data directory); a second one
    exits at once. A non-loopback ``host`` without a ``token`` is refused (exit code 2) before
    anything else is opened. ``ui_auth``: whether the dashboard on the metrics port needs the
    token to be read ("required") or only for actions ("open")."""
    from jetwake.engine.server.metrics import MetricsServer
    from jetwake.engine.server.member import Member

    configure_logging(log_level)
    try:
        check_listen_address(host, token)
    except InsecureAddressError as e:
        log.error("%s", e)
        return 2
    stop = stop_event or threading.Event()
    if install_signals:
        _install_signal_handlers(stop)

    where = data_dir or "memory only: jobs and state are lost at exit"
    log.info("jetwake %s member starting (pid %d, data: %s)", version(), os.getpid(), where)
    # the fixed ports first, before the member's peer listener takes a port of the kernel's
    # choosing (see listen_socket), and before a cluster sees this member join
    try:
        client_socket = bind_socket(host, port)
    except OSError as e:
        log.error("cannot listen on %s:%s: %s", host, port, e.strerror or e)
        return 1
    try:
        metrics_socket = bind_socket(host, metrics_port) if metrics_port is not None else None
    except OSError as e:
        client_socket.close()
        log.error("cannot serve metrics on %s:%s: %s", host, metrics_port, e.strerror or e)
        return 1

    def release_ports() -> None:  # a start that fails lets go of the ports it bound
        for sock in (client_socket, metrics_socket):
            if sock is not None:
                sock.close()

    try:
        member = Member(data_dir, cooperative_threads=cooperative_threads,
                        local_parallelism=local_parallelism, cluster=cluster,
                        kafka_bootstrap_servers=kafka_bootstrap_servers, token=token,
                        host=host, advertise=advertise, peer_port=peer_port,
                        serves_clients=True,
                        **_cluster_options(cluster, scale_up_delay_ms=scale_up_delay_ms,
                                           session_timeout_ms=session_timeout_ms,
                                           internal_topic_replication=internal_topic_replication,
                                           fast_failover=fast_failover))
    except (OSError, ValueError, JetwakeError) as e:
        release_ports()
        if str(e):
            log.error("cannot start the member: %s", e)
        else:  # a bare TimeoutError says nothing by itself: where it came from does
            log.exception("cannot start the member: %s", type(e).__name__)
        return 1
    except Exception as e:  # noqa: BLE001 - e.g. an unreadable job record in the data dir
        release_ports()
        log.exception("cannot start the member: %s", e)
        return 1
    try:
        service = MemberService(member, host, port, token, hello_timeout=hello_timeout,
                                max_unauthenticated=max_unauthenticated, bound=client_socket)
    except ValueError as e:
        release_ports()
        log.error("cannot start the member: %s", e)
        member.shutdown(graceful=False)
        return 2
    except OSError as e:
        release_ports()
        log.error("cannot listen on %s:%s: %s", host, port, e.strerror or e)
        member.shutdown(graceful=False)
        return 1
    metrics = None
    if metrics_port is not None:
        try:
            metrics = MetricsServer(member, host, metrics_port,
                                    healthy=lambda: service.serving,
                                    info=lambda: {"address": service.address_text,
                                                  "version": version()},
                                    service=service, ui_auth=ui_auth,
                                    bound=metrics_socket).start()
        except (OSError, ValueError) as e:
            release_ports()
            log.error("cannot serve metrics on %s:%s: %s", host, metrics_port,
                      getattr(e, "strerror", None) or e)
            service.server.server_close()
            member.shutdown(graceful=False)
            return 1
    # the port listens since the service was made: the member counts as serving (ACTIVE,
    # not JOINING) from here, and a client that connects meanwhile is answered once it starts
    member.client_address = advertise or service.address_text
    service.start()
    print(ready_line(member.member_id, member.client_address, cluster), flush=True)
    extra = ""
    if metrics is not None:
        extra = f", metrics on http://{metrics.address[0]}:{metrics.address[1]}/metrics"
    in_cluster = f", member {member.member_id} of cluster '{cluster}'" if cluster else ""
    log.info("member ready on %s%s%s%s (%d jobs)", service.address_text,
             ", token required" if token else "", extra, in_cluster, len(member.coordinators()))
    if metrics is not None:
        log.info("dashboard on http://%s:%s/ (%s)", metrics.address[0], metrics.address[1],
                 "reading and actions need the token" if ui_auth == "required"
                 else "actions need the token" if token else "actions need the X-Jetwake-Token "
                 "header")
    try:
        while not stop.wait(0.5):
            pass
    finally:
        _shut_down(member, service, metrics, data_dir)
    return 0


def ready_line(member_id: str, address: str, cluster: str | None) -> str:
    """The one line ``jetwake member start`` prints on stdout once the member serves its
    clients: a script or a supervisor waits for it instead of polling the port."""
    where = f"member {member_id} of cluster '{cluster}'" if cluster else "member (alone)"
    return f"jetwake {where} ready: clients connect to {address}"


def _cluster_options(cluster: str | None, **options: int | bool | None) -> dict:
    """The cluster settings given (a member without a cluster takes none)."""
    if not cluster:
        return {}
    return {k: v for k, v in options.items() if v is not None}


def _shut_down(member: Any, service: MemberService, metrics: Any, data_dir: str | None) -> None:
    """Stops accepting clients, stops the jobs (a terminal snapshot for those with a
    guarantee) and the metrics endpoint, in that order."""
    service.serving = False
    try:
        service.stop()
    except Exception:  # noqa: BLE001
        log.exception("stopping the service")
    t0 = time.monotonic()
    active = [c for c in member.coordinators() if not c.status.is_terminal
              and c.status != JobStatus.SUSPENDED]
    if active:
        log.info("stopping %d job(s)%s", len(active),
                 ": jobs with a guarantee take a terminal snapshot and resume on the next "
                 "start" if data_dir else "")
    member.shutdown()
    if metrics is not None:
        metrics.stop()
    log.info("member stopped in %.1f s", time.monotonic() - t0)
