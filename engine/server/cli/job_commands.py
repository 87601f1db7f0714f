"""The job commands: ``submit``, ``list-jobs``, ``status``, and ``suspend``, ``resume``,
``restart``, ``cancel``."""

from __future__ import annotations

import argparse
import os

from jetwake.engine.core.errors import SnapshotNotFoundError
from jetwake.engine.server.cli.connection import connect
from jetwake.engine.server.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from jetwake.engine.server.cli.output import (
    format_size, format_time, job_json, print_json, table,
)
from jetwake.engine.server.cli.pipeline_files import load_pipeline
from jetwake.engine.server.cli.progress import Progress
from jetwake.engine.server.cli.waiting import TERMINAL, send_action, wait_for, wait_started

__all__ = ["cmd_submit", "cmd_list_jobs", "cmd_status", "job_command", "JOB_ACTIONS"]

#: the state commands: name -> what it does (its help)
JOB_ACTIONS = {"suspend": "suspend a job: terminal snapshot, then stop",
               "resume": "resume a suspended job from its last snapshot",
               "restart": "restart a job from its last snapshot",
               "cancel": "cancel a job (it ends FAILED; exported snapshots stay)"}


def cmd_submit(args: argparse.Namespace) -> int:
    """Loads FILE.py, submits its pipeline and, unless ``--no-wait``, waits until the member
    has started the job: it prints the job once it runs, or the start's real failure as soon
    as the member knows it."""
    from jetwake.engine.jobs.job_config import JobConfig
    job_args = list(getattr(args, "job_args", None) or [])
    pipeline = load_pipeline(args.file, job_args)
    if args.light and args.guarantee != "none":
        raise CliError("a light job takes no snapshots: --light goes with the guarantee "
                       f"'none', not '{args.guarantee}'", EXIT_USAGE)
    try:
        config = JobConfig(
            name=args.name, processing_guarantee=args.guarantee,
            snapshot_interval_ms=args.snapshot_interval if args.snapshot_interval is not None
            else 10_000, initial_snapshot_name=args.from_snapshot,
            split_brain_protection=args.split_brain_protection,
            auto_scaling=not args.no_auto_scaling,
            arguments={"args": job_args, "file": os.path.abspath(args.file)},
            dry_run=args.dry_run, allow_state_drop=args.allow_state_drop)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    if args.dry_run:
        return upgrade_dry_run(args, pipeline, config)
    with connect(args) as client, \
            Progress(f"Submitting {os.path.basename(args.file)}") as progress:
        try:
            job = client.submit_job(pipeline, config, light=args.light)
        except SnapshotNotFoundError:
            raise CliError(f"no exported snapshot named '{args.from_snapshot}' to start from "
                           "(--from-snapshot); `jetwake list-snapshots` lists them. No job "
                           "was submitted") from None
        info = job._info
        if not args.no_wait:
            progress.what = f"Starting job '{job.name}'"
            info = wait_started(job, args.timeout, progress)
    label = f"'{job.name}' ({job.id})"
    start_error = (info.get("start") or {}).get("error")
    if start_error is not None:
        why = info.get("failure") or ": ".join(start_error)
        raise CliError(f"job {label} failed to start: {why}")
    if not args.no_wait and info["status"] == "FAILED":
        raise CliError(f"job {label} failed: {info.get('failure')}")
    if args.json:
        print_json(job_json(info))
    else:
        print(f"Job '{job.name}' submitted: id {job.id}, {info['status']}")
    return EXIT_OK


def upgrade_dry_run(args: argparse.Namespace, pipeline: object, config: object) -> int:
    """``submit FILE --from-snapshot NAME --dry-run``: prints, stage by stage, the saved state
    the job would take over, drop and start without; submits nothing. Exits 1 when the job
    would be refused (it drops state without ``--allow-state-drop``)."""
    with connect(args) as client:
        try:
            plan = client.submit_job(pipeline, config)  # type: ignore[arg-type]
        except SnapshotNotFoundError:
            raise CliError(f"no exported snapshot named '{args.from_snapshot}' to plan from "
                           "(--from-snapshot); `jetwake list-snapshots` lists them") from None
    if args.json:
        print_json(plan.to_dict())  # type: ignore[attr-defined]
    else:
        print(plan.describe())  # type: ignore[attr-defined]
    return EXIT_FAILED if plan.refused else EXIT_OK  # type: ignore[attr-defined]


