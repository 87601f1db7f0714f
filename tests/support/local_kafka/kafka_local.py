#!/usr/bin/env python3
"""Run a real Apache Kafka broker (KRaft mode, no ZooKeeper, no Docker) on loopback.

    kafka_local.py up     [--port P] [--nodes N] [--host H] [--broker-config KEY=VALUE ...]
                                                   start (no-op if one already answers on P)
    kafka_local.py down   [--port P]               stop what `up` started on P, delete its data
    kafka_local.py status [--port P]

The port defaults to $KAFKA_PORT, else 9092. The broker jars are fetched on first use with
Maven (tests/support/local_kafka/pom.xml -> .cache/kafka/lib/) and run with the local `java`.
Everything a broker writes lives in .cache/kafka/run-<port>/ (data, server properties,
broker log, pid file); `down` removes that directory.

With --nodes 3 three processes are started, each a combined broker+controller, with client
listeners on P, P+1, P+2 and a three-voter controller quorum on other free ports.

--host (start_broker(host=...)) makes the client listener listen on, and advertise, another
local address than loopback, e.g. a bridge's address that processes in network namespaces
reach (the controller listeners stay on loopback: only the brokers use them).

--broker-config KEY=VALUE (repeatable; start_broker(broker_config={...})) sets a broker
property in the server properties of every node, over the defaults written here, e.g.
group.min.session.timeout.ms=1000 for consumers with a session timeout below Kafka's 6000 ms
minimum. The properties that wire up the listeners, node ids, quorum and data directories are
kafka_local's own and cannot be set.

The functions start_broker(), stop_broker(), broker_ready() and broker_status() are the
importable API (used by tests/support/kafka_broker.py and the benchmarks in bench/). Only the
standard library is used, except confluent_kafka for the Admin-API readiness check, which is
imported lazily.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

# These scripts are run by path and loaded by path (spec_from_file_location), never as part of a
# package, so the sibling module is found through sys.path: the folder tests/support goes on it
# (once, only if absent) and `import local_processes` then gives every loader the same module,
# which a plain import is the least surprising way to do.
_SUPPORT = str(Path(__file__).resolve().parent.parent)
if _SUPPORT not in sys.path:
    sys.path.append(_SUPPORT)
import local_processes as _lp  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent.parent
POM = HERE / "pom.xml"
CACHE = REPO_ROOT / ".cache" / "kafka"
LIB = CACHE / "lib"
FETCH_STAMP = LIB / ".fetched"  # holds the sha256 of the pom the jars were fetched with

HOST = "127.0.0.1"
DEFAULT_PORT = 9092
READY_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0
# Same variable names as Kafka's own bin/ scripts. The defaults favour start-up time and a
# small footprint on a laptop/CI box over peak throughput: C1-only JIT and the serial GC start
# a broker about a third faster on 2 cores than the JVM defaults.
HEAP = os.environ.get("KAFKA_HEAP_OPTS", "-Xms64m -Xmx512m")
JVM_OPTS = os.environ.get("KAFKA_JVM_PERFORMANCE_OPTS",
                          "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")


class KafkaLocalError(RuntimeError):
    """Raised for every failure a caller should report (fetch, format, start, readiness)."""


def _log(msg: str) -> None:
    print(f"[kafka-local] {msg}", file=sys.stderr, flush=True)


def default_port() -> int:
    return int(os.environ.get("KAFKA_PORT") or DEFAULT_PORT)


def run_dir(port: int) -> Path:
    return CACHE / f"run-{port}"


def bootstrap_for(port: int, nodes: int = 1, host: str = HOST) -> str:
    return ",".join(f"{host}:{port + i}" for i in range(nodes))


_file_lock = _lp.file_lock


# --------------------------------------------------------------------------------------------
# ports
# --------------------------------------------------------------------------------------------

port_in_use = _lp.port_in_use
_can_bind = _lp.can_bind


def free_port(count: int = 1, avoid: set[int] | None = None) -> int:
    """A loopback port P such that P .. P+count-1 are all currently free, below the kernel's
    ephemeral range: a node started again on its port must find it free (see
    local_processes.server_port)."""
    return _lp.server_port(count, avoid, error=KafkaLocalError)


# --------------------------------------------------------------------------------------------
# jars
# --------------------------------------------------------------------------------------------

def _pom_digest() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def jars_present() -> bool:
    return (FETCH_STAMP.is_file() and FETCH_STAMP.read_text().strip() == _pom_digest()
            and any(LIB.glob("kafka_2.13-*.jar")))


def kafka_version() -> str | None:
    for jar in sorted(LIB.glob("kafka_2.13-*.jar")):
        return jar.name[len("kafka_2.13-"):-len(".jar")]
    return None


def ensure_jars() -> Path:
    """Fetch the broker jars into .cache/kafka/lib/ unless the pom's jars are already there."""
    if jars_present():
        return LIB
    with _file_lock(CACHE / "locks" / "fetch.lock"):
        if jars_present():
            return LIB
        mvn = shutil.which("mvn")
        if not mvn:
            raise KafkaLocalError("Maven (`mvn`) is not on PATH; it is needed once to fetch the "
                                  f"Kafka jars into {LIB}")
        if LIB.exists():  # the pom changed (or a fetch was interrupted): start clean
            shutil.rmtree(LIB)
        LIB.mkdir(parents=True)
        _log(f"fetching Kafka jars with Maven into {LIB} ...")
        t0 = time.monotonic()
        proc = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies"],
                              cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        if proc.returncode != 0 or not any(LIB.glob("kafka_2.13-*.jar")):
            raise KafkaLocalError("fetching the Kafka jars failed (mvn exit code "
                                  f"{proc.returncode}):\n{proc.stdout[-4000:]}")
        FETCH_STAMP.write_text(_pom_digest() + "\n")
        _log(f"fetched Kafka {kafka_version()} ({len(list(LIB.glob('*.jar')))} jars) "
             f"in {time.monotonic() - t0:.1f}s")
    return LIB


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if not java:
        raise KafkaLocalError("`java` (17 or newer) is not on PATH and JAVA_HOME is not set")
    return java


