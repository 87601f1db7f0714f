"""``jetwake backfill FILE.py``: runs a pipeline file on Spark (docs/backfill.md).

    jetwake backfill FILE.py [--master URL] [--until latest|TIMESTAMP_MS|offsets.json]
        [--export-snapshot NAME [--data-dir DIR]] [--conf key=value ...]
        [--spark-log-level LEVEL] [--json] [-- ARGS...]

The pipeline is built here, as for ``submit``, and run by a SparkRunner in this process. A
pipeline that reads or writes a member's maps and lists reaches the member at ``--address``.
``--export-snapshot`` writes the hand-off snapshot on the member that will run the streaming
job, through its service at ``--address`` (a ``write_snapshot`` request), or, with
``--data-dir``, straight into that member's data directory on this host; ``JobConfig(
initial_snapshot_name=NAME)`` / ``jetwake submit --from-snapshot NAME`` finds it there.

Spark's JVM logs at ``--spark-log-level`` (FATAL by default): a failing task shows the worker's
Python traceback and one error line, not the executor's pages of log and Java frames.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from jetwake.engine.server.cli.errors import EXIT_UNREACHABLE, EXIT_USAGE, CliError
from jetwake.engine.server.cli.pipeline_files import load_pipeline

__all__ = ["add_backfill_parser", "cmd_backfill", "SPARK_LOG_LEVELS"]

#: the levels of Spark's JVM logging (log4j), quietest first
SPARK_LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")

_LOG4J2_CONFIG = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
logger.spark.name = org.apache.spark
logger.spark.level = {level}
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


def add_backfill_parser(sub: Any, formatter: Any,
                        common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the ``backfill`` command to the ``jetwake`` parser (``common``: the connection
    options, for a pipeline that uses a member's maps and lists)."""
    p = sub.add_parser(
        "backfill", help="run the pipeline of FILE.py on Spark (a backfill)",
        description="Run the pipeline of FILE.py on Spark: Kafka sources read from their start "
                    "up to --until; with --export-snapshot the state a streaming job would hold "
                    "there is written as a snapshot it can start from. FILE.py defines a "
                    "module-level `pipeline` (a Pipeline) or a function `pipeline(args)` that "
                    "returns one; ARGS after `--` are passed to it.",
        epilog="examples:\n"
               "  jetwake backfill examples/clicks.py --master local[*] --until latest \\\n"
               "      --export-snapshot clicks-backfill --address 127.0.0.1:5701 \\\n"
               "      -- 127.0.0.1:9092 clicks\n"
               "  jetwake backfill examples/clicks.py --export-snapshot clicks-backfill \\\n"
               "      --data-dir ./data -- 127.0.0.1:9092 clicks",
        formatter_class=formatter, parents=[common])
    p.usage = ("jetwake backfill [-h] [--master URL] [--until latest|MS|FILE] "
               "[--export-snapshot NAME] [--data-dir DIR] [--conf KEY=VALUE] "
               "[--spark-log-level LEVEL] [--json] FILE.py [-- ARGS...]")
    p.add_argument("file", metavar="FILE.py", help="defines `pipeline` or `pipeline(args)`")
    p.add_argument("--master", default="local[*]", metavar="URL",
                   help="a Spark master URL: local[*], local[2], spark://host:7077 "
                        "(default: local[*])")
    p.add_argument("--until", default="latest", metavar="latest|MS|FILE",
                   help="where Kafka sources stop: latest (their end offsets now), a timestamp "
                        "in ms, or a JSON file of {topic: {partition: offset}}")
    p.add_argument("--export-snapshot", metavar="NAME",
                   help="write the hand-off snapshot under this name on the member at "
                        "--address (or into --data-dir)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="write the snapshot into this data directory of the member that will "
                        "run the streaming job, on this host, instead of through --address")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting (repeatable), e.g. --conf spark.executor.memory=4g")
    p.add_argument("--spark-log-level", type=str.upper, choices=SPARK_LOG_LEVELS,
                   default="FATAL", metavar="LEVEL",
                   help="what Spark's JVM logs on stderr: " + ", ".join(SPARK_LOG_LEVELS)
                        + " (default: FATAL: a failing task shows the worker's Python "
                        "traceback, not the executor's ERROR logs; WARN or INFO to debug Spark)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_backfill)
    return p


class _StoreHolder:
    """The part of a member a hand-off snapshot needs: its snapshot store, opened on the data
    directory of a member on this host (the member reads exports from disk when a job asks)."""

    def __init__(self, data_dir: str) -> None:
        from jetwake.snapshot.store.snapshot_store import SnapshotStore
        self.snapshot_store = SnapshotStore(data_dir)


class _MemberAndStore:
    """A Client for maps and lists, with the snapshot store of the member's data directory."""

    def __init__(self, client: Any, data_dir: str | None) -> None:
        self._client = client
        if data_dir is not None:
            self.snapshot_store = _StoreHolder(data_dir).snapshot_store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _conf(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise CliError(f"--conf {pair!r}: expected KEY=VALUE, e.g. "
                           "spark.executor.memory=4g", EXIT_USAGE)
        out[key.strip()] = value
    return out


def _until(text: str) -> Any:
    from jetwake.engine.backfill.until import parse_until
    try:
        return parse_until(text)
    except ValueError as e:
        raise CliError(f"bad --until value: {e}", EXIT_USAGE) from None


def _quiet_spark(conf: dict, master: str, level: str, config_dir: str) -> dict:
    """``conf`` with Spark's JVM logging at ``level`` from its start: ``spark.log.level``, and a
    log4j2 configuration (in ``config_dir``) that also leaves out the start-up lines, unless
    the user's ``conf`` sets these options. The runner's own driver option for a local master
    stays, as the user's ``spark.driver.extraJavaOptions`` would replace it."""
    out = dict(conf)
    out.setdefault("spark.log.level", level)
    if "spark.driver.extraJavaOptions" not in out:
        path = Path(config_dir) / "log4j2.properties"
        path.write_text(_LOG4J2_CONFIG.format(level=level.lower()), encoding="utf-8")
        options = f"-Dlog4j2.configurationFile={path.as_uri()}"
        if master.startswith("local"):
            from jetwake.engine.backfill.runner import LOCAL_DRIVER_JAVA_OPTIONS
            options = f"{LOCAL_DRIVER_JAVA_OPTIONS} {options}"
        out["spark.driver.extraJavaOptions"] = options
    return out


def _needs_member(pipeline: Any) -> bool:
    """Whether a source or sink of ``pipeline`` reads or writes a member's maps and lists
    (its Spark reader or writer says so)."""
    for t in getattr(pipeline, "transforms", []):
        connector = getattr(t, "source", None) or getattr(t, "sink", None)
        if getattr(getattr(connector, "spark", None), "needs_member", False):
            return True
    return False


def _client(args: argparse.Namespace, for_snapshot: bool) -> Any:
    """A client of the member at ``--address``; when it is there for the snapshot, a member
    that does not answer fails naming the other way to hand off."""
    from jetwake.engine.server.cli.connection import connect
    from jetwake.engine.server.client import MemberUnreachableError
    try:
        return connect(args)
    except MemberUnreachableError as e:
        if not for_snapshot:
            raise
        raise CliError(f"--export-snapshot writes the snapshot on the member that will run the "
                       f"streaming job, and no member answers at --address (start it, pass its "
                       f"--address, or write into its data directory on this host with "
                       f"--data-dir DIR): {e}", EXIT_UNREACHABLE) from None


def _runner(master: str, conf: dict) -> Any:
    from jetwake.engine.backfill import SparkRunner
    try:
        return SparkRunner(master=master, conf=conf)
    except ValueError as e:
        raise CliError(f"bad --master value: {e}", EXIT_USAGE) from None


def _load(path: str, job_args: list[str]) -> tuple[Any, Any]:
    """FILE.py's Pipeline, and the module it was loaded as (None if it is not found)."""
    from jetwake.engine.pipeline.pipeline import Pipeline
    pipeline = load_pipeline(path, job_args)
    if not isinstance(pipeline, Pipeline):
        raise CliError(f"{path}: a backfill runs a Pipeline, not a "
                       f"{type(pipeline).__name__}", EXIT_USAGE)
    full = os.path.abspath(path)
    module = next((m for m in list(sys.modules.values())
                   if getattr(m, "__file__", None) == full), None)
    return pipeline, module


def _member(args: argparse.Namespace, pipeline: Any) -> Any:
    """What the runner gets as ``member``: a client of the member at ``--address`` and/or the
    snapshot store of ``--data-dir``, or None when the pipeline needs neither."""
    through_service = args.export_snapshot is not None and args.data_dir is None
    if _needs_member(pipeline) or through_service:
        member = _client(args, through_service)
        if args.data_dir is not None:
            member = _MemberAndStore(member, args.data_dir)
        return member
    if args.data_dir is not None:
        return _StoreHolder(args.data_dir)
    return None


def cmd_backfill(args: argparse.Namespace) -> int:
    """Runs ``jetwake backfill``: checks the options, loads FILE.py, runs it on Spark and
    prints the result."""
    from jetwake.engine.backfill import BackfillTaskError

    conf = _conf(args.conf)
    until = _until(args.until)
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise CliError(f"--data-dir {args.data_dir}: no such directory", EXIT_USAGE)
    config_dir = tempfile.mkdtemp(prefix="jetwake-backfill-")
    try:
        runner = _runner(args.master, _quiet_spark(conf, args.master, args.spark_log_level,
                                                   config_dir))
        pipeline, module = _load(args.file, getattr(args, "job_args", []))
        member = _member(args, pipeline)
        try:
            if module is not None:  # the file's functions travel by value to the Spark workers
                from pyspark import cloudpickle as spark_cloudpickle
                spark_cloudpickle.register_pickle_by_value(module)
            result = runner.run(pipeline, until=until, export_snapshot=args.export_snapshot,
                                member=member)
        except ImportError as e:  # pyspark missing: one line, not a traceback
            raise CliError(str(e)) from None
        except BackfillTaskError as e:  # the user's function raised: where, then the one line
            sys.stderr.write(e.worker_traceback + "\n")
            raise
        finally:
            runner.stop()
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)
    doc = {"offsets": {t: {str(p): o for p, o in ps.items()}
                       for t, ps in result.offsets.items()},
           "watermark": result.watermark, "counters": result.counters,
           "snapshot": result.snapshot, "seconds": round(result.seconds, 3)}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"backfill done in {result.seconds:.1f} s on {args.master}")
    for name, c in result.counters["stages"].items():
        print(f"  {name}: {c['items_in']} in, {c['items_out']} out")
    for topic, parts in sorted(result.offsets.items()):
        print(f"  {topic}: stopped at " + ", ".join(f"{p}:{o}" for p, o in sorted(parts.items())))
    from jetwake.engine.backfill.runner import EVERY_WINDOW_CLOSED
    if result.watermark is not None and result.watermark >= EVERY_WINDOW_CLOSED:
        print("  every window closed (the input is bounded)")
    elif result.watermark is not None:
        print(f"  windows closed up to {result.watermark}")
    if result.snapshot:
        print(f"  snapshot {result.snapshot!r} written: start the streaming job with "
              f"JobConfig(initial_snapshot_name={result.snapshot!r})")
    return 0
