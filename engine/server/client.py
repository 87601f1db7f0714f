"""A network client of a member service, with the embedded member's job and data API.

``Client("127.0.0.1:5701", token=...)`` offers ``new_job``, ``get_job``, ``job``, ``jobs``,
``get_map``, ``get_list``, ``snapshots`` and ``delete_snapshot``; the jobs it returns
(:class:`RemoteJob`) have the methods of :class:`jetwake.Job`. Jobs run on the member: they
keep running when the client disconnects.
"""

from __future__ import annotations

import builtins
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Iterator

import cloudpickle
import msgpack

from jetwake.engine.core import errors as _errors
from jetwake.engine.core.errors import JetwakeError, JobNotFoundError
from jetwake.engine.jobs.job_config import JobConfig
from jetwake.engine.jobs.job_status import JobStatus
from jetwake.engine.jobs.state_view import StateView
from jetwake.engine.core.serialization import dumps, loads
from jetwake.engine.server.authentication import HELLO_MAX_BYTES
from jetwake.engine.net.framing import ProtocolError, read_frame, write_frame
from jetwake.engine.server.protocol import DEFAULT_PORT, PROTOCOL_VERSION, version

__all__ = ["Client", "RemoteJob", "RemoteMap", "RemoteList", "MemberUnreachableError",
           "MemberNotServingError", "AuthenticationError", "RemoteError", "parse_address"]


class MemberUnreachableError(JetwakeError, ConnectionError):
    """No member answers at the address (or the connection to it was lost)."""


class MemberNotServingError(MemberUnreachableError):
    """Nothing accepts connections at the address: no member runs there, or it is still
    starting (a member of a cluster serves clients once it has joined). Retryable: the same
    call succeeds once the member serves (``Client(..., connect_retry=SECONDS)`` retries by
    itself)."""

    retryable = True


class AuthenticationError(JetwakeError):
    """The member refused the client's token."""


class RemoteError(JetwakeError):
    """An error raised on the member whose class the client does not know; the message
    starts with the remote type's name (``remote_type``)."""

    def __init__(self, remote_type: str, message: str) -> None:
        super().__init__(f"{remote_type}: {message}")
        self.remote_type = remote_type
        self.remote_message = message


def _error_classes() -> dict[str, type[BaseException]]:
    classes: dict[str, type[BaseException]] = {}
    for name in dir(builtins):
        obj = getattr(builtins, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            classes[name] = obj
    for name in _errors.__all__:
        classes[name] = getattr(_errors, name)
    classes["AuthenticationError"] = AuthenticationError
    from jetwake.engine.jobs.state_reading import StateQueryError, StateUnavailableError
    classes["StateQueryError"] = StateQueryError
    classes["StateUnavailableError"] = StateUnavailableError
    classes["MemberUnreachableError"] = MemberUnreachableError
    try:  # jetwake's other public errors, if their modules import
        from jetwake.engine.core.dag import DagValidationError
        from jetwake.engine.pipeline.pipeline import PipelineError
        from jetwake.engine.processors.insert_watermarks import TimestampError
        from jetwake.engine.core.serialization import SerializationError
        for cls in (DagValidationError, PipelineError, TimestampError, SerializationError):
            classes[cls.__name__] = cls
    except Exception:  # noqa: BLE001 - optional
        pass
    return classes


_ERRORS = _error_classes()


def remote_error(pair: Any) -> BaseException:
    """Rebuilds an exception from the (type name, message) a member sent."""
    try:
        name, message = str(pair[0]), str(pair[1])
    except Exception:  # noqa: BLE001
        return RemoteError("Error", repr(pair))
    cls = _ERRORS.get(name)
    if cls is not None:
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 - a constructor with other arguments
            pass
    return RemoteError(name, message)


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"``, ``"host"`` (port 5701) or ``"[::1]:5701"`` -> (host, port)."""
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"a member address is 'host:port', got {address!r}")
    a = address.strip()
    if a.startswith("["):
        host, _, rest = a[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif a.count(":") == 1:
        host, port_text = a.split(":")
    else:
        host, port_text = a, ""
    if not port_text:
        return host or "127.0.0.1", DEFAULT_PORT
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"a member address is 'host:port', got {address!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in member address {address!r}")
    return host or "127.0.0.1", port


