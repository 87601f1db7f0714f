"""``jetwake state JOB STAGE [KEY ...] [--latest] [--limit N] [--json]``: reads a running
job's stateful stage (``job.state``, engine/jobs/state_view.py).

A KEY given on the command line is JSON when it parses as JSON (``42`` is the int 42,
``'"42"'`` the str "42", ``'["a", 1]'`` the tuple ``("a", 1)``: a JSON array is taken as a
tuple, the form of composite keys), otherwise the word itself as a str. Without keys the
stage's keys are listed, ``--limit`` of them (default 100)."""

from __future__ import annotations

import argparse
from typing import Any

from jetwake.engine.jobs.state_reading import json_ready, key_from_text
from jetwake.engine.server.cli.connection import connect
from jetwake.engine.server.cli.errors import EXIT_FAILED, EXIT_OK
from jetwake.engine.server.cli.output import print_json, table

__all__ = ["cmd_state", "parse_key", "add_state_parser", "DEFAULT_LIMIT"]

DEFAULT_LIMIT = 100


parse_key = key_from_text  # one rule for the command line and the dashboard


def cmd_state(args: argparse.Namespace) -> int:
    consistency = "latest" if args.latest else "snapshot"
    keys = [parse_key(k) for k in args.keys]
    with connect(args) as client:
        view = client.job(args.job).state(args.stage, consistency=consistency)
        if keys:
            found = view.get_all(keys)
            entries = [(k, found[k]) for k in keys if k in found]
            missing = [k for k in keys if k not in found]
        else:
            entries = list(view.items(limit=args.limit))
            missing = []
        count = view.count() if not keys else len(entries)
    if args.json:
        print_json({"job": args.job, "stage": args.stage, "consistency": consistency,
                    "snapshot_id": view.snapshot_id, "count": count,
                    "entries": [{"key": json_ready(k), "value": json_ready(v)}
                                for k, v in entries],
                    "missing": [json_ready(k) for k in missing]})
        return EXIT_OK if not missing else EXIT_FAILED
    where = "live state" if consistency == "latest" else f"snapshot {view.snapshot_id}"
    print(f"Stage {args.stage!r} of job {args.job!r}, {where}: "
          + (f"{count} keys" if not keys else f"{len(entries)} of {len(keys)} keys found"))
    if entries:
        print(table(["KEY", "VALUE"], [[repr(k), repr(v)] for k, v in entries]))
    for k in missing:
        print(f"{k!r}: no state")
    return EXIT_OK if not missing else EXIT_FAILED


def add_state_parser(add: Any) -> None:
    """Adds ``jetwake state`` through the main parser's ``add(name, help, example)``."""
    p = add("state", "read a running job's stateful stage: the values of KEYs, or its keys",
            "jetwake state counter totals alice 42 --latest --json")
    p.add_argument("job", metavar="JOB", help="job name or id")
    p.add_argument("stage", metavar="STAGE", help="the stage's name (set_name)")
    p.add_argument("keys", metavar="KEY", nargs="*",
                   help="keys to look up, each JSON when it parses (42 an int, '\"42\"' a "
                        "str, '[\"a\", 1]' a tuple), else a str; none: list the keys")
    p.add_argument("--latest", action="store_true",
                   help="read the live state instead of the last committed snapshot")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, metavar="N",
                   help=f"list at most N keys (default: {DEFAULT_LIMIT})")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=cmd_state)
