"""The snapshot commands: ``save-snapshot``, ``list-snapshots``, ``delete-snapshot``."""

from __future__ import annotations

import argparse

from jetwake.engine.server.cli.connection import connect
from jetwake.engine.server.cli.errors import EXIT_OK
from jetwake.engine.server.cli.output import (
    format_size, format_time, print_json, snapshot_json, table,
)
from jetwake.engine.server.cli.waiting import TERMINAL, send_action, wait_for

__all__ = ["cmd_save_snapshot", "cmd_list_snapshots", "cmd_delete_snapshot"]


def cmd_save_snapshot(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = client.job(args.job)
        action = "cancel_and_export_snapshot" if args.cancel else "export_snapshot"
        if args.no_wait and args.cancel:
            job._action(action, name=args.name, background=True)
            print(f"Job '{job.name}' ({job.id}): export of '{args.name}' and cancel requested")
            return EXIT_OK
        rec = send_action(job, args, f"Exporting a snapshot of job '{job.name}'", action,
                          name=args.name)
        print(f"Exported snapshot '{args.name}' of job '{job.name}' ({job.id}): "
              f"snapshot {rec['snapshot_id']}, {rec['entry_count']} entries, "
              f"{format_size(rec['size_bytes'])}")
        if args.cancel:
            if not args.no_wait:
                wait_for(job, args, f"Cancelling job '{job.name}'", set(TERMINAL))
            print(f"Job '{job.name}' ({job.id}) cancelled")
    return EXIT_OK


def cmd_list_snapshots(args: argparse.Namespace) -> int:
    with connect(args) as client:
        recs = client.call("snapshots")
    recs.sort(key=lambda d: d.get("created", 0))
    if args.json:
        print_json([snapshot_json(d) for d in recs])
        return EXIT_OK
    if not recs:
        print("No exported snapshots")
        return EXIT_OK
    print(table(["NAME", "JOB", "JOB ID", "SNAPSHOT", "CREATED", "SIZE"],
                [[d["name"], d["job_name"], d["job_id"], str(d["snapshot_id"]),
                  format_time(d["created"]), format_size(d["size_bytes"])] for d in recs]))
    return EXIT_OK


def cmd_delete_snapshot(args: argparse.Namespace) -> int:
    with connect(args) as client:
        client.delete_snapshot(args.name)
    print(f"Deleted snapshot '{args.name}'")
    return EXIT_OK
