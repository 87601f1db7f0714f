"""The snapshot commands: ``save-snapshot``, ``list-snapshots``, ``delete-snapshot`` and
``snapshot inspect``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from jetwake.engine.server.cli.connection import connect
from jetwake.engine.server.cli.errors import EXIT_OK, EXIT_USAGE
from jetwake.engine.server.cli.output import (
    format_size, format_time, print_json, snapshot_json, table,
)
from jetwake.engine.server.cli.waiting import TERMINAL, send_action, wait_for

__all__ = ["cmd_save_snapshot", "cmd_list_snapshots", "cmd_delete_snapshot",
           "cmd_snapshot_inspect", "add_snapshot_parser"]


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


def add_snapshot_parser(sub: Any, fmt: Any, common: argparse.ArgumentParser) -> None:
    """``jetwake snapshot inspect NAME|JOB [--json] [--sample N]``."""
    sp = sub.add_parser("snapshot", help="look into snapshots",
                        description="Look into snapshots.", formatter_class=fmt,
                        epilog="example:\n  jetwake snapshot inspect before-upgrade --json")
    ssub = sp.add_subparsers(dest="snapshot_command", metavar="SUBCOMMAND")
    sp.set_defaults(func=lambda a: (sp.print_help(sys.stderr), EXIT_USAGE)[1])
    p = ssub.add_parser(
        "inspect", parents=[common], formatter_class=fmt,
        help="what a snapshot holds: its stages, keys, sources' offsets, watermarks",
        description="What a committed snapshot holds: its id, time, job and checksums; per "
                    "stage its kind, entries, bytes, keys and a sample of them (decoded); "
                    "each source's offsets per partition and the stages' watermarks. NAME is "
                    "an exported snapshot; JOB a job's name or id (its last committed "
                    "snapshot).",
        epilog="examples:\n  jetwake snapshot inspect before-upgrade\n"
               "  jetwake snapshot inspect counter --json")
    p.add_argument("ref", metavar="NAME|JOB", help="an exported snapshot's name, or a job")
    p.add_argument("--sample", type=int, default=5, metavar="N",
                   help="keys to show per stage (default: 5)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=cmd_snapshot_inspect)


def cmd_snapshot_inspect(args: argparse.Namespace) -> int:
    with connect(args) as client:
        doc = client.inspect_snapshot(args.ref, args.sample)
    if args.json:
        print_json(doc)
        return EXIT_OK
    what = f"Snapshot '{doc['name']}'" if doc.get("name") else "Last committed snapshot"
    print(f"{what} of job '{doc['job_name']}' ({doc['job_id']}): snapshot {doc['snapshot_id']}"
          f", taken {format_time(doc['created'])}{', terminal' if doc['terminal'] else ''}, "
          f"{doc['entries']} entries, {format_size(doc['bytes'])}")
    print()
    print(table(["STAGE", "KIND", "PROCESSORS", "ENTRIES", "SIZE", "KEYS", "WATERMARK",
                 "SAMPLE"],
                [[st["vertex"], st["kind"] or "-", str(st["processors"]), str(st["entries"]),
                  format_size(st["bytes"]), str(st["keys"]),
                  str(st["watermark"]) if "watermark" in st else "-", _sample(st)]
                 for st in doc["stages"]]))
    rows = [[src["vertex"], p["source"], str(p.get("topic", p.get("map"))), str(p["partition"]),
             str(p.get("offset", p.get("sequence"))),
             "-" if p.get("top_event_time") is None else str(p["top_event_time"])]
            for src in doc["sources"] for p in src["partitions"]]
    if rows:
        print()
        print(table(["SOURCE", "KIND", "TOPIC/MAP", "PARTITION", "OFFSET", "TOP EVENT TIME"],
                    rows))
    print()
    print(table(["CHECKSUMS OF", "PROCESSOR", "ENTRIES", "CRC32", "BYTES"],
                [[v, p, str(c["entries"]), c["crc32"], str(c["bytes"])]
                 for v, procs in doc["checksums"].items() for p, c in procs.items()]))
    return EXIT_OK


def _sample(stage: dict) -> str:
    """A stage's sample keys, with their values when decoded, on one line."""
    if stage.get("sample"):
        text = ", ".join(f"{k!r}: {v!r}" for k, v in stage["sample"])
    else:
        text = ", ".join(repr(k) for k in stage["sample_keys"])
    return text if len(text) <= 80 else text[:77] + "..."