class Client:
    """A connection to a member: ``with Client("127.0.0.1:5701") as c: c.jobs()``."""

    def __init__(self, address: str = f"127.0.0.1:{DEFAULT_PORT}", token: str | None = None,
                 *, connect_timeout: float = 5.0, request_timeout: float = 300.0,
                 connect_retry: float = 0.0) -> None:
        """``connect_retry``: seconds to keep trying while nothing accepts connections at
        ``address`` (a member that is starting); after that, or with 0, such a connection
        raises :class:`MemberNotServingError`."""
        self.address = address
        self.host, self.port = parse_address(address)
        self.token = token
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        if isinstance(connect_retry, bool) or not isinstance(connect_retry, (int, float)) \
                or not 0 <= connect_retry < float("inf"):
            raise ValueError(f"connect_retry must be a number of seconds >= 0, got "
                             f"{connect_retry!r}")
        self.connect_retry = float(connect_retry)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self.member_info: dict = {}
        self._connect()

    # --- connection ------------------------------------------------------------------------

    def _connect(self) -> None:
        where = f"{self.host}:{self.port}"
        deadline = time.monotonic() + self.connect_retry
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), self.connect_timeout)
                break
            except ConnectionRefusedError:
                if time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                waited = f" for {self.connect_retry:g} s" if self.connect_retry else ""
                raise MemberNotServingError(
                    f"no jetwake member serves clients at {where}{waited}: nothing accepts "
                    f"connections there. A member that is starting serves once it has joined "
                    f"its cluster (retry then; 'jetwake cluster --wait N' waits until N "
                    f"members serve). Is it running ('jetwake member start --port "
                    f"{self.port}')?") from None
            except OSError as e:
                reason = e.strerror or str(e) or type(e).__name__
                raise MemberUnreachableError(
                    f"no jetwake member reachable at {where}: {reason}. Is it running "
                    f"('jetwake member start --port {self.port}')?") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.connect_timeout)
            write_frame(sock, msgpack.packb({"op": "hello", "token": self.token,
                                             "version": version(),
                                             "protocol": PROTOCOL_VERSION}))
            data = read_frame(sock, HELLO_MAX_BYTES)
            if data is None:
                raise MemberUnreachableError(f"the member at {where} closed the connection")
            reply = msgpack.unpackb(data, raw=False)
        except (OSError, ProtocolError, ValueError) as e:
            sock.close()
            if isinstance(e, MemberUnreachableError):
                raise
            raise MemberUnreachableError(
                f"no jetwake member answers at {where}: {e}") from None
        if not reply.get("ok"):
            sock.close()
            err = remote_error(reply.get("error"))
            if isinstance(err, AuthenticationError):
                raise AuthenticationError(f"the member at {where} refused the connection: "
                                          f"{err}")
            raise err
        sock.settimeout(self.request_timeout)
        self.member_info = reply.get("result") or {}
        self._sock = sock

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.close()
                finally:
                    self._sock = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.host}:{self.port})"

    def call(self, op: str, **args: Any) -> Any:
        """Sends one request and returns its result (raises the member's error)."""
        request = dumps({"op": op, "args": args})
        with self._lock:
            if self._sock is None:
                self._connect()
            sock = self._sock
            try:
                write_frame(sock, request)  # type: ignore[arg-type]
                data = read_frame(sock)  # type: ignore[arg-type]
            except socket.timeout:
                self._sock = None  # the answer may still come: this connection is done
                sock.close()  # type: ignore[union-attr]
                raise TimeoutError(f"no answer from the member at {self.host}:{self.port} "
                                   f"within {self.request_timeout:g} s ('{op}')") from None
            except (OSError, ProtocolError) as e:
                self._sock = None
                try:
                    sock.close()  # type: ignore[union-attr]
                except OSError:
                    pass
                raise MemberUnreachableError(
                    f"lost the connection to the member at {self.host}:{self.port}: "
                    f"{e}") from None
            if data is None:
                self._sock = None
                raise MemberUnreachableError(
                    f"the member at {self.host}:{self.port} closed the connection")
        reply = loads(data)
        if reply.get("ok"):
            return reply.get("result")
        raise remote_error(reply.get("error"))

    # --- jobs ------------------------------------------------------------------------------

    def new_job(self, pipeline: Any, config: JobConfig | None = None) -> "RemoteJob":
        """Submits a Pipeline (or a DAG) to the member and starts it; returns its job once it
        runs. A start that fails raises its error (under the same class when it is a jetwake
        or built-in error), however long the member took to find it."""
        job = self.submit_job(pipeline, config)
        if not isinstance(job, RemoteJob):
            return job  # JobConfig(dry_run=True): the upgrade plan
        error = job.wait_started()["start"]["error"]
        if error is not None:
            raise remote_error(error)
        return job

    def new_light_job(self, pipeline: Any, config: JobConfig | None = None) -> "RemoteJob":
        """Starts a light job: the member this client is connected to starts it on every
        member of its cluster and coordinates it; no snapshots, no job record (see
        docs/cluster.md, "Light jobs"). Returns once it runs."""
        job = self.submit_job(pipeline, config, light=True)
        error = job.wait_started()["start"]["error"]
        if error is not None:
            raise remote_error(error)
        return job

    def submit_job(self, pipeline: Any, config: JobConfig | None = None, *,
                   light: bool = False) -> "RemoteJob":
        """Submits a Pipeline (or a DAG) and returns its job at once, while the member starts
        it; :meth:`RemoteJob.wait_started` waits for the start. A refused submission (a name
        in use, an unknown initial snapshot) raises here and leaves no job behind."""
        if config is None:
            config = JobConfig()
        elif not isinstance(config, JobConfig):
            raise TypeError(f"new_job() expects a JobConfig, got {type(config).__qualname__}")
        from jetwake.engine.core.dag import DAG
        from jetwake.engine.pipeline.pipeline import Pipeline
        if not isinstance(pipeline, (Pipeline, DAG)):
            raise TypeError(f"new_job() expects a Pipeline or a DAG, got "
                            f"{type(pipeline).__qualname__}")
        try:
            data = cloudpickle.dumps(pipeline)
        except Exception as e:  # noqa: BLE001
            raise TypeError(f"the pipeline cannot be serialized to send it to the member: "
                            f"{type(e).__name__}: {e}") from e
        args: dict[str, Any] = {"pipeline": data, "config": dict(vars(config)),
                                "wait": min(0.5, self._poll_wait)}
        if light:
            args["light"] = True
        info = self.call("submit", **args)
        if info.get("dry_run"):
            # JobConfig(initial_snapshot_name=..., dry_run=True): what the job would do with
            # the snapshot's state, and no job (engine/jobs/upgrade_plan.py)
            from jetwake.engine.jobs.upgrade_plan import UpgradePlan
            return UpgradePlan.from_dict(info["plan"])  # type: ignore[return-value]
        return RemoteJob(self, info)

    @property
    def _poll_wait(self) -> float:
        """How long one request may wait on the member for a job's state to change: well
        inside the request timeout, short enough to keep a progress display current."""
        return max(0.05, min(2.0, self.request_timeout / 2))

    def get_job(self, name_or_id: str) -> "RemoteJob | None":
        """The job with this id, or the newest job with this name; None if there is none."""
        info = self.call("get_job", ref=name_or_id)
        return RemoteJob(self, info) if info is not None else None

    def job(self, name_or_id: str) -> "RemoteJob":
        """Like :meth:`get_job` but raises :class:`JobNotFoundError` for an unknown job."""
        job = self.get_job(name_or_id)
        if job is None:
            raise JobNotFoundError(f"no job with name or id '{name_or_id}' on the member at "
                                   f"{self.host}:{self.port}")
        return job

    def jobs(self) -> list["RemoteJob"]:
        """Every job the member knows, oldest first."""
        return [RemoteJob(self, info) for info in self.call("jobs")]

    # --- snapshots -------------------------------------------------------------------------

    def snapshots(self) -> list:
        """The named (exported) snapshots, as commit records."""
        return [_commit_record(d) for d in self.call("snapshots")]

    def delete_snapshot(self, name: str) -> None:
        """Deletes a named snapshot; raises SnapshotNotFoundError if there is none."""
        self.call("delete_snapshot", name=name)

    def write_snapshot(self, name: str, job_name: str, entries: list):
        """Writes ``(vertex, key, value)`` entries on the member as a snapshot exported as
        ``name`` (a Spark backfill's hand-off); returns its commit record."""
        return _commit_record(self.call("write_snapshot", name=name, job_name=job_name,
                                        entries=[list(e) for e in entries]))

    def inspect_snapshot(self, ref: str, sample: int = 5) -> dict:
        """What an exported snapshot (by name), or a job's last committed snapshot (by the
        job's name or id), holds: see ``Member.inspect_snapshot``."""
        return self.call("snapshot_inspect", ref=ref, sample=sample)

    # --- data ------------------------------------------------------------------------------

    def get_map(self, name: str) -> "RemoteMap":
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a map name must be a non-empty string, got {name!r}")
        return RemoteMap(self, name)

    def get_list(self, name: str) -> "RemoteList":
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a list name must be a non-empty string, got {name!r}")
        return RemoteList(self, name)

    # --- the member ------------------------------------------------------------------------

    def ping(self) -> dict:
        return self.call("ping")

    def cluster(self) -> dict:
        """Members, their addresses and version, and job counts."""
        return self.call("cluster")


