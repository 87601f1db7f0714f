"""The ``jetwake`` command line: run a member, and submit and manage jobs on it (after Jet's).

Exit codes: 0 success; 1 the operation failed (unknown job or snapshot, wrong state, bad
FILE.py, job failed, timeout); 2 usage error; 3 no member reachable; 4 wrong or missing token;
130 interrupted.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
from datetime import datetime
from typing import Any, Callable, Sequence

__all__ = ["main", "build_parser", "load_pipeline", "PipelineFileError"]

DEFAULT_ADDRESS = "127.0.0.1:5701"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_AUTH, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
_TERMINAL = ("FAILED", "COMPLETED")


class CliError(Exception):
    """One clear message for stderr, and the exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


class PipelineFileError(CliError):
    """FILE.py is missing, defines no pipeline or raised while building it."""

    def __init__(self, message: str, traceback_text: str | None = None) -> None:
        super().__init__(message)
        self.traceback_text = traceback_text


# --- FILE.py -----------------------------------------------------------------------------------


def _user_traceback(e: BaseException) -> str:
    tb = e.__traceback__
    here = os.path.abspath(__file__)
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        if os.path.abspath(fn) == here or fn.startswith("<frozen"):
            tb = tb.tb_next
        else:
            break
    return "".join(traceback.format_exception(type(e), e, tb))


