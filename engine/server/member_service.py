"""The member service: a long-running member that clients drive over TCP.

Wire protocol (one TCP connection per client, one request and one response per frame):

* a frame is a 4-byte big-endian length followed by that many bytes of msgpack;
* the client's FIRST frame must be ``{"op": "hello", "token": ..., "version": ...}``. It is
  read with a 64 KiB limit and decoded as plain msgpack (no extension types); the token is
  compared with :func:`hmac.compare_digest`. Nothing else is read from a client before its
  hello is accepted, and a wrong token closes the connection;
* the whole hello must arrive within ``hello_timeout`` seconds of the connection being
  accepted (one deadline, not a limit per read: a client sending a byte now and then is
  closed all the same), and at most ``max_unauthenticated`` connections may be waiting for
  their hello at once: the member closes further ones at once, with one error reply;
* a member without a token serves anyone who reaches its port, and a submitted pipeline is
  code: so it only listens without a token on a loopback address (fail closed);
* after the hello, requests are ``{"op": NAME, "args": {...}}`` encoded with jetwake's msgpack
  serialization (tuples, datetimes, registered types; never pickle). A submitted pipeline
  travels as cloudpickle bytes inside a frame and is unpickled only on an authenticated
  connection;
* responses are ``{"ok": True, "result": ...}`` or ``{"ok": False, "error": [TYPE, MESSAGE]}``;
  the client re-raises jetwake's errors (and Python's built-in ones) under the same class.

Jobs belong to the member, not to the connection: a client may disconnect while its jobs run.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from dataclasses import asdict
from datetime import datetime
from typing import Any, Callable

import cloudpickle
import msgpack

from jetwake.engine.core.errors import JobNotFoundError, JobStateError
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.core.serialization import dumps, loads

__all__ = ["MemberService", "serve", "PROTOCOL_VERSION", "DEFAULT_PORT", "version",
           "read_frame", "write_frame", "ProtocolError", "InsecureAddressError",
           "is_loopback", "check_listen_address"]

log = logging.getLogger("jetwake.service")

PROTOCOL_VERSION = 1
DEFAULT_PORT = 5701
HELLO_MAX_BYTES = 64 * 1024
FRAME_MAX_BYTES = 1 << 30
HELLO_TIMEOUT_S = 10.0
# Each connection waiting for its hello holds a thread (for hello_timeout at most): a burst of
# honest clients connecting at once stays well below this, a flood of silent ones is cut off.
MAX_UNAUTHENTICATED = 256
_LEN = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


class InsecureAddressError(ValueError):
    """A member without a token was asked to listen on an address others can reach."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and the loopback addresses (127.0.0.0/8, ::1). Anything else,
    host names included, counts as reachable from the network: the check fails closed."""
    h = host.strip().lower()
    if h == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def check_listen_address(host: str, token: str | None) -> None:
    """Raises :class:`InsecureAddressError` when ``host`` is not a loopback address and there
    is no token: any client reaching the port could submit a pipeline, which is Python code
    run in the member."""
    if token or is_loopback(host):
        return
    shown = host if host else "all interfaces"
    raise InsecureAddressError(
        f"refusing to listen on {shown} without a token: anyone who can reach that address "
        "could run arbitrary code in this member (a submitted pipeline is Python code). "
        "Set a token with --token TOKEN or the JETWAKE_TOKEN environment variable (clients "
        "then need the same token), or listen on loopback only (--host 127.0.0.1)")


def version() -> str:
    try:
        from importlib.metadata import version as _v
        return _v("jetwake")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "0.1.0"


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:  # the time left for the whole frame, not for this read
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline passed")
            sock.settimeout(left)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            if not buf:
                return None
            raise ProtocolError("connection closed in the middle of a frame")
        buf += chunk
    return bytes(buf)


def read_frame(sock: socket.socket, limit: int = FRAME_MAX_BYTES,
               deadline: float | None = None) -> bytes | None:
    """The next frame's bytes, or None when the peer closed the connection cleanly. With a
    ``deadline`` (a :func:`time.monotonic` time) the whole frame must arrive before it, or
    :class:`socket.timeout` is raised; the socket's timeout is left changed."""
    head = _recv_exact(sock, 4, deadline)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > limit:
        raise ProtocolError(f"frame of {n} bytes exceeds the limit of {limit} bytes")
    data = _recv_exact(sock, n, deadline)
    if data is None:
        raise ProtocolError("connection closed in the middle of a frame")
    return data