def _commit_record(d: dict | None):
    if d is None:
        return None
    from jetwake.snapshot.store.snapshot_store import CommitRecord
    fields = {k: v for k, v in d.items() if k in CommitRecord.__dataclass_fields__}
    return CommitRecord(**fields)


_TERMINAL = {JobStatus.FAILED, JobStatus.COMPLETED}


class RemoteJob:
    """A job on a member, with the methods of :class:`jetwake.Job`. Properties that change
    (``status``, ``failure``, ``last_snapshot``) are read from the member on each access."""

    def __init__(self, client: Client, info: dict) -> None:
        self._client = client
        self._info = info

    def refresh(self) -> dict:
        """Reads the job's current state from the member (and returns it as a dict)."""
        self._info = self._client.call("job_info", id=self._info["id"])
        return self._info

    def info(self) -> dict:
        return dict(self.refresh())

    @property
    def id(self) -> str:
        return self._info["id"]

    @property
    def name(self) -> str:
        return self._info["name"]

    @property
    def config(self) -> JobConfig:
        return JobConfig.from_dict(self._info.get("config") or {})

    @property
    def submission_time(self) -> float:
        return self._info["submission_time"]

    @property
    def status(self) -> JobStatus:
        return JobStatus(self.refresh()["status"])

    def get_status(self) -> JobStatus:
        return self.status

    @property
    def failure(self) -> str | None:
        return self.refresh().get("failure")

    @property
    def last_snapshot(self):
        return _commit_record(self.refresh().get("last_snapshot"))

    def metrics(self) -> dict[str, dict[str, float]]:
        return self._client.call("job_metrics", id=self.id)

    def state(self, stage: str, consistency: str = "snapshot") -> StateView:
        """A view of a stateful stage's state, as ``Job.state`` (each read a request to the
        member, answered by the job's coordinator)."""
        client, job_id = self._client, self.id
        return StateView(lambda **args: client.call("job_state", id=job_id, **args), stage,
                         consistency)

    def is_done(self) -> bool:
        return bool(self.refresh().get("done"))

    def join(self, timeout: float | None = None) -> None:
        """Waits until the job ends: returns if COMPLETED, raises the job's error (same class
        when it is a jetwake or built-in error) if FAILED, TimeoutError on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 2.0 if deadline is None else max(0.0, min(2.0, deadline - time.monotonic()))
            r = self._client.call("job_join", id=self.id, wait=wait)
            if r["done"]:
                if r.get("error"):
                    raise remote_error(r["error"])
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job '{self.name}' still {r['status']} after {timeout} s")

    def wait_for_status(self, statuses: set[JobStatus] | Callable[[dict], bool],
                        timeout: float | None = 60.0,
                        progress: Callable[[dict, float], None] | None = None) -> dict:
        """Waits until the job is in one of ``statuses`` (or ``statuses(info)`` is true);
        returns the job's info; TimeoutError after ``timeout`` seconds."""
        if callable(statuses):
            check, names = statuses, []
        else:
            names = [JobStatus(s).value for s in statuses]
            check = lambda i: i["status"] in names  # noqa: E731
        start = time.monotonic()
        info = self.refresh()
        while not check(info):
            elapsed = time.monotonic() - start
            if timeout is not None and elapsed >= timeout:
                raise TimeoutError(f"job '{self.name}' is still {info['status']} after "
                                   f"{timeout:g} s")
            if progress is not None:
                progress(info, elapsed)
            wait = 0.5 if timeout is None else max(0.05, min(0.5, timeout - elapsed))
            if names:
                info = self._client.call("job_wait", id=self.id, statuses=names, wait=wait)
                self._info = info
            else:
                time.sleep(min(wait, 0.1))
                info = self.refresh()
        return info

    def wait_started(self, timeout: float | None = None,
                     progress: Callable[[dict, float], None] | None = None) -> dict:
        """Waits until the member has finished starting the job: it runs (or already ended),
        or its start failed. Returns the job's info, whose ``start`` is ``{"done": True,
        "error": [TYPE, MESSAGE] or None}`` (the job's ``failure`` says it too); TimeoutError
        after ``timeout`` seconds, while the member carries on starting it. ``progress(info,
        elapsed)`` is called between the polls."""
        t0 = time.monotonic()
        info = self._info if "start" in self._info else None
        while info is None or not info["start"]["done"]:
            elapsed = time.monotonic() - t0
            if info is not None:
                if timeout is not None and elapsed >= timeout:
                    raise TimeoutError(f"job '{self.name}' is still {info['status']} after "
                                       f"{timeout:g} s: the member is still starting it")
                if progress is not None:
                    progress(info, elapsed)
            wait = self._client._poll_wait
            if timeout is not None:
                wait = max(0.0, min(wait, timeout - elapsed))
            info = self._client.call("job_start", id=self.id, wait=wait)
            self._info = info
        return info

    def _action(self, action: str, **args: Any) -> Any:
        return self._client.call("job_action", id=self.id, action=action, **args)

    def cancel(self) -> None:
        """Stops the job; it ends FAILED with JobCancelledError."""
        self._action("cancel")

    def suspend(self) -> None:
        """Takes a terminal snapshot (if the job has a guarantee) and stops; see resume()."""
        self._action("suspend")
        self.wait_for_status({JobStatus.SUSPENDED, *_TERMINAL}, 60)

    def resume(self) -> None:
        """Starts a suspended job again from its last snapshot."""
        self._action("resume")

    def restart(self) -> None:
        """Stops the running execution and starts a new one from the last snapshot."""
        self._action("restart")

    def export_snapshot(self, name: str):
        """Takes a snapshot and keeps it under ``name`` until deleted."""
        return _commit_record(self._action("export_snapshot", name=name))

    def cancel_and_export_snapshot(self, name: str):
        """Takes a terminal snapshot, exports it as ``name`` and cancels the job."""
        rec = _commit_record(self._action("cancel_and_export_snapshot", name=name))
        self.wait_for_status(_TERMINAL, 60)
        return rec

    def take_snapshot(self):
        return _commit_record(self._action("take_snapshot"))

    def __repr__(self) -> str:
        return f"RemoteJob(id={self.id!r}, name={self.name!r}, status={self._info['status']})"