def _classpath() -> str:
    return str(LIB / "*")


# --------------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------------

LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
log4j.logger.org.apache.kafka.storage.internals.log=WARN
log4j.logger.kafka.log=WARN
"""


# the properties start_broker derives from its port, host and node count: setting them would
# break the listeners, the quorum or the run directory it manages
RESERVED_PROPERTIES = frozenset({
    "process.roles", "node.id", "controller.quorum.voters", "listeners",
    "advertised.listeners", "controller.listener.names", "inter.broker.listener.name",
    "listener.security.protocol.map", "log.dirs", "log.dir",
})
_PROPERTY_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_broker_config_item(item: str) -> tuple[str, str]:
    """``"key=value"`` -> ``(key, value)``, or KafkaLocalError saying what is wrong with it."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise KafkaLocalError(f"broker setting {item!r} is not KEY=VALUE "
                              "(e.g. group.min.session.timeout.ms=1000)")
    return key, value.strip()


def validate_broker_config(config: dict[str, object] | None) -> dict[str, str]:
    """Checks broker properties given by a caller and returns them as strings: keys are Kafka
    property names (letters, digits, '.', '_', '-') that kafka_local does not set itself, and
    values are single lines (a line break would add properties of its own)."""
    result: dict[str, str] = {}
    for key, value in (config or {}).items():
        if not isinstance(key, str) or not _PROPERTY_KEY.fullmatch(key):
            raise KafkaLocalError(f"broker setting {key!r}: not a Kafka property name "
                                  "(letters, digits, '.', '_' and '-')")
        if key in RESERVED_PROPERTIES:
            raise KafkaLocalError(f"broker setting {key!r} is set by kafka_local from --port, "
                                  "--host and --nodes; it cannot be overridden")
        if value is None or isinstance(value, (dict, list, tuple, set)):
            raise KafkaLocalError(f"broker setting {key!r}: value {value!r} is not a string, "
                                  "number or bool")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if "\n" in text or "\r" in text:
            raise KafkaLocalError(f"broker setting {key!r}: the value must be one line")
        result[key] = text
    return result