def cmd_list_jobs(args: argparse.Namespace) -> int:
    with connect(args) as client:
        infos = client.call("jobs")
    if not args.all:
        infos = [i for i in infos if i["status"] not in TERMINAL]
    if args.json:
        print_json([job_json(i) for i in infos])
        return EXIT_OK
    if not infos:
        print("No jobs" if args.all else "No active jobs (use --all to see finished ones)")
        return EXIT_OK
    print(table(["ID", "NAME", "STATUS", "SUBMITTED"],
                [[i["id"], i["name"], i["status"], format_time(i.get("submission_time"))]
                 for i in infos]))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = client.job(args.job)
        info = job.refresh()
        metrics = job.metrics() if info["status"] not in TERMINAL else {}
    if args.json:
        doc = job_json(info)
        doc["metrics"] = metrics
        print_json(doc)
        return EXIT_OK
    cfg = info.get("config") or {}
    rows = [("ID", info["id"]), ("Name", info["name"]), ("Status", info["status"]),
            ("Submitted", format_time(info.get("submission_time")))]
    if info.get("completion_time"):
        rows.append(("Ended", format_time(info["completion_time"])))
    g = cfg.get("processing_guarantee", "none")
    rows.append(("Guarantee", g if g == "none"
                 else f"{g}, snapshot every {cfg.get('snapshot_interval_ms')} ms"))
    snap = info.get("last_snapshot")
    if snap:
        rows.append(("Last snapshot", f"#{snap['snapshot_id']} at "
                     f"{format_time(snap['created'])}, {snap['duration_ms']:.1f} ms, "
                     f"{snap['entry_count']} entries, {format_size(snap['size_bytes'])}"))
    rows.append(("Restarts", str(info.get("restart_count", 0))))
    if info.get("failure"):
        rows.append(("Failure", info["failure"]))
    width = max(len(k) for k, _ in rows) + 1
    for k, v in rows:
        print(f"{k + ':':<{width}} {v}")
    if metrics:
        print()
        print(table(["VERTEX", "ITEMS IN", "ITEMS OUT", "OTHER"],
                    [[v, str(m.get("items_in", 0)), str(m.get("items_out", 0)),
                      ", ".join(f"{k}={n}" for k, n in m.items()
                                if k not in ("items_in", "items_out"))]
                     for v, m in metrics.items()]))
    return EXIT_OK


def job_command(args: argparse.Namespace, action: str) -> int:
    """``suspend``, ``resume``, ``restart`` or ``cancel`` the job, and wait for its new
    state unless ``--no-wait``."""
    with connect(args) as client:
        job = client.job(args.job)
        before = job._info.get("starts", 0)
        what = {"suspend": "Suspending", "resume": "Resuming", "restart": "Restarting",
                "cancel": "Cancelling"}[action]
        send_action(job, args, f"{what} job '{job.name}'", action)
        label = f"'{job.name}' ({job.id})"
        if args.no_wait:
            print(f"Job {label}: {action} requested")
            return EXIT_OK
        if action == "suspend":
            info = wait_for(job, args, f"Suspending job '{job.name}'", {"SUSPENDED", *TERMINAL})
            done = "suspended"
        elif action == "resume":
            info = wait_for(job, args, f"Resuming job '{job.name}'", {"RUNNING", *TERMINAL})
            done = "resumed"
        elif action == "restart":
            info = wait_for(job, args, f"Restarting job '{job.name}'",
                            lambda i: i["status"] in TERMINAL or (
                                i["status"] == "RUNNING" and i.get("starts", 0) > before))
            done = "restarted"
        else:
            info = wait_for(job, args, f"Cancelling job '{job.name}'", set(TERMINAL))
            done = "cancelled"
        if action != "cancel" and info["status"] == "FAILED":
            raise CliError(f"job {label} failed: {info.get('failure')}")
        print(f"Job {label} {done}: {info['status']}")
    return EXIT_OK
