"""The member commands: ``member start`` (run a member in the foreground) and ``cluster``."""

from __future__ import annotations

import argparse

from jetwake.engine.server.authentication import InsecureAddressError, check_listen_address
from jetwake.engine.server.cli.connection import connect, token_of
from jetwake.engine.server.cli.errors import EXIT_OK, EXIT_USAGE, CliError
from jetwake.engine.server.cli.output import format_duration, print_json, table

__all__ = ["cmd_member_start", "cmd_cluster"]


def cmd_member_start(args: argparse.Namespace) -> int:
    from jetwake.engine.server.member_process import serve
    token = token_of(args)
    try:  # before anything is opened: a usage error, on stderr like the others
        check_listen_address(args.host, token)
    except InsecureAddressError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    return serve(data_dir=args.data_dir, host=args.host, port=args.port, token=token,
                 metrics_port=args.metrics_port, cooperative_threads=args.cooperative_threads,
                 local_parallelism=args.local_parallelism, log_level=args.log_level,
                 hello_timeout=args.hello_timeout,
                 max_unauthenticated=args.max_unauthenticated)


def cmd_cluster(args: argparse.Namespace) -> int:
    with connect(args) as client:
        info = client.cluster()
    if args.json:
        print_json(info)
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
                     format_duration(m.get("uptime_s", 0)), m.get("data_dir") or "(in memory)",
                     jobs])
    print(table(["ADDRESS", "VERSION", "PID", "UPTIME", "DATA DIR", "JOBS"], rows))
    return EXIT_OK
