"""The ``jetwake`` command's argparse wiring and ``main()``: parses the command line, runs the
command and turns every error into one line ``jetwake: error: ...`` and an exit code
(:mod:`jetwake.engine.server.cli.errors`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from jetwake.engine.core.errors import JetwakeError
from jetwake.engine.server.authentication import HELLO_TIMEOUT_S, MAX_UNAUTHENTICATED
from jetwake.engine.server.cli.connection import DEFAULT_ADDRESS
from jetwake.engine.server.cli.backfill_command import add_backfill_parser
from jetwake.engine.server.cli.errors import (
    EXIT_AUTH, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_UNREACHABLE, EXIT_USAGE, CliError,
)
from jetwake.engine.server.cli.job_commands import (
    JOB_ACTIONS, cmd_list_jobs, cmd_status, cmd_submit, job_command,
)
from jetwake.engine.server.cli.member_commands import cmd_cluster, cmd_member_start
from jetwake.engine.server.cli.pipeline_files import PipelineFileError
from jetwake.engine.server.cli.state_command import add_state_parser
from jetwake.engine.server.cli.snapshot_commands import (
    add_snapshot_parser, cmd_delete_snapshot, cmd_list_snapshots, cmd_save_snapshot,
)
from jetwake.engine.server.client import AuthenticationError, MemberUnreachableError
from jetwake.engine.server.protocol import version

__all__ = ["main", "build_parser", "SUBMIT_TIMEOUT_S"]

#: how long ``submit`` waits for its job to start by default: longer than the Kafka
#: connectors' default start-up timeout (60 s), so that a job whose broker or topic is
#: missing reports why rather than a timeout of the command
SUBMIT_TIMEOUT_S = 120.0
#: how long ``cluster --wait N`` waits for N members to serve by default
CLUSTER_WAIT_S = 60.0


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


def _wait_options(p: argparse.ArgumentParser, timeout: float = 60.0,
                  waits_for: str = "the new state") -> None:
    p.add_argument("--no-wait", action="store_true",
                   help="return once the member accepted the request")
    p.add_argument("--timeout", type=float, default=timeout, metavar="SECONDS",
                   help=f"how long to wait for {waits_for} (default: {timeout:g})")


def build_parser() -> argparse.ArgumentParser:
    """The ``jetwake`` parser: every command with its options, help and an example."""
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
    ms.add_argument("--cluster", metavar="NAME", default=None,
                    help="join the cluster NAME (needs --kafka and --data-dir)")
    ms.add_argument("--kafka", metavar="BOOTSTRAP", default=None,
                    help="Kafka bootstrap servers through which the cluster's members find "
                         "each other, and where the cluster keeps its records")
    ms.add_argument("--advertise", metavar="HOST:PORT", default=None,
                    help="the address clients and peers reach this member by, if not the "
                         "one it listens on")
    ms.add_argument("--peer-port", type=int, default=0, metavar="PORT",
                    help="port for the other members of the cluster (default: a free port)")
    ms.add_argument("--session-timeout", type=int, default=None, metavar="MS",
                    help="how long Kafka waits for a silent member before the cluster goes on "
                         "without it (default: 6000; lower: faster failover, more false "
                         "alarms on a busy host)")
    ms.add_argument("--internal-topic-replication", type=_positive_int, default=None,
                    metavar="N",
                    help="replicas of each topic the cluster keeps in Kafka (control, records, "
                         "snapshot data, maps); default: as many as there are brokers, up to "
                         "3 (the member warns when they have a single replica)")
    ms.add_argument("--fast-failover", choices=["on", "off"], default="on",
                    help="on (default): when the coordinator's process is gone (its peer "
                         "port refuses connections), the survivors have Kafka drop it at once "
                         "instead of after the session timeout; off: wait for the session "
                         "timeout")
    ms.add_argument("--scale-up-delay", type=int, default=None, metavar="MS",
                    help="how long after members joined the cluster's jobs restart to use "
                         "them (default: 10000)")
    ms.add_argument("--metrics-port", type=int, metavar="PORT",
                    help="serve Prometheus /metrics and /health on this port, and the web "
                         "dashboard at / (docs/dashboard.md)")
    ms.add_argument("--ui-auth", choices=["open", "required"], default="open",
                    help="open: anyone who reaches the dashboard may read it, actions need "
                         "the token; required: reading needs the token too (needs --token "
                         "and --metrics-port; default: open)")
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
    assert p.description is not None  # add() gives one
    p.description += (" FILE.py defines a module-level `pipeline` (a Pipeline) or a function "
                      "`pipeline(args)` that returns one; ARGS after `--` are passed to it.")
    p.usage = ("jetwake submit [-h] [--name NAME] [--guarantee G] [--snapshot-interval MS] "
               "[--from-snapshot NAME [--dry-run] [--allow-state-drop]] "
               "[--split-brain-protection] [--no-auto-scaling] "
               "[--light] [--json] [--no-wait] [--timeout SECONDS] FILE.py [-- ARGS...]")
    p.add_argument("file", metavar="FILE.py")
    p.add_argument("--name", "-n", help="job name (default: the job id)")
    p.add_argument("--split-brain-protection", action="store_true",
                   help="in a cluster, run only while a quorum of members is present")
    p.add_argument("--no-auto-scaling", action="store_true",
                   help="in a cluster, keep the job's members: a member that joins is not "
                        "used, and losing one suspends the job (with a guarantee)")
    p.add_argument("--light", action="store_true",
                   help="a light job: started on every member of the cluster by the member "
                        "this command connects to, which coordinates it; no snapshots, no job "
                        "record (guarantee 'none')")
    p.add_argument("--guarantee", "-g", default="none",
                   choices=["exactly_once", "at_least_once", "none"],
                   help="processing guarantee (default: none)")
    p.add_argument("--snapshot-interval", type=int, metavar="MS",
                   help="milliseconds between snapshots (default: 10000)")
    p.add_argument("--from-snapshot", "-s", metavar="NAME",
                   help="start from this exported snapshot")
    p.add_argument("--dry-run", action="store_true",
                   help="with --from-snapshot: print, stage by stage, which saved state the "
                        "job would take over, drop and start without, and submit nothing "
                        "(exit code 1 when the job would be refused)")
    p.add_argument("--allow-state-drop", action="store_true",
                   help="with --from-snapshot: start even when the new pipeline drops some "
                        "of the snapshot's saved state (refused otherwise)")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    _wait_options(p, SUBMIT_TIMEOUT_S, "the job to start; its failure is reported as soon "
                  "as the member knows it")
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

    for name, text in JOB_ACTIONS.items():
        p = add(name, text, f"jetwake {name} counter")
        p.add_argument("job", metavar="JOB", help="job name or id")
        _wait_options(p)
        p.set_defaults(func=lambda a, _n=name: job_command(a, _n))

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

    p = add("cluster", "show the cluster: its coordinator, quorum and members with their "
            "addresses and jobs",
            "jetwake cluster --wait 3 --timeout 60 --json")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument("--wait", type=_positive_int, metavar="N",
                   help="first wait until N members serve clients (listed ACTIVE), retrying "
                        "while the member at --address is still starting")
    p.add_argument("--timeout", type=_positive_seconds, default=CLUSTER_WAIT_S,
                   metavar="SECONDS",
                   help=f"how long --wait waits (default: {CLUSTER_WAIT_S:g})")
    p.set_defaults(func=cmd_cluster)

    add_backfill_parser(sub, _FMT, common)
    add_state_parser(add)
    add_snapshot_parser(sub, _FMT, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command in ``argv`` (default: ``sys.argv[1:]``); returns the exit code. Words
    after ``submit ... --`` go to the pipeline file unparsed."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    job_args: list[str] = []
    for command in ("submit", "backfill"):
        if command in argv and "--" in argv[argv.index(command):]:
            cut = argv.index("--", argv.index(command))
            argv, job_args = argv[:cut], argv[cut + 1:]
            break
    args = parser.parse_args(argv)
    args.job_args = job_args
    if getattr(args, "command", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command == "member" and getattr(args, "member_command", None) is None:
        parser.parse_args(["member", "--help"])
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


