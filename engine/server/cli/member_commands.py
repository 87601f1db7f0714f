"""The member commands: ``member start`` (run a member in the foreground) and ``cluster``."""

from __future__ import annotations

import argparse
import time

from jetwake.engine.server.authentication import InsecureAddressError, check_listen_address
from jetwake.engine.server.cli.connection import connect, token_of
from jetwake.engine.server.cli.errors import EXIT_OK, EXIT_USAGE, CliError
from jetwake.engine.server.client import MemberNotServingError
from jetwake.engine.server.cli.output import print_json, table

__all__ = ["cmd_member_start", "cmd_cluster", "wait_for_members", "serving"]


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
                 internal_topic_replication=args.internal_topic_replication,
                 fast_failover=args.fast_failover == "on",
                 metrics_port=args.metrics_port, cooperative_threads=args.cooperative_threads,
                 local_parallelism=args.local_parallelism, log_level=args.log_level,
                 hello_timeout=args.hello_timeout,
                 max_unauthenticated=args.max_unauthenticated, ui_auth=args.ui_auth)


def cmd_cluster(args: argparse.Namespace) -> int:
    if args.wait is not None:
        info = wait_for_members(args, args.wait, args.timeout)
    else:
        with connect(args) as client:
            info = client.cluster()
    if args.json:
        print_json(info)
        return EXIT_OK
    print(f"Cluster:     {info.get('name') or '(a single member)'}")
    print(f"State:       {info['state']}")
    print(f"Version:     {info['version']}")
    print(f"Coordinator: {info.get('coordinator')}")  # or "election in progress"
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


def serving(info: dict) -> list[dict]:
    """The members of ``cluster``'s answer that serve clients (listed ACTIVE)."""
    return [m for m in info["members"] if m.get("state") == "ACTIVE"]


def wait_for_members(args: argparse.Namespace, count: int, timeout: float) -> dict:
    """``cluster --wait N``: polls the cluster until ``count`` members serve clients and
    returns its description; a member at ``--address`` that does not serve yet is retried.
    After ``timeout`` s fails naming how many serve and how many are still joining."""
    deadline = time.monotonic() + timeout
    info: dict | None = None
    why = "the member at --address does not serve clients yet"
    while True:
        try:
            with connect(args) as client:
                while True:
                    info = client.cluster()
                    if len(serving(info)) >= count:
                        return info
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.2)
        except MemberNotServingError as e:
            why = str(e)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if info is None:
        raise CliError(f"timed out after {timeout:g} s waiting for {count} member(s) to serve "
                       f"clients: {why}")
    states: dict[str, list[str]] = {}
    for m in info["members"]:
        states.setdefault(str(m.get("state")), []).append(str(m.get("id")))
    listed = "; ".join(f"{len(ids)} {state} ({', '.join(ids)})"
                       for state, ids in sorted(states.items()))
    raise CliError(f"timed out after {timeout:g} s waiting for {count} member(s) to serve "
                   f"clients: {len(serving(info))} serve ({listed or 'no member listed'}); "
                   f"try again with a longer --timeout, or start the missing members")