def load_pipeline(path: str, args: Sequence[str] = ()) -> Any:
    """Runs FILE.py and returns its pipeline: the module-level ``pipeline`` (a Pipeline or a
    DAG) or what its function ``pipeline(args)`` returns. The module is registered with
    cloudpickle to travel by value, so the member does not need the file."""
    import cloudpickle

    from jetwake.engine.core.dag import DAG
    from jetwake.engine.pipeline.pipeline import Pipeline

    if not os.path.exists(path):
        raise PipelineFileError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise PipelineFileError(f"{path}: not a file")
    full = os.path.abspath(path)
    stem = "".join(ch if ch.isalnum() else "_" for ch in os.path.splitext(os.path.basename(
        path))[0])
    mod_name = f"jetwake_job_{stem}_{hashlib.sha1(full.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(mod_name, full)
    if spec is None or spec.loader is None:
        raise PipelineFileError(f"{path}: cannot be loaded as a Python module (is it a .py "
                                "file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(full))
    try:
        try:
            spec.loader.exec_module(module)
        except SystemExit as e:
            raise PipelineFileError(f"{path} called exit({e.code}) while being loaded") from None
        except BaseException as e:  # noqa: BLE001 - the user's code
            if isinstance(e, KeyboardInterrupt):
                raise
            raise PipelineFileError(f"{path} raised {type(e).__name__} while building the "
                                    f"pipeline: {e}", _user_traceback(e)) from None
        if not hasattr(module, "pipeline"):
            raise PipelineFileError(
                f"{path} does not define `pipeline`: define a module-level `pipeline = "
                "Pipeline()` or a function `def pipeline(args): ... return p`")
        obj = module.pipeline
        if not isinstance(obj, (Pipeline, DAG)):
            if not callable(obj):
                raise PipelineFileError(
                    f"{path}: `pipeline` is a {type(obj).__qualname__}, not a Pipeline or a "
                    "function `pipeline(args)` that returns one")
            try:
                obj = obj(list(args))
            except BaseException as e:  # noqa: BLE001 - the user's code
                if isinstance(e, KeyboardInterrupt):
                    raise
                raise PipelineFileError(f"{path}: pipeline(args) raised {type(e).__name__}: "
                                        f"{e}", _user_traceback(e)) from None
            if not isinstance(obj, (Pipeline, DAG)):
                raise PipelineFileError(f"{path}: pipeline(args) returned a "
                                        f"{type(obj).__qualname__}, not a Pipeline")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    cloudpickle.register_pickle_by_value(module)
    return obj


# --- output ------------------------------------------------------------------------------------


def _time(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _size(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _duration(s: float) -> str:
    s = int(s)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{d}d"] if d else []
    if d or h:
        parts.append(f"{h}h")
    if d or h or m:
        parts.append(f"{m}m")
    parts.append(f"{s}s")
    return "".join(parts)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def _snapshot_json(d: dict | None) -> dict | None:
    if d is None:
        return None
    return {"name": d.get("name"), "job_id": d.get("job_id"), "job_name": d.get("job_name"),
            "snapshot_id": d.get("snapshot_id"),
            "created": datetime.fromtimestamp(d["created"]).isoformat(timespec="seconds"),
            "created_time": d.get("created"), "duration_ms": round(d.get("duration_ms", 0), 3),
            "entry_count": d.get("entry_count"), "size_bytes": d.get("size_bytes"),
            "terminal": d.get("terminal")}


def job_json(info: dict) -> dict:
    """The JSON form of a job (``status --json``, ``list-jobs --json``)."""
    cfg = info.get("config") or {}
    return {"id": info["id"], "name": info["name"], "status": info["status"],
            "submitted": info.get("submitted"), "submission_time": info.get("submission_time"),
            "completion_time": info.get("completion_time"), "failure": info.get("failure"),
            "processing_guarantee": cfg.get("processing_guarantee"),
            "snapshot_interval_ms": cfg.get("snapshot_interval_ms"),
            "initial_snapshot_name": cfg.get("initial_snapshot_name"),
            "last_snapshot": _snapshot_json(info.get("last_snapshot")),
            "snapshot_count": info.get("snapshot_count"),
            "restart_count": info.get("restart_count")}


def _print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, default=str))


class _Progress:
    """A one-line progress display on a terminal (nothing when stderr is not a TTY): the
    operation, the job's last known status and the elapsed time, refreshed by a thread while
    a request blocks and by the status polls while waiting."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.status: str | None = None
        self.tty = sys.stderr.isatty()
        self.shown = False
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _show(self) -> None:
        now = f" (job is {self.status})" if self.status else ""
        sys.stderr.write(f"\r{self.what}{now}... {time.monotonic() - self._t0:.0f}s \033[K")
        sys.stderr.flush()
        self.shown = True

    def __enter__(self) -> "_Progress":
        if self.tty:
            def tick() -> None:
                while not self._stop.wait(0.25):
                    self._show()
            self._thread = threading.Thread(target=tick, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done()

    def __call__(self, info: dict, elapsed: float) -> None:
        self.status = info["status"]

    def done(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.shown = False


# --- commands ----------------------------------------------------------------------------------


def _client(args: argparse.Namespace):
    from jetwake.engine.server.client import Client
    address = getattr(args, "address", None) or os.environ.get("JETWAKE_ADDRESS") \
        or DEFAULT_ADDRESS
    token = getattr(args, "token", None) or os.environ.get("JETWAKE_TOKEN") or None
    timeout = getattr(args, "timeout", None)
    try:
        return Client(address, token=token,
                      request_timeout=max(timeout, 1.0) if timeout else 300.0)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def _request(job, args: argparse.Namespace, what: str, action: str, **kw: Any) -> Any:
    """Sends a job action; blocking ones (a terminal snapshot) show progress meanwhile."""
    if getattr(args, "no_wait", False):
        return job._action(action, background=True, **kw)
    with _Progress(what):
        try:
            return job._action(action, **kw)
        except TimeoutError:
            raise CliError(f"timed out after {args.timeout:g} s: {what.lower()} (the member "
                           "may still complete it; try a longer --timeout)") from None


def _wait(job, args: argparse.Namespace, what: str,
          check: Callable[[dict], bool] | set) -> dict:
    with _Progress(what) as progress:
        try:
            return job.wait_for_status(check, args.timeout, progress)
        except TimeoutError:
            raise CliError(f"timed out after {args.timeout:g} s: {what.lower()}; the job is "
                           f"{job._info['status']} (try again with a longer --timeout)") \
                from None


def cmd_member_start(args: argparse.Namespace) -> int:
    from jetwake.engine.server.member_service import (
        InsecureAddressError, check_listen_address, serve,
    )
    token = getattr(args, "token", None) or os.environ.get("JETWAKE_TOKEN") or None
    try:  # before anything is opened: a usage error, on stderr like the others
        check_listen_address(args.host, token)
    except InsecureAddressError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    return serve(data_dir=args.data_dir, host=args.host, port=args.port, token=token,
                 metrics_port=args.metrics_port, cooperative_threads=args.cooperative_threads,
                 local_parallelism=args.local_parallelism, log_level=args.log_level,
                 hello_timeout=args.hello_timeout,
                 max_unauthenticated=args.max_unauthenticated)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def cmd_submit(args: argparse.Namespace) -> int:
    from jetwake.engine.jobs.job_config import JobConfig
    job_args = list(getattr(args, "job_args", None) or [])
    pipeline = load_pipeline(args.file, job_args)
    guarantee = args.guarantee
    try:
        config = JobConfig(
            name=args.name, processing_guarantee=guarantee,
            snapshot_interval_ms=args.snapshot_interval if args.snapshot_interval is not None
            else 10_000, initial_snapshot_name=args.from_snapshot,
            arguments={"args": job_args, "file": os.path.abspath(args.file)})
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    with _client(args) as client:
        job = client.new_job(pipeline, config)
        info = job._info
        if not args.no_wait:
            info = _wait(job, args, f"Waiting for job '{job.name}' to start",
                         lambda i: i["status"] in ("RUNNING", *_TERMINAL))
            if info["status"] == "FAILED":
                raise CliError(f"job '{job.name}' ({job.id}) failed: {info.get('failure')}")
        if args.json:
            _print_json(job_json(info))
        else:
            print(f"Job '{job.name}' submitted: id {job.id}, {info['status']}")
    return EXIT_OK


def cmd_list_jobs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        infos = client.call("jobs")
    if not args.all:
        infos = [i for i in infos if i["status"] not in _TERMINAL]
    if args.json:
        _print_json([job_json(i) for i in infos])
        return EXIT_OK
    if not infos:
        print("No jobs" if args.all else "No active jobs (use --all to see finished ones)")
        return EXIT_OK
    print(_table(["ID", "NAME", "STATUS", "SUBMITTED"],
                 [[i["id"], i["name"], i["status"], _time(i.get("submission_time"))]
                  for i in infos]))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.job(args.job)
        info = job.refresh()
        metrics = job.metrics() if info["status"] not in _TERMINAL else {}
    if args.json:
        doc = job_json(info)
        doc["metrics"] = metrics
        _print_json(doc)
        return EXIT_OK
    cfg = info.get("config") or {}
    rows = [("ID", info["id"]), ("Name", info["name"]), ("Status", info["status"]),
            ("Submitted", _time(info.get("submission_time")))]
    if info.get("completion_time"):
        rows.append(("Ended", _time(info["completion_time"])))
    g = cfg.get("processing_guarantee", "none")
    rows.append(("Guarantee", g if g == "none"
                 else f"{g}, snapshot every {cfg.get('snapshot_interval_ms')} ms"))
    snap = info.get("last_snapshot")
    if snap:
        rows.append(("Last snapshot", f"#{snap['snapshot_id']} at {_time(snap['created'])}, "
                     f"{snap['duration_ms']:.1f} ms, {snap['entry_count']} entries, "
                     f"{_size(snap['size_bytes'])}"))
    rows.append(("Restarts", str(info.get("restart_count", 0))))
    if info.get("failure"):
        rows.append(("Failure", info["failure"]))
    width = max(len(k) for k, _ in rows) + 1
    for k, v in rows:
        print(f"{k + ':':<{width}} {v}")
    if metrics:
        print()
        print(_table(["VERTEX", "ITEMS IN", "ITEMS OUT", "OTHER"],
                     [[v, str(m.get("items_in", 0)), str(m.get("items_out", 0)),
                       ", ".join(f"{k}={n}" for k, n in m.items()
                                 if k not in ("items_in", "items_out"))]
                      for v, m in metrics.items()]))
    return EXIT_OK


def _job_command(args: argparse.Namespace, action: str) -> int:
    with _client(args) as client:
        job = client.job(args.job)
        before = job._info.get("starts", 0)
        what = {"suspend": "Suspending", "resume": "Resuming", "restart": "Restarting",
                "cancel": "Cancelling"}[action]
        _request(job, args, f"{what} job '{job.name}'", action)
        label = f"'{job.name}' ({job.id})"
        if args.no_wait:
            print(f"Job {label}: {action} requested")
            return EXIT_OK
        if action == "suspend":
            info = _wait(job, args, f"Suspending job '{job.name}'", {"SUSPENDED", *_TERMINAL})
            done = "suspended"
        elif action == "resume":
            info = _wait(job, args, f"Resuming job '{job.name}'", {"RUNNING", *_TERMINAL})
            done = "resumed"
        elif action == "restart":
            info = _wait(job, args, f"Restarting job '{job.name}'",
                         lambda i: i["status"] in _TERMINAL or (
                             i["status"] == "RUNNING" and i.get("starts", 0) > before))
            done = "restarted"
        else:
            info = _wait(job, args, f"Cancelling job '{job.name}'", set(_TERMINAL))
            done = "cancelled"
        if action != "cancel" and info["status"] == "FAILED":
            raise CliError(f"job {label} failed: {info.get('failure')}")
        print(f"Job {label} {done}: {info['status']}")
    return EXIT_OK


def cmd_save_snapshot(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.job(args.job)
        action = "cancel_and_export_snapshot" if args.cancel else "export_snapshot"
        if args.no_wait and args.cancel:
            job._action(action, name=args.name, background=True)
            print(f"Job '{job.name}' ({job.id}): export of '{args.name}' and cancel requested")
            return EXIT_OK
        rec = _request(job, args, f"Exporting a snapshot of job '{job.name}'", action,
                       name=args.name)
        print(f"Exported snapshot '{args.name}' of job '{job.name}' ({job.id}): "
              f"snapshot {rec['snapshot_id']}, {rec['entry_count']} entries, "
              f"{_size(rec['size_bytes'])}")
        if args.cancel:
            if not args.no_wait:
                _wait(job, args, f"Cancelling job '{job.name}'", set(_TERMINAL))
            print(f"Job '{job.name}' ({job.id}) cancelled")
    return EXIT_OK


def cmd_list_snapshots(args: argparse.Namespace) -> int:
    with _client(args) as client:
        recs = client.call("snapshots")
    recs.sort(key=lambda d: d.get("created", 0))
    if args.json:
        _print_json([_snapshot_json(d) for d in recs])
        return EXIT_OK
    if not recs:
        print("No exported snapshots")
        return EXIT_OK
    print(_table(["NAME", "JOB", "JOB ID", "SNAPSHOT", "CREATED", "SIZE"],
                 [[d["name"], d["job_name"], d["job_id"], str(d["snapshot_id"]),
                   _time(d["created"]), _size(d["size_bytes"])] for d in recs]))
    return EXIT_OK


def cmd_delete_snapshot(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.delete_snapshot(args.name)
    print(f"Deleted snapshot '{args.name}'")
    return EXIT_OK


def cmd_cluster(args: argparse.Namespace) -> int:
    with _client(args) as client:
        info = client.cluster()
    if args.json:
        _print_json(info)
        return EXIT_OK
    print(f"State:   {info['state']}")
    print(f"Version: {info['version']}")
    print(f"Size:    {len(info['members'])} member(s)")
    print(f"Jobs:    {info['jobs']} ({info['active_jobs']} active)")
    print()
    rows = []
    for m in info["members"]:
        jobs = ", ".join(f"{n} {s.lower()}" for s, n in sorted(m.get("jobs", {}).items())) \
            or "none"
        rows.append([m["address"], m["version"], str(m.get("pid", "-")),
                     _duration(m.get("uptime_s", 0)), m.get("data_dir") or "(in memory)", jobs])
    print(_table(["ADDRESS", "VERSION", "PID", "UPTIME", "DATA DIR", "JOBS"], rows))
    return EXIT_OK


# --- the parser --------------------------------------------------------------------------------

_FMT = argparse.RawDescriptionHelpFormatter


def _common() -> argparse.ArgumentParser:
    """--address and --token, also accepted after the command."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    g.add_argument("--address", "-a", metavar="HOST:PORT", default=argparse.SUPPRESS,
                   help=f"the member (default: $JETWAKE_ADDRESS or {DEFAULT_ADDRESS})")
    g.add_argument("--token", "-t", metavar="TOKEN", default=argparse.SUPPRESS,
                   help="the member's token (default: $JETWAKE_TOKEN)")
    return p


