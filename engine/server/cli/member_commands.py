"""The member commands: ``member start`` (run a member in the foreground) and ``cluster``."""

from __future__ import annotations

import argparse

from jetwake.engine.server.authentication import InsecureAddressError, check_listen_address
from jetwake.engine.server.cli.connection import connect, token_of
from jetwake.engine.server.cli.errors import EXIT_OK, EXIT_USAGE, CliError
from jetwake.engine.server.cli.output import print_json, table

__all__ = ["cmd_member_start", "cmd_cluster"]


def cmd_member_start(args: argparse.Namespace) -> int:
    from jetwake.engine.server.member_process import serve
    token = token_of(args)
    try:  # before anything is opened: a usage error, on stderr like the others
        check_listen_address(args.host, token)
    except InsecureAddressError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    if (args.cluster is None) != (args.kafka is None):
        raise CliError("--cluster and --kafka go together: a member of a cluster finds the "
                       "others through Kafka (--cluster NAME --kafka HOST:9092)", EXIT_USAGE)
    if args.ui_auth == "required" and (not token or args.metrics_port is None):
        raise CliError("--ui-auth required needs --token (the dashboard's pages ask for it) "
                       "and --metrics-port (where the dashboard is served)", EXIT_USAGE)
    if args.cluster is not None and not args.data_dir:
        raise CliError("a member of a cluster needs --data-dir: its share of snapshots is "
                       "written there first", EXIT_USAGE)
    return serve(data_dir=args.data_dir, host=args.host, port=args.port, token=token,
                 cluster=args.cluster, kafka_bootstrap_servers=args.kafka,
                 advertise=args.advertise, peer_port=args.peer_port,
                 scale_up_delay_ms=args.scale_up_delay,
                 session_timeout_ms=args.session_timeout,
                 fast_failover=args.fast_failover == "on",
                 metrics_port=args.metrics_port, cooperative_threads=args.cooperative_threads,
                 local_parallelism=args.local_parallelism, log_level=args.log_level,
                 hello_timeout=args.hello_timeout,
                 max_unauthenticated=args.max_unauthenticated, ui_auth=args.ui_auth)


def cmd_cluster(args: argparse.Namespace) -> int:
    with connect(args) as client:
        info = client.cluster()
    if args.json:
        print_json(info)
        return EXIT_OK
    print(f"Cluster:     {info.get('name') or '(a single member)'}")
    print(f"State:       {info['state']}")
    print(f"Version:     {info['version']}")
    print(f"Coordinator: {info.get('coordinator')}")
    print(f"Size:        {len(info['members'])} member(s), quorum {info.get('quorum', 1)}")
    print()
    rows = []
    for m in info["members"]:
        rows.append([str(m.get("id")), str(m.get("address") or "-"),
                     "yes" if m.get("coordinator") else "", str(m.get("state", "-")),
                     str(m.get("jobs", "-")), str(m.get("pid", "-")),
                     m.get("data_dir") or "(in memory)"])
    print(table(["ID", "ADDRESS", "COORDINATOR", "STATE", "JOBS", "PID", "DATA DIR"], rows))
    return EXIT_OK
