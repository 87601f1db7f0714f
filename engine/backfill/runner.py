"""SparkRunner: runs a jetwake Pipeline on Spark (a backfill), and hands off to a streaming job.

    runner = SparkRunner(master="local[*]")
    result = runner.run(pipeline, until="latest", export_snapshot="after-backfill",
                        member=member)
    member.new_job(pipeline, JobConfig(initial_snapshot_name="after-backfill"))

The pipeline's stages become Spark operations (``translate.py``); Kafka sources are read
from their start up to ``until``; with ``export_snapshot`` the state a streaming job would hold
at that point is written as a jetwake snapshot (``handoff.py``). See docs/backfill.md.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.pipeline.pipeline import Pipeline
from jetwake.engine.pipeline.transforms import SideSinkTransform
from jetwake.engine.backfill.handoff import check_snapshot_name, write_snapshot
from jetwake.engine.backfill.until import parse_until
from jetwake.engine.backfill.task_failures import BackfillTaskError, spark_task_failure
from jetwake.engine.backfill.translate import (
    Translator, check_pipeline, read_source_bounds, release_source_bounds,
)

__all__ = ["SparkRunner", "BackfillResult", "BackfillTaskError", "SparkMasterError",
           "EVERY_WINDOW_CLOSED", "LOCAL_DRIVER_JAVA_OPTIONS"]


#: ``BackfillResult.watermark`` of a run whose windows all closed: the end of a bounded input
EVERY_WINDOW_CLOSED = sys.maxsize - 1

#: the driver JVM's options on a local master, unless ``conf`` sets its own: the pipeline's
#: work runs in the Python workers, and the JVM's optimizing compiler only took cores from them
LOCAL_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


class SparkMasterError(JetwakeError):
    """The Spark master does not answer, or a session cannot be created."""


@dataclass
class BackfillResult:
    """What a backfill did.

    ``offsets``: ``{topic: {partition: next offset}}`` where each Kafka source stopped.
    ``watermark``: the event time up to which windows were closed (None without windows;
    :data:`EVERY_WINDOW_CLOSED` when no Kafka source bounds them: a bounded input's end closes
    every window).
    ``counters``: ``{"stages": {stage: {"items_in": n, "items_out": n}}, "late_events": n,
    "dead_letters": n, "records_in": n, "bad_timestamps": n}``: ``records_in`` the Kafka
    records read (dead letters included), ``bad_timestamps`` the items whose timestamp could
    not be read (sent to ``bad_events_to``); ``calls``, ``call_retries``, ``call_failures``
    those of the ``map_using_service`` stages.
    ``snapshot``: the name of the exported snapshot, or None.
    """

    offsets: dict = field(default_factory=dict)
    watermark: int | None = None
    counters: dict = field(default_factory=dict)
    snapshot: str | None = None
    seconds: float = 0.0


_LOCAL = re.compile(r"local(?:\[(?P<threads>[0-9]+|\*)(?:\s*,\s*[0-9]+)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*,"
                            r"\s*[1-9][0-9]*\s*\]")
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}")
_K8S = re.compile(r"k8s://(?:https?://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::[0-9]{1,5})?/?")
_MASTER_FORMS = ("local, local[N], local[*], local[N,F] (F: attempts per task), "
                 "spark://HOST:PORT[,HOST:PORT...], yarn or k8s://[https://]HOST[:PORT]")


def _check_master(master: Any) -> str:
    """``master`` when it is a master URL Spark accepts; otherwise a ValueError that says
    which forms there are (Spark itself fails in its JVM, with a Java stack trace)."""
    if not isinstance(master, str) or not master:
        raise ValueError(f"SparkRunner(master=...) must be a Spark master URL such as "
                         f"'local[*]' or 'spark://host:7077', got {master!r}")
    m = _LOCAL.fullmatch(master)
    if m is not None:
        if m.group("threads") is not None and m.group("threads") != "*" \
                and int(m.group("threads")) == 0:
            raise ValueError(f"master {master!r}: a local master runs at least 1 thread: "
                             "local[1], local[2] or local[*]")
        return master
    if _LOCAL_CLUSTER.fullmatch(master) or _K8S.fullmatch(master):
        return master
    if master.startswith("spark://"):
        parts = master[len("spark://"):].split(",")
        bad = [p for p in parts if not _HOST_PORT.fullmatch(p)]
        if bad:
            raise ValueError(f"master {master!r}: a standalone master is spark://HOST:PORT "
                             f"(several: spark://HOST1:PORT1,HOST2:PORT2), and {bad[0]!r} is "
                             "not HOST:PORT")
        return master
    if master == "yarn":
        if not (os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")):
            raise ValueError("master 'yarn' needs HADOOP_CONF_DIR or YARN_CONF_DIR set to the "
                             "directory of the cluster's Hadoop configuration (core-site.xml, "
                             "yarn-site.xml)")
        return master
    if master.startswith("k8s://"):
        raise ValueError(f"master {master!r}: a Kubernetes master is k8s://https://HOST:PORT "
                         "(or k8s://HOST:PORT)")
    if master.startswith("sc://"):
        raise ValueError(f"{master!r} is a Spark Connect address, not a master URL: the "
                         "backfill needs a SparkContext (RDDs), which Spark Connect does not "
                         "provide")
    raise ValueError(f"master {master!r} is not a Spark master URL: use {_MASTER_FORMS}")


def _master_reachable(master: str, timeout: float = 3.0) -> None:
    """Fails fast when a standalone master's port does not answer (Spark itself would retry
    for minutes before giving up)."""
    if not master.startswith("spark://"):
        return
    for hostport in master[len("spark://"):].split(","):
        u = urlparse(f"//{hostport}")
        host, port = u.hostname or "localhost", u.port
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as e:
            last = e
    raise SparkMasterError(f"the Spark master {master} does not answer ({last}); start it, or "
                           "check --master (local[*] runs Spark inside this process)")


def _package_zip() -> str:
    """jetwake's code as a zip for the workers of a remote cluster (``addPyFile``): the
    package's folder, which holds the code folders (as links in a working tree)."""
    import importlib.util
    # found without importing: the public API imports the server layer, above this one
    spec = importlib.util.find_spec("jetwake")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("cannot find the installed package jetwake")
    root = list(spec.submodule_search_locations)[0]
    path = os.path.join(tempfile.mkdtemp(prefix="jetwake-spark-"), "jetwake.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for d, dirs, files in os.walk(root, followlinks=True):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    arc = os.path.join("jetwake", os.path.relpath(os.path.join(d, f), root))
                    z.write(os.path.join(d, f), arc)
    return path


class SparkRunner:
    """Runs pipelines on Spark: ``master`` a Spark master URL ("local[*]", "local[2]",
    "spark://host:7077"), ``conf`` extra Spark settings, or ``spark`` an existing
    SparkSession (then ``master`` and ``conf`` are not used)."""

    def __init__(self, master: str = "local[*]", conf: dict | None = None,
                 spark: Any = None) -> None:
        self.master = _check_master(master)
        if conf is not None and (not isinstance(conf, dict) or not all(
                isinstance(k, str) for k in conf)):
            raise TypeError(f"SparkRunner(conf=...) must be a dict of Spark settings, got "
                            f"{conf!r}")
        self.conf = dict(conf or {})
        self._spark = spark
        self._own_session = False
        self._shipped = False
        self.startup_seconds = 0.0

    # --- the session -------------------------------------------------------------------------

    @property
    def spark(self) -> Any:
        """The SparkSession, created on first use."""
        if self._spark is None:
            _master_reachable(self.master)
            try:
                from pyspark.sql import SparkSession
            except ImportError as e:
                raise ImportError(f"SparkRunner needs pyspark, which is not installed here "
                                  f"({e}): pip install 'jetwake[spark]'") from None

            started = time.perf_counter()
            # the workers run this interpreter (the same virtual environment on this host);
            # Spark reads the variable when the context starts
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            builder = SparkSession.builder.master(self.master).appName("jetwake-backfill")
            settings = {
                # the workers run this interpreter (the same virtual environment on this host)
                "spark.pyspark.python": sys.executable,
                "spark.pyspark.driver.python": sys.executable,
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.execution.arrow.pyspark.enabled": "true",
                "spark.python.worker.reuse": "true",
            }
            if self.master.startswith("local"):
                # Spark in this process's JVM: the pipeline's work runs in the Python workers,
                # and the JVM's optimizing compiler only competes with them for the cores
                # (0.4 CPU-s of 1.2 s per word-count run on 2 cores; with the quick compiler
                # alone 0.17, docs/performance.md)
                settings["spark.driver.extraJavaOptions"] = LOCAL_DRIVER_JAVA_OPTIONS
            settings.update(self.conf)
            for k, v in settings.items():
                builder = builder.config(k, str(v))
            try:
                self._spark = builder.getOrCreate()
            except Exception as e:
                raise SparkMasterError(f"cannot start a Spark session on {self.master}: "
                                       f"{e}") from e
            self._own_session = True
            self.startup_seconds = time.perf_counter() - started
        return self._spark

    def _prepare_workers(self, sc: Any) -> None:
        """Lets the workers import what the driver imports: its ``sys.path`` (the user's
        modules, for functions pickled by reference) and, on a remote cluster, jetwake's code."""
        path = os.pathsep.join(p for p in sys.path if p)
        sc.environment["PYTHONPATH"] = path
        if not self._shipped and not sc.master.startswith("local"):
            sc.addPyFile(_package_zip())
            self._shipped = True

    def stop(self) -> None:
        """Stops the session this runner created (not one it was given)."""
        if self._own_session and self._spark is not None:
            self._spark.stop()
            self._spark = None
            self._own_session = False

    def __enter__(self) -> "SparkRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- running -----------------------------------------------------------------------------

    def run(self, pipeline: Pipeline, until: Any = "latest", export_snapshot: str | None = None,
            member: Any = None) -> BackfillResult:
        """Runs ``pipeline`` on Spark and returns a :class:`BackfillResult`.

        ``until``: where Kafka sources stop: "latest" (the end offsets at the start of the
        run), a timestamp in ms, ``{topic: {partition: offset}}`` or a JSON file of those.
        ``export_snapshot``: write the state a streaming job would hold at that point as a
        snapshot of that name on ``member`` (a Member), for
        ``JobConfig(initial_snapshot_name=...)``. ``member``: the Member (or Client) whose maps
        and lists the pipeline reads and writes.
        """
        check_pipeline(pipeline, member)
        until = parse_until(until)
        if export_snapshot is not None:
            check_snapshot_name(member, export_snapshot)
        bounds = read_source_bounds(pipeline, until)
        try:
            return self._run(pipeline, bounds, export_snapshot, member)
        finally:
            release_source_bounds(pipeline, bounds)

    def _run(self, pipeline: Pipeline, bounds: dict[int, Any], export_snapshot: str | None,
             member: Any) -> BackfillResult:
        spark = self.spark  # a master that does not answer, or no pyspark, fails here
        from pyspark.accumulators import AccumulatorParam

        class _Sums(AccumulatorParam):
            def zero(self, value: dict) -> dict:
                return {}

            def addInPlace(self, a: dict, b: dict) -> dict:
                for k, n in b.items():
                    a[k] = a.get(k, 0) + n
                return a

        sc = spark.sparkContext
        self._prepare_workers(sc)
        started = time.perf_counter()
        counters = sc.accumulator({}, _Sums())
        tr = Translator(sc, pipeline, member, bounds, export_snapshot is not None, counters,
                        sc.defaultParallelism)
        try:
            tr.build()
            tr.run_sinks()
            snapshot = None
            if export_snapshot is not None:
                def entries():
                    yield from tr.driver_state
                    for rdd in tr.state_rdds:
                        yield from rdd.toLocalIterator()
                write_snapshot(member, export_snapshot, f"backfill of {pipeline!r}"[:200],
                               entries())
                snapshot = export_snapshot
        except Exception as e:
            failure = spark_task_failure(e)
            if failure is None:
                raise
            raise failure from None  # the JVM's pages of frames say nothing of the pipeline
        sums = dict(counters.value)
        stages: dict = {}
        for t in pipeline.transforms:
            out = sums.get(f"out:{t.name}", tr.sink_counts.get(t.name, 0))
            if isinstance(t, SideSinkTransform):  # fed with its owner's late or bad events
                ins = out
            else:
                ins = sum(sums.get(f"out:{u.name}", 0) for u in t.upstream)
            stages[t.name] = {"items_in": ins, "items_out": out}
        counters_out = {"stages": stages}
        for k in ("late_events", "dead_letters", "records_in", "bad_timestamps", "calls",
                  "call_retries", "call_failures"):
            counters_out[k] = sums.get(k, 0)
        watermark = None
        if tr.window_stages:
            watermark = min(tr.cuts) if tr.cuts else EVERY_WINDOW_CLOSED
        return BackfillResult(offsets=tr.offsets, watermark=watermark, counters=counters_out,
                              snapshot=snapshot, seconds=time.perf_counter() - started)