def write_frame(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_LEN.pack(len(data)) + data)


def _decode_hello(data: bytes) -> dict:
    def no_ext(code: int, payload: bytes) -> Any:
        raise ProtocolError("extension types are not allowed in the hello frame")
    try:
        msg = msgpack.unpackb(data, raw=False, ext_hook=no_ext, max_bin_len=HELLO_MAX_BYTES,
                              max_str_len=HELLO_MAX_BYTES)
    except ProtocolError:
        raise
    except Exception as e:  # noqa: BLE001 - garbage from the network
        raise ProtocolError(f"the hello frame is not msgpack: {e}") from None
    if not isinstance(msg, dict) or msg.get("op") != "hello":
        raise ProtocolError("the first frame must be a hello")
    return msg


def _iso(t: float | None) -> str | None:
    return datetime.fromtimestamp(t).isoformat(timespec="seconds") if t else None


def _record_dict(rec: Any) -> dict | None:
    if rec is None:
        return None
    d = asdict(rec)
    d["entry_count"] = rec.entry_count
    d["size_bytes"] = rec.size_bytes
    return d


def _error_pair(e: BaseException) -> list[str]:
    if isinstance(e, KeyError) and not isinstance(e, JobNotFoundError) and e.args:
        msg = str(e.args[0])
    else:
        msg = str(e)
    return [type(e).__name__, msg]


# --- the request handlers ----------------------------------------------------------------------