def _cluster_id() -> str:
    """A Kafka cluster id: a random UUID, base64url without padding (22 characters), never
    starting with '-': the storage tool's argument parser would read such an id as an option
    ("argument --cluster-id/-t: expected one argument"; Kafka's own Uuid.randomUuid redraws
    those too)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _server_properties(node_id: int, port: int, controller_port: int, voters: str,
                       nodes: int, data_dir: Path, host: str = HOST,
                       extra: dict[str, str] | None = None) -> str:
    rf = min(3, nodes)
    props = {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": data_dir,
        "num.partitions": 1,
        "default.replication.factor": rf,
        "min.insync.replicas": 1,
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": 5,  # default 50: slow first group join on a laptop
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": 1 if nodes == 1 else 2,
        "transaction.state.log.num.partitions": 5,
        "group.initial.rebalance.delay.ms": 0,
        "num.network.threads": 2,
        "num.io.threads": 4,
        "num.recovery.threads.per.data.dir": 1,
        "log.retention.hours": 24,
        "log.segment.bytes": 64 * 1024 * 1024,
        "controlled.shutdown.enable": "true",
    }
    # a backslash starts an escape in a Java properties file: the caller's values are literal
    props.update({k: v.replace("\\", "\\\\") for k, v in (extra or {}).items()})
    return "".join(f"{k}={v}\n" for k, v in props.items())


# --------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------

def _pid_alive(pid: int) -> bool:
    # a recycled pid is not ours: it must still be a Kafka JVM
    return _lp.pid_alive(pid, b"kafka.Kafka", permission_means_alive=True)


def _read_state(port: int) -> dict | None:
    f = run_dir(port) / "state.json"
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def _pids(state: dict | None) -> list[int]:
    return [n["pid"] for n in (state or {}).get("nodes", []) if n.get("pid")]


def _alive_pids(port: int) -> list[int]:
    return [p for p in _pids(_read_state(port)) if _pid_alive(p)]


def _log_tail(path: Path, lines: int = 40) -> str:
    return _lp.log_tail(path, lines)


def _run_checked(cmd: list[str], what: str, log: Path) -> None:
    _lp.run_checked(cmd, what, log, KafkaLocalError)


def _jvm_command(java: str, rdir: Path) -> list[str]:
    """The java command line, up to the node's own arguments, of every node of a run."""
    return [java, *HEAP.split(), *JVM_OPTS.split(), "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{rdir / 'log4j.properties'}",
            f"-Dkafka.logs.dir={rdir}", "-cp", _classpath()]


def _start_node(jvm_common: list[str], rdir: Path, node_id: int) -> subprocess.Popen:
    """Starts node ``node_id`` of the run in ``rdir`` on its server properties and data,
    appending to its log."""
    with open(rdir / f"broker-{node_id}.log", "ab") as out:
        return subprocess.Popen(
            [*jvm_common, f"-Dkafka.node.id={node_id}", "kafka.Kafka",
             str(rdir / f"server-{node_id}.properties")],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, cwd=rdir)