def _wait_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-wait", action="store_true",
                   help="return once the member accepted the request")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the new state (default: 60)")


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="jetwake", formatter_class=_FMT, parents=[common],
        description="Run a jetwake member and manage its jobs.",
        epilog="examples:\n"
               "  jetwake member start --data-dir ./data\n"
               "  jetwake submit wordcount.py --name wc --guarantee exactly_once\n"
               "  jetwake list-jobs\n"
               "  jetwake --address 10.0.0.5:5701 --token s3cret status wc\n\n"
               "`jetwake COMMAND --help` describes each command.")
    from jetwake.engine.server.member_service import HELLO_TIMEOUT_S, MAX_UNAUTHENTICATED, version
    parser.add_argument("--version", action="version", version=f"jetwake {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_text: str, example: str, parents: bool = True,
            ) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text + ".",
                              epilog="example:\n  " + example, formatter_class=_FMT,
                              parents=[common] if parents else [])

    # member
    mp = sub.add_parser("member", help="run a member", description="Run a member.",
                        formatter_class=_FMT,
                        epilog="example:\n  jetwake member start --data-dir ./data")
    msub = mp.add_subparsers(dest="member_command", metavar="SUBCOMMAND")
    ms = msub.add_parser(
        "start", help="run a member in the foreground until SIGTERM/SIGINT",
        formatter_class=_FMT,
        description="Run a member in the foreground until SIGTERM or SIGINT. The first signal "
                    "stops it gracefully: jobs with a processing guarantee take a terminal "
                    "snapshot and resume on the next start on the same --data-dir. A second "
                    "signal exits at once.",
        epilog="examples:\n"
               "  jetwake member start --data-dir ./data --metrics-port 9090\n"
               "  jetwake member start --host 0.0.0.0 --token \"$(cat token.txt)\"")
    ms.add_argument("--data-dir", metavar="DIR",
                    help="keep maps, jobs and snapshots here (default: in memory, lost at exit)")
    ms.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default: 127.0.0.1, loopback only)")
    ms.add_argument("--port", type=int, default=5701, help="client port (default: 5701)")
    ms.add_argument("--token", "-t", default=argparse.SUPPRESS,
                    help="require this token from every client (default: $JETWAKE_TOKEN); "
                         "required unless --host is a loopback address")
    ms.add_argument("--hello-timeout", type=_positive_seconds,
                    default=HELLO_TIMEOUT_S, metavar="SECONDS",
                    help="time a new connection has to authenticate, for its whole first "
                         f"message (default: {HELLO_TIMEOUT_S:g})")
    ms.add_argument("--max-unauthenticated", type=_positive_int,
                    default=MAX_UNAUTHENTICATED, metavar="N",
                    help="connections that may wait to authenticate at once; more are "
                         f"closed at once (default: {MAX_UNAUTHENTICATED})")
    ms.add_argument("--metrics-port", type=int, metavar="PORT",
                    help="serve Prometheus /metrics and /health on this port")
    ms.add_argument("--cooperative-threads", type=int, metavar="N",
                    help="worker threads for cooperative processors (default: min(2, CPUs))")
    ms.add_argument("--local-parallelism", type=int, metavar="N",
                    help="default processors per vertex (default: min(2, CPUs))")
    ms.add_argument("--log-level", default="INFO",
                    choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default: INFO")
    ms.set_defaults(func=cmd_member_start)

    p = add("submit", "build the pipeline of FILE.py locally and submit it as a job",
            "jetwake submit counter.py --name counter --guarantee exactly_once "
            "--snapshot-interval 1000 -- --rate 100")
    p.description += (" FILE.py defines a module-level `pipeline` (a Pipeline) or a function "
                      "`pipeline(args)` that returns one; ARGS after `--` are passed to it.")
    p.usage = ("jetwake submit [-h] [--name NAME] [--guarantee G] [--snapshot-interval MS] "
               "[--from-snapshot NAME] [--json] [--no-wait] [--timeout SECONDS] FILE.py "
               "[-- ARGS...]")
    p.add_argument("file", metavar="FILE.py")
    p.add_argument("--name", "-n", help="job name (default: the job id)")
    p.add_argument("--guarantee", "-g", default="none",
                   choices=["exactly_once", "at_least_once", "none"],
                   help="processing guarantee (default: none)")
    p.add_argument("--snapshot-interval", type=int, metavar="MS",
                   help="milliseconds between snapshots (default: 10000)")
    p.add_argument("--from-snapshot", "-s", metavar="NAME",
                   help="start from this exported snapshot")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    _wait_options(p)
    p.set_defaults(func=cmd_submit)

    p = add("list-jobs", "list the jobs (ID, NAME, STATUS, SUBMITTED)",
            "jetwake list-jobs --all --json")
    p.add_argument("--all", action="store_true", help="include completed and failed jobs")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=cmd_list_jobs)

    p = add("status", "show one job's status, last snapshot and metrics",
            "jetwake status counter --json")
    p.add_argument("job", metavar="JOB", help="job name or id")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=cmd_status)

    for name, text in (("suspend", "suspend a job: terminal snapshot, then stop"),
                       ("resume", "resume a suspended job from its last snapshot"),
                       ("restart", "restart a job from its last snapshot"),
                       ("cancel", "cancel a job (it ends FAILED; exported snapshots stay)")):
        p = add(name, text, f"jetwake {name} counter")
        p.add_argument("job", metavar="JOB", help="job name or id")
        _wait_options(p)
        p.set_defaults(func=lambda a, _n=name: _job_command(a, _n))

    p = add("save-snapshot", "export a snapshot of a job under NAME (kept until deleted)",
            "jetwake save-snapshot counter before-upgrade --cancel")
    p.add_argument("job", metavar="JOB", help="job name or id")
    p.add_argument("name", metavar="NAME", help="snapshot name")
    p.add_argument("--cancel", action="store_true",
                   help="cancel the job after the snapshot (cancel-and-export)")
    _wait_options(p)
    p.set_defaults(func=cmd_save_snapshot)

    p = add("list-snapshots", "list the exported snapshots", "jetwake list-snapshots --json")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=cmd_list_snapshots)

    p = add("delete-snapshot", "delete an exported snapshot",
            "jetwake delete-snapshot before-upgrade")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=cmd_delete_snapshot)

    p = add("cluster", "show the members, their addresses and version, and the jobs",
            "jetwake cluster --json")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=cmd_cluster)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    job_args: list[str] = []
    if "submit" in argv and "--" in argv[argv.index("submit"):]:
        cut = argv.index("--", argv.index("submit"))
        argv, job_args = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    args.job_args = job_args
    if getattr(args, "command", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command == "member" and getattr(args, "member_command", None) is None:
        parser.parse_args(["member", "--help"])
    from jetwake.engine.server.client import AuthenticationError, MemberUnreachableError
    from jetwake.engine.core.errors import JetwakeError
    try:
        return args.func(args)
    except PipelineFileError as e:
        if e.traceback_text:
            sys.stderr.write(e.traceback_text)
        print(f"jetwake: error: {e}", file=sys.stderr)
        return e.code
    except CliError as e:
        print(f"jetwake: error: {e}", file=sys.stderr)
        return e.code
    except MemberUnreachableError as e:
        print(f"jetwake: error: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except AuthenticationError as e:
        print(f"jetwake: error: {e} (set --token or JETWAKE_TOKEN)", file=sys.stderr)
        return EXIT_AUTH
    except KeyboardInterrupt:
        print("\njetwake: interrupted (the member carries on with what it was asked)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_FAILED
    except Exception as e:  # noqa: BLE001 - errors from the member, of any class
        if os.environ.get("JETWAKE_DEBUG"):
            raise
        if isinstance(e, KeyError) and e.args:
            msg = str(e.args[0])
        elif isinstance(e, (JetwakeError, ValueError, TimeoutError)):
            msg = str(e)
        else:
            msg = f"{type(e).__name__}: {e}"
        print(f"jetwake: error: {msg}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