class MemberService:
    """Serves one :class:`Member` to network clients (see the module docstring)."""

    MAP_METHODS = {"get", "contains", "len", "items", "keys", "values", "put", "put_all",
                   "remove", "clear", "put_if_absent"}
    LIST_METHODS = {"len", "getitem", "slice", "all", "clear"}

    # at most one warning per this many seconds about refused connections (a flood of them
    # must not flood the log too); the count is in ``refused_connections``
    REFUSAL_LOG_INTERVAL_S = 10.0

    def __init__(self, member: Any, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: str | None = None, *, hello_timeout: float = HELLO_TIMEOUT_S,
                 max_unauthenticated: int = MAX_UNAUTHENTICATED) -> None:
        """Binds ``host:port`` (port 0: any free port) and listens; :meth:`start` serves.

        ``hello_timeout``: seconds a new connection has to deliver its whole hello.
        ``max_unauthenticated``: connections that may wait for their hello at once; the member
        closes further ones at once. Raises :class:`InsecureAddressError` (a ValueError) for a
        non-loopback ``host`` without a ``token``, ValueError for a bad limit, OSError when
        the address cannot be bound."""
        if isinstance(hello_timeout, bool) or not isinstance(hello_timeout, (int, float)) \
                or not 0 < hello_timeout < float("inf"):
            raise ValueError(f"hello_timeout must be a positive number of seconds, got "
                             f"{hello_timeout!r}")
        if isinstance(max_unauthenticated, bool) or not isinstance(max_unauthenticated, int) \
                or max_unauthenticated < 1:
            raise ValueError(f"max_unauthenticated must be a whole number >= 1, got "
                             f"{max_unauthenticated!r}")
        check_listen_address(host, token)
        self.member = member
        self.token = token or None
        self.hello_timeout = float(hello_timeout)
        self.max_unauthenticated = max_unauthenticated
        self.started = time.time()
        self.serving = False
        self._unauthenticated = 0  # connections accepted whose hello is not yet answered
        self.refused_connections = 0  # closed at once because too many were waiting
        self._unrefused_logged = 0  # refusals not yet reported in a log line
        self._next_refusal_log = 0.0
        self._conn_lock = threading.Lock()
        self._starts: dict[str, int] = {}  # job id -> executions started (RUNNING events)
        self._starts_lock = threading.Lock()
        member.add_listener(self._on_event)
        service = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                service._handle_connection(self.request, self.client_address)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            # the listen backlog: socketserver's default of 5 made the kernel drop most of a
            # burst of connecting clients (they retry after 1 s, 3 s, ... or give up)
            request_queue_size = socket.SOMAXCONN

            def process_request(self, request: Any, client_address: Any) -> None:
                # decided on the accepting thread: a refused connection costs no thread
                if not service._admit(request, client_address):
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    service._authenticated_or_gone()
                    raise

        self.server = Server((host, port), Handler)
        self.address = self.server.server_address[:2]
        self._thread: threading.Thread | None = None

    @property
    def address_text(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def start(self) -> "MemberService":
        self.serving = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="jetwake-service")
        self._thread.start()
        return self

    @property
    def unauthenticated_connections(self) -> int:
        """Connections accepted whose hello has not been answered yet."""
        with self._conn_lock:
            return self._unauthenticated

    def stop(self) -> None:
        self.serving = False
        if self._thread is not None:  # shutdown() waits for serve_forever: only if it ran
            self.server.shutdown()
        self.server.server_close()

    # --- lifecycle log ---------------------------------------------------------------------

    def _on_event(self, job_id: str, job_name: str, event: str) -> None:
        if event == "running":
            with self._starts_lock:
                self._starts[job_id] = self._starts.get(job_id, 0) + 1
            return  # the coordinator logs "started: N processors[, restored from ...]"
        if event in ("starting", "completing", "not_running", "suspended_exporting_snapshot"):
            return
        who = f"job '{job_name}' ({job_id})"
        if event == "failed":
            c = self.member.find_coordinator(job_id)
            why = c.failure_text if c is not None else None
            if why and why.startswith("JobCancelledError"):
                log.info("%s cancelled", who)
            else:
                log.warning("%s failed: %s", who, why or "unknown reason")
        elif event == "suspended":
            c = self.member.find_coordinator(job_id)
            if c is not None and c.error is not None:
                log.warning("%s suspended on failure: %s", who, c.failure_text)
            else:
                log.info("%s suspended", who)
        else:
            log.info("%s %s", who, event)

    # --- connections -----------------------------------------------------------------------

    def _admit(self, sock: socket.socket, peer: Any) -> bool:
        """Counts a new connection as waiting for its hello, or refuses it (one error reply,
        without blocking) when ``max_unauthenticated`` are already waiting."""
        with self._conn_lock:
            if self._unauthenticated < self.max_unauthenticated:
                self._unauthenticated += 1
                return True
            self.refused_connections += 1
            self._unrefused_logged += 1
            now = time.monotonic()
            report = now >= self._next_refusal_log
            if report:
                count, self._unrefused_logged = self._unrefused_logged, 0
                self._next_refusal_log = now + self.REFUSAL_LOG_INTERVAL_S
        if report:
            peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
            log.warning("refused %d connection(s) (the latest from %s): %d clients are already "
                        "waiting to authenticate, the limit (--max-unauthenticated); %d refused "
                        "since the start", count, peer_text, self.max_unauthenticated,
                        self.refused_connections)
        try:
            sock.setblocking(False)
            write_frame(sock, msgpack.packb({"ok": False, "error": [
                "MemberUnreachableError",
                f"the member at {self.address_text} is busy: {self.max_unauthenticated} "
                "connections are already waiting to authenticate; try again shortly"]}))
            # read what the client sent already, so that closing sends FIN rather than RST
            # (an RST may destroy the reply before the client reads it)
            sock.recv(HELLO_MAX_BYTES)
        except OSError:
            pass  # best effort: the connection is closed either way
        return False

    def _authenticated_or_gone(self) -> None:
        with self._conn_lock:
            self._unauthenticated -= 1

    def _handle_connection(self, sock: socket.socket, peer: Any) -> None:
        peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        waiting = True  # counted in _unauthenticated until the hello is answered
        try:
            deadline = time.monotonic() + self.hello_timeout
            try:
                data = read_frame(sock, HELLO_MAX_BYTES, deadline)
            except socket.timeout:
                raise socket.timeout(f"no complete hello within {self.hello_timeout:g} s") \
                    from None
            if data is None:
                return
            hello = _decode_hello(data)
            # the reply is small; a client that does not read it gets the rest of its deadline
            sock.settimeout(max(deadline - time.monotonic(), 1.0))
            if not self._authenticate(hello.get("token")):
                log.warning("client %s: rejected (%s token)", peer_text,
                            "no" if not hello.get("token") else "wrong")
                msg = ("this member requires a token (--token or JETWAKE_TOKEN)"
                       if not hello.get("token") else "wrong token")
                write_frame(sock, msgpack.packb({"ok": False,
                                                 "error": ["AuthenticationError", msg]}))
                return
            write_frame(sock, msgpack.packb({"ok": True, "result": self._member_info()}))
            log.debug("client %s connected", peer_text)
            waiting = False
            self._authenticated_or_gone()
            sock.settimeout(None)
            while True:
                data = read_frame(sock)
                if data is None:
                    return
                write_frame(sock, self._respond(data, peer_text))
        except (ProtocolError, socket.timeout) as e:
            log.warning("client %s: %s; closing the connection", peer_text, e or "timed out")
        except OSError as e:
            log.debug("client %s: connection lost: %r", peer_text, e)
        finally:
            if waiting:
                self._authenticated_or_gone()
            try:
                sock.close()
            except OSError:
                pass

    def _authenticate(self, token: Any) -> bool:
        if self.token is None:
            return True
        if not isinstance(token, str):
            return False
        return hmac.compare_digest(token.encode(), self.token.encode())

    def _respond(self, data: bytes, peer: str) -> bytes:
        try:
            req = loads(data)
            if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                raise ProtocolError("a request must be a map with an 'op'")
            op = req["op"]
            handler: Callable[..., Any] | None = getattr(self, f"op_{op}", None)
            if handler is None:
                raise ValueError(f"unknown operation '{op}'")
            args = req.get("args") or {}
            if not isinstance(args, dict):
                raise TypeError("request args must be a map")
            result = handler(peer=peer, **args)
            try:
                return dumps({"ok": True, "result": result})
            except TypeError as e:
                raise TypeError(f"the result of '{op}' cannot be sent to the client: {e}; "
                                "register its type with jetwake.register_type") from None
        except ProtocolError:
            raise
        except Exception as e:  # noqa: BLE001 - every error goes back to the client
            if not isinstance(e, (KeyError, ValueError, TypeError, JobStateError)):
                log.debug("request failed", exc_info=True)
            return dumps({"ok": False, "error": _error_pair(e)})

    # --- information -----------------------------------------------------------------------

    def _member_info(self) -> dict:
        counts: dict[str, int] = {}
        for c in self.member.coordinators():
            counts[c.status.value] = counts.get(c.status.value, 0) + 1
        return {"address": self.address_text, "version": version(),
                "protocol": PROTOCOL_VERSION, "pid": os.getpid(),
                "data_dir": self.member.data_dir, "started": self.started,
                "uptime_s": round(time.time() - self.started, 1), "jobs": counts,
                "token_required": self.token is not None,
                "refused_connections": self.refused_connections}

    def _coordinator(self, job_id: str):
        c = self.member.find_coordinator(job_id)
        if c is None:
            raise JobNotFoundError(f"no job with name or id '{job_id}' on this member")
        return c

    def _job_info(self, c: Any) -> dict:
        cfg = dict(vars(c.config))
        with self._starts_lock:
            starts = self._starts.get(c.job_id, 0)
        return {"id": c.job_id, "name": c.name, "status": c.status.value,
                "submission_time": c.submission_time, "submitted": _iso(c.submission_time),
                "completion_time": c.completion_time, "failure": c.failure_text,
                "config": cfg, "last_snapshot": _record_dict(c.last_snapshot),
                "snapshot_count": c.snapshot_count, "restart_count": c.restart_count,
                "starts": starts, "done": c.is_done()}

    def op_ping(self, peer: str) -> dict:
        return self._member_info()

    def op_cluster(self, peer: str) -> dict:
        info = self._member_info()
        active = sum(1 for c in self.member.coordinators() if not c.status.is_terminal)
        return {"version": version(), "state": "ACTIVE" if self.serving else "PASSIVE",
                "members": [info], "jobs": len(self.member.coordinators()), "active_jobs": active}

    # --- jobs ------------------------------------------------------------------------------

    def op_submit(self, peer: str, pipeline: bytes, config: dict) -> dict:
        if not isinstance(pipeline, (bytes, bytearray)):
            raise TypeError("submit: the pipeline must be cloudpickle bytes")
        if not isinstance(config, dict):
            raise TypeError("submit: the config must be a map of JobConfig fields")
        try:
            definition = cloudpickle.loads(pipeline)  # authenticated connection only
        except Exception as e:  # noqa: BLE001
            raise ValueError(
                f"the member cannot load the submitted pipeline: {type(e).__name__}: {e}. "
                "Modules the pipeline imports by name must be installed on the member") from e
        job = self.member.new_job(definition, JobConfig(**config))
        c = self.member.find_coordinator(job.id)
        log.info("job '%s' (%s) submitted by %s: guarantee %s", c.name, c.job_id, peer,
                 c.config.processing_guarantee)
        return self._job_info(c)

    def op_get_job(self, peer: str, ref: str) -> dict | None:
        c = self.member.find_coordinator(ref)
        return self._job_info(c) if c is not None else None

    def op_job_info(self, peer: str, id: str) -> dict:  # noqa: A002
        return self._job_info(self._coordinator(id))

    def op_jobs(self, peer: str) -> list[dict]:
        coords = self.member.coordinators()
        return [self._job_info(c) for c in coords]

    def op_job_action(self, peer: str, id: str, action: str,  # noqa: A002
                      name: str | None = None, background: bool = False) -> Any:
        c = self._coordinator(id)
        log.debug("client %s: %s job %s", peer, action, c.name)
        if background:  # check the state now, run the (maybe slow) action on its own thread
            need = {"suspend": JobStatus.RUNNING, "restart": JobStatus.RUNNING,
                    "resume": JobStatus.SUSPENDED}.get(action)
            if need is not None:
                c.require(need, action)
            elif c.status.is_terminal:
                raise JobStateError(f"job '{c.name}' is already {c.status.value}")

            def run() -> None:
                try:
                    self.op_job_action(peer, id, action, name)
                except Exception as e:  # noqa: BLE001 - nobody waits for the answer
                    log.warning("job '%s' (%s): %s requested by %s failed: %s: %s", c.name,
                                c.job_id, action, peer, type(e).__name__, e)
            threading.Thread(target=run, daemon=True, name=f"jetwake-{action}").start()
            return self._job_info(c)
        if action == "cancel":
            c.cancel()
        elif action == "suspend":
            c.suspend()
        elif action == "resume":
            c.resume()
        elif action == "restart":
            c.restart()
        elif action == "take_snapshot":
            return _record_dict(c.take_snapshot())
        elif action == "export_snapshot":
            return _record_dict(c.export_snapshot(name))
        elif action == "cancel_and_export_snapshot":
            return _record_dict(c.export_snapshot(name, cancel=True))
        else:
            raise ValueError(f"unknown job action '{action}'")
        return self._job_info(c)

    def op_job_join(self, peer: str, id: str, wait: float = 1.0) -> dict:  # noqa: A002
        c = self._coordinator(id)
        done = c.wait_ended(max(0.0, min(float(wait), 10.0)))
        err = c.error if done else None
        return {"done": done, "status": c.status.value,
                "error": _error_pair(err) if err is not None else None}

    def op_job_wait(self, peer: str, id: str, statuses: list,  # noqa: A002
                    wait: float = 1.0) -> dict:
        c = self._coordinator(id)
        want = {JobStatus(s) for s in statuses}
        c.wait_for_status(want, max(0.0, min(float(wait), 10.0)))
        return self._job_info(c)

    def op_job_metrics(self, peer: str, id: str) -> dict:  # noqa: A002
        return self._coordinator(id).metrics()

    # --- snapshots -------------------------------------------------------------------------

    def op_snapshots(self, peer: str) -> list[dict]:
        return [_record_dict(r) for r in self.member.snapshots()]

    def op_delete_snapshot(self, peer: str, name: str) -> None:
        self.member.delete_snapshot(name)
        log.info("snapshot '%s' deleted by %s", name, peer)

    # --- maps and lists --------------------------------------------------------------------

    def op_map(self, peer: str, name: str, method: str, args: list | None = None) -> Any:
        if method not in self.MAP_METHODS:
            raise ValueError(f"unknown map operation '{method}'")
        m = self.member.get_map(name)
        a = list(args or ())
        if method == "get":
            return [a[0] in m, m.get(a[0])]
        if method == "contains":
            return a[0] in m
        if method == "len":
            return len(m)
        if method == "items":
            return [(k, v) for k, v in m.items()]
        if method == "keys":
            return list(m.keys())
        if method == "values":
            return list(m.values())
        if method == "put_all":
            m.put_all([tuple(e) for e in a[0]])
            return None
        if method == "clear":
            m.clear()
            return None
        return getattr(m, method)(*a)

    def op_list(self, peer: str, name: str, method: str, args: list | None = None) -> Any:
        if method not in self.LIST_METHODS:
            raise ValueError(f"unknown list operation '{method}'")
        lst = self.member.get_list(name)
        a = list(args or ())
        if method == "len":
            return len(lst)
        if method == "getitem":
            return lst[a[0]]
        if method == "slice":
            return list(lst)[slice(*a)]
        if method == "all":
            return list(lst)
        lst.clear()
        return None