_MISSING = object()


class RemoteMap(Mapping):
    """A member's named map, read and written over the connection (each call is a round
    trip; ``items()``, ``keys()`` and ``values()`` fetch the whole map at once)."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = name

    def _call(self, method: str, *args: Any) -> Any:
        return self._client.call("map", name=self.name, method=method, args=list(args))

    def __getitem__(self, key: Any) -> Any:
        found, value = self._call("get", key)
        if not found:
            raise KeyError(key)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        found, value = self._call("get", key)
        return value if found else default

    def __contains__(self, key: object) -> bool:
        return bool(self._call("contains", key))

    def __len__(self) -> int:
        return self._call("len")

    def size(self) -> int:
        return len(self)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._call("keys"))

    def keys(self):  # type: ignore[override]
        return list(self._call("keys"))

    def items(self):  # type: ignore[override]
        return [tuple(e) for e in self._call("items")]

    def values(self):  # type: ignore[override]
        return list(self._call("values"))

    def to_dict(self) -> dict:
        return dict(self.items())

    def put(self, key: Any, value: Any) -> Any:
        return self._call("put", key, value)

    def put_all(self, entries: Any) -> None:
        if isinstance(entries, Mapping):
            entries = entries.items()
        self._call("put_all", [tuple(e) for e in entries])

    def put_if_absent(self, key: Any, value: Any) -> Any:
        return self._call("put_if_absent", key, value)

    def remove(self, key: Any) -> Any:
        return self._call("remove", key)

    def clear(self) -> None:
        self._call("clear")

    def __repr__(self) -> str:
        return f"RemoteMap({self.name!r})"


class RemoteList(Sequence):
    """A member's named list (read-only here, plus ``clear`` and ``commit``)."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = name

    def _call(self, method: str, *args: Any) -> Any:
        return self._client.call("list", name=self.name, method=method, args=list(args))

    def __len__(self) -> int:
        return self._call("len")

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return self._call("slice", index.start, index.stop, index.step)
        if not isinstance(index, int):
            raise TypeError(f"list indices must be integers or slices, not "
                            f"{type(index).__name__}")
        return self._call("getitem", index)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._call("all"))

    def to_list(self) -> list:
        return list(self._call("all"))

    def clear(self) -> None:
        self._call("clear")

    def commit(self, items: list, writer: str, snapshot_id: int) -> bool:
        """Appends ``items`` unless ``writer`` committed ``snapshot_id`` (or a later one)
        already, so a request sent again is applied once (``NamedList.commit``)."""
        return self._call("commit", list(items), writer, snapshot_id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, RemoteList)):
            return self.to_list() == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"RemoteList({self.name!r})"