def _terminate(pids: list[int], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, then SIGKILL to the pids that ignored it."""
    _lp.terminate(pids, [(signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)], _pid_alive, _log,
                  poll=0.1)


# --------------------------------------------------------------------------------------------
# readiness (Admin API)
# --------------------------------------------------------------------------------------------

def _quiet_logger() -> logging.Logger:
    """librdkafka otherwise prints 'Connect to ... failed' to stderr while the broker starts."""
    lg = logging.getLogger("kafka_local.librdkafka")
    if not lg.handlers:
        lg.addHandler(logging.NullHandler())
    lg.propagate = False
    return lg


def _admin(bootstrap: str):
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError as e:  # pragma: no cover - the project depends on confluent-kafka
        raise KafkaLocalError("confluent_kafka is needed for the readiness check; run this "
                              "script with the project's venv (.venv/bin/python)") from e
    return AdminClient({"bootstrap.servers": bootstrap, "logger": _quiet_logger(),
                        "socket.connection.setup.timeout.ms": 2000})


def _broker_ids(bootstrap: str, timeout: float = 3.0) -> set[int] | None:
    """Broker ids in the cluster metadata, or None when nothing answers as a Kafka broker."""
    first = bootstrap.split(",")[0]
    host, _, port = first.rpartition(":")
    if not port_in_use(int(port), host or HOST):
        return None
    try:
        md = _admin(bootstrap).list_topics(timeout=timeout)
    except Exception:
        return None
    return set(md.brokers)


def broker_ready(bootstrap: str, timeout: float = READY_TIMEOUT, expected_brokers: int = 1,
                 _procs: list[int] | None = None, _log_file: Path | None = None) -> bool:
    """True once the cluster at `bootstrap` answers through the Admin API: metadata shows at
    least `expected_brokers` brokers, describe_cluster names a controller, and a throw-away
    topic (replicated over all expected brokers) can be created. False after `timeout` s."""
    from confluent_kafka import KafkaException  # noqa: F401  (fail early if missing)
    from confluent_kafka.admin import NewTopic

    deadline = time.monotonic() + timeout
    probe = f"__jetwake_ready_{uuid.uuid4().hex[:8]}"
    admin = None
    while time.monotonic() < deadline:
        if _procs and not any(_pid_alive(p) for p in _procs):
            tail = _log_tail(_log_file) if _log_file else ""
            raise KafkaLocalError(f"the broker process exited during start-up; last log "
                                  f"lines:\n{tail}")
        try:
            ids = _broker_ids(bootstrap, timeout=2.0)
            if ids is None or len(ids) < expected_brokers:
                raise RuntimeError(f"brokers visible: {sorted(ids or [])}")
            admin = admin or _admin(bootstrap)
            cluster = admin.describe_cluster(request_timeout=5).result(timeout=6)
            if cluster.controller is None or len(cluster.nodes) < expected_brokers:
                raise RuntimeError("no controller / not all nodes yet")
            fut = admin.create_topics([NewTopic(probe, num_partitions=1,
                                                replication_factor=expected_brokers)],
                                      operation_timeout=10, request_timeout=15)[probe]
            try:
                fut.result(timeout=20)
            except Exception as e:  # a retry after a slow first attempt: fine if it exists
                if "TOPIC_ALREADY_EXISTS" not in str(e) and "already exists" not in str(e):
                    raise
            with contextlib.suppress(Exception):
                admin.delete_topics([probe], operation_timeout=10)[probe].result(timeout=15)
            return True
        except KafkaLocalError:
            raise
        except Exception:
            time.sleep(0.5)
    return False


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------

def broker_status(port: int) -> dict:
    state = _read_state(port)
    nodes = (state or {}).get("nodes_count", 1)
    bootstrap = (state or {}).get("bootstrap") or bootstrap_for(port)
    ids = _broker_ids(bootstrap)
    return {
        "port": port,
        "bootstrap": bootstrap,
        "answering": ids is not None,
        "brokers": sorted(ids or []),
        "ours": state is not None,
        "nodes": nodes,
        "pids": _pids(state),
        "alive_pids": _alive_pids(port),
        "run_dir": str(run_dir(port)),
        "kafka_version": (state or {}).get("kafka_version"),
        "broker_config": (state or {}).get("broker_config", {}),
    }


def _check_same_config(port: int, state: dict | None, wanted: dict[str, str]) -> None:
    """A broker already on `port` is reused only if it was started with the settings asked
    for now (one started elsewhere is assumed to have none)."""
    have = (state or {}).get("broker_config", {})
    if have != wanted:
        raise KafkaLocalError(f"the broker on port {port} runs with broker settings {have}, "
                              f"not {wanted}; stop it (`kafka_local.py down --port {port}`) "
                              "or choose another --port")


def start_broker(port: int | None = None, nodes: int = 1,
                 timeout: float = READY_TIMEOUT, host: str = HOST,
                 broker_config: dict[str, object] | None = None) -> str:
    """Start a KRaft broker (or an N-node cluster) on host:port.. (host: 127.0.0.1 unless
    given; a local address the clients can reach) and return the bootstrap string once it is
    ready. `broker_config` sets broker properties over the defaults (see
    validate_broker_config). Returns at once if a broker already answers on `port` (with
    `broker_config`, only if it was started with those same settings)."""
    port = default_port() if port is None else int(port)
    if nodes < 1:
        raise KafkaLocalError("--nodes must be >= 1")
    extra = validate_broker_config(broker_config)
    bootstrap = bootstrap_for(port, nodes, host)
    rdir = run_dir(port)
    with _file_lock(CACHE / "locks" / f"run-{port}.lock"):
        state = _read_state(port)
        alive = _alive_pids(port)
        ids = _broker_ids(bootstrap_for(port, 1, host))
        if ids is not None:
            if extra:
                _check_same_config(port, state if alive else None, extra)
            existing = (state or {}).get("bootstrap") or bootstrap_for(port, max(len(ids), 1),
                                                                       host)
            _log(f"a Kafka broker is already running on {host}:{port} "
                 f"(brokers {sorted(ids)}{', started by kafka_local' if alive else ''})")
            return existing
        if alive:  # ours, still starting (another `up` racing us) -> just wait for it
            if extra:
                _check_same_config(port, state, extra)
            _log(f"broker processes {alive} for port {port} exist; waiting for them")
            if broker_ready(state["bootstrap"], timeout, state.get("nodes_count", 1), alive,
                            rdir / "broker-1.log"):
                return state["bootstrap"]
            raise KafkaLocalError(f"broker processes {alive} on port {port} are not answering; "
                                  f"run `kafka_local.py down --port {port}`")
        for p in range(port, port + nodes):
            if port_in_use(p, host) or not _can_bind(p, host):
                raise KafkaLocalError(f"port {host}:{p} is taken by something that is not a "
                                      "Kafka broker; choose another with --port / KAFKA_PORT")

        ensure_jars()
        java = _java()
        if rdir.exists():  # stale run from a crashed/killed broker: data is disposable
            shutil.rmtree(rdir)
        rdir.mkdir(parents=True)
        log4j = rdir / "log4j.properties"
        log4j.write_text(LOG4J_PROPERTIES)
        jvm_common = _jvm_command(java, rdir)

        broker_ports = set(range(port, port + nodes))
        controller_ports: list[int] = []
        for _ in range(nodes):
            controller_ports.append(free_port(avoid=broker_ports | set(controller_ports)))
        voters = ",".join(f"{i + 1}@{HOST}:{cp}" for i, cp in enumerate(controller_ports))
        cluster_id = _cluster_id()
        t0 = time.monotonic()
        node_state: list[dict] = []
        state = {"port": port, "nodes_count": nodes, "bootstrap": bootstrap,
                 "cluster_id": cluster_id, "kafka_version": kafka_version(),
                 "broker_config": extra, "nodes": node_state}

        def save_state() -> None:
            (rdir / "state.json").write_text(json.dumps(state, indent=2) + "\n")
            (rdir / "kafka.pid").write_text("".join(f"{n['pid']}\n" for n in node_state))

        try:
            for i in range(nodes):
                node_id = i + 1
                props = rdir / f"server-{node_id}.properties"
                props.write_text(_server_properties(node_id, port + i, controller_ports[i],
                                                    voters, nodes, rdir / f"data-{node_id}",
                                                    host, extra))
                _run_checked([*jvm_common, "kafka.tools.StorageTool", "format", "-t",
                              cluster_id, "-c", str(props), "--ignore-formatted"],
                             f"formatting storage for node {node_id}",
                             rdir / f"format-{node_id}.log")
            for i in range(nodes):
                node_id = i + 1
                proc = _start_node(jvm_common, rdir, node_id)
                node_state.append({"node_id": node_id, "pid": proc.pid, "port": port + i,
                                   "controller_port": controller_ports[i],
                                   "log": str(rdir / f"broker-{node_id}.log")})
                save_state()
            pids = [n["pid"] for n in node_state]
            settings = "".join(f", {k}={v}" for k, v in extra.items())
            _log(f"started Kafka {kafka_version()} ({nodes} node{'s' * (nodes > 1)}, "
                 f"pids {pids}{settings}); waiting for {bootstrap} ...")
            if not broker_ready(bootstrap, timeout, nodes, pids, rdir / "broker-1.log"):
                raise KafkaLocalError(
                    f"Kafka on {bootstrap} was not ready within {timeout:.0f}s; last lines of "
                    f"{rdir / 'broker-1.log'}:\n{_log_tail(rdir / 'broker-1.log')}")
        except BaseException:
            _terminate(_pids(state), timeout=5)
            raise
        _log(f"Kafka ready on {bootstrap} after {time.monotonic() - t0:.1f}s "
             f"(logs in {rdir})")
        return bootstrap


def node_pid(port: int, node_id: int) -> int | None:
    """The pid of node ``node_id`` (1-based) of what start_broker started on ``port``, None
    when its process is not running: for tests and benchmarks that kill or pause one node."""
    for n in (_read_state(port) or {}).get("nodes", []):
        if n.get("node_id") == node_id and n.get("pid") and _pid_alive(n["pid"]):
            return int(n["pid"])
    return None


def restart_node(port: int, node_id: int) -> int:
    """Starts node ``node_id`` of the cluster on ``port`` again, on its data and settings,
    after its process was killed or stopped (start_broker starts and stops only the whole
    cluster); records its new pid, so that stop_broker stops it too. Returns the pid; does not
    wait for the node to serve."""
    rdir = run_dir(port)
    with _file_lock(CACHE / "locks" / f"run-{port}.lock"):
        state = _read_state(port)
        nodes = {n["node_id"]: n for n in (state or {}).get("nodes", [])}
        if node_id not in nodes:
            raise KafkaLocalError(f"no node {node_id} of a kafka_local run on port {port}")
        if _pid_alive(nodes[node_id]["pid"]):
            raise KafkaLocalError(f"node {node_id} on port {port} is still running "
                                  f"(pid {nodes[node_id]['pid']})")
        proc = _start_node(_jvm_command(_java(), rdir), rdir, node_id)
        nodes[node_id]["pid"] = proc.pid
        (rdir / "state.json").write_text(json.dumps(state, indent=2) + "\n")
        (rdir / "kafka.pid").write_text("".join(f"{n['pid']}\n" for n in state["nodes"]))
        _log(f"restarted node {node_id} on port {port} (pid {proc.pid})")
        return proc.pid


def stop_broker(port: int | None = None, timeout: float = STOP_TIMEOUT) -> bool:
    """Stop the broker process(es) `start_broker` started on `port` and delete the run
    directory. Returns False when there was nothing of ours to stop."""
    port = default_port() if port is None else int(port)
    rdir = run_dir(port)
    with _file_lock(CACHE / "locks" / f"run-{port}.lock"):
        state = _read_state(port)
        pids = [p for p in _pids(state) if _pid_alive(p)]
        if pids:
            _log(f"stopping Kafka on port {port} (pids {pids}) ...")
            _terminate(pids, timeout)
        if rdir.exists():
            shutil.rmtree(rdir, ignore_errors=True)
        if state is None and port_in_use(port):
            _log(f"something answers on {HOST}:{port} but it was not started by kafka_local; "
                 "left alone")
        return bool(pids)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def _config_arg(item: str) -> tuple[str, str]:
    try:
        key, value = parse_broker_config_item(item)
        validate_broker_config({key: value})
    except KafkaLocalError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return key, value


def _config_dict(items: list[tuple[str, str]], ap: argparse.ArgumentParser) -> dict[str, str]:
    config: dict[str, str] = {}
    for key, value in items:
        if key in config and config[key] != value:
            ap.error(f"argument --broker-config: {key} is given twice ({config[key]!r} and "
                     f"{value!r})")
        config[key] = value
    return config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name in ("up", "down", "status"):
        p = parsers[name] = sub.add_parser(name)
        p.add_argument("--port", type=int, default=None,
                       help=f"client port (default $KAFKA_PORT, else {DEFAULT_PORT})")
        if name == "up":
            p.add_argument("--nodes", type=int, default=1, help="1 (default) or 3")
            p.add_argument("--host", default=HOST,
                           help=f"address the client listener listens on and advertises "
                                f"(default {HOST})")
            p.add_argument("--timeout", type=float, default=READY_TIMEOUT)
            p.add_argument("--broker-config", action="append", default=[], type=_config_arg,
                           metavar="KEY=VALUE",
                           help="a broker property over the defaults, e.g. "
                                "group.min.session.timeout.ms=1000 (repeatable)")
    args = ap.parse_args(argv)
    port = default_port() if args.port is None else args.port
    try:
        if args.cmd == "up":
            bootstrap = start_broker(port, args.nodes, args.timeout, args.host,
                                     _config_dict(args.broker_config, parsers["up"]))
            print(bootstrap)
        elif args.cmd == "down":
            if not stop_broker(port):
                _log(f"no broker started by kafka_local is running on port {port}")
        else:
            st = broker_status(port)
            if st["answering"]:
                settings = "".join(f" {k}={v}" for k, v in st["broker_config"].items())
                print(f"running: {st['bootstrap']} brokers={st['brokers']} "
                      f"pids={st['alive_pids'] or '(not ours)'} version={st['kafka_version']}"
                      f"{settings}")
            elif st["alive_pids"]:
                print(f"starting or unhealthy: pids={st['alive_pids']} (see {st['run_dir']})")
            else:
                print(f"not running on port {port}")
                return 1
    except KafkaLocalError as e:
        _log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