# --- running a member in the foreground --------------------------------------------------------


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
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s",
                                           "%Y-%m-%d %H:%M:%S"))
    handler.addFilter(_LifecycleFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("jetwake").setLevel(getattr(logging, level.upper(), logging.INFO))


def serve(*, data_dir: str | None = None, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          token: str | None = None, metrics_port: int | None = None,
          cooperative_threads: int | None = None, local_parallelism: int | None = None,
          log_level: str = "INFO", install_signals: bool = True,
          stop_event: threading.Event | None = None, hello_timeout: float = HELLO_TIMEOUT_S,
          max_unauthenticated: int = MAX_UNAUTHENTICATED) -> int:
    """Runs a member in the foreground until SIGTERM/SIGINT (or ``stop_event``); returns the
    process exit code. The first signal shuts down gracefully (jobs with a guarantee take a
    terminal snapshot and resume on the next start on the same data directory); a second one
    exits at once. A non-loopback ``host`` without a ``token`` is refused (exit code 2) before
    anything else is opened."""
    from jetwake.engine.jobs.member import Member
    from jetwake.engine.server.metrics import MetricsServer

    configure_logging(log_level)
    try:
        check_listen_address(host, token)
    except InsecureAddressError as e:
        log.error("%s", e)
        return 2
    stop = stop_event or threading.Event()
    signals = {"count": 0}

    def on_signal(signum: int, frame: Any) -> None:
        signals["count"] += 1
        name = signal.Signals(signum).name
        if signals["count"] == 1:
            log.info("%s received: shutting down gracefully (send it again to exit at once)",
                     name)
            stop.set()
        else:
            log.warning("%s received again: exiting now without waiting for the jobs", name)
            logging.shutdown()
            os._exit(130)

    if install_signals:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    where = data_dir or "memory only: jobs and state are lost at exit"
    log.info("jetwake %s member starting (pid %d, data: %s)", version(), os.getpid(), where)
    try:
        member = Member(data_dir, cooperative_threads=cooperative_threads,
                        local_parallelism=local_parallelism)
    except (OSError, ValueError) as e:
        log.error("cannot start the member: %s", e)
        return 1
    except Exception as e:  # noqa: BLE001 - e.g. an unreadable job record in the data dir
        log.exception("cannot start the member: %s", e)
        return 1
    try:
        service = MemberService(member, host, port, token, hello_timeout=hello_timeout,
                                max_unauthenticated=max_unauthenticated)
    except ValueError as e:
        log.error("cannot start the member: %s", e)
        member.shutdown(graceful=False)
        return 2
    except OSError as e:
        log.error("cannot listen on %s:%s: %s", host, port, e.strerror or e)
        member.shutdown(graceful=False)
        return 1
    metrics = None
    if metrics_port is not None:
        try:
            metrics = MetricsServer(member, host, metrics_port,
                                    healthy=lambda: service.serving,
                                    info=lambda: {"address": service.address_text,
                                                  "version": version()}).start()
        except OSError as e:
            log.error("cannot serve metrics on %s:%s: %s", host, metrics_port, e.strerror or e)
            service.server.server_close()
            member.shutdown(graceful=False)
            return 1
    service.start()
    extra = ""
    if metrics is not None:
        extra = f", metrics on http://{metrics.address[0]}:{metrics.address[1]}/metrics"
    log.info("member ready on %s%s%s (%d jobs)", service.address_text,
             ", token required" if token else "", extra, len(member.coordinators()))
    try:
        while not stop.wait(0.5):
            pass
    finally:
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
    return 0
