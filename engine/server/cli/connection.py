"""The client a command talks to the member through: the address and token from the options
or the environment."""

from __future__ import annotations

import argparse
import os

from jetwake.engine.server.cli.errors import EXIT_USAGE, CliError
from jetwake.engine.server.client import Client

__all__ = ["DEFAULT_ADDRESS", "connect", "token_of"]

DEFAULT_ADDRESS = "127.0.0.1:5701"


def token_of(args: argparse.Namespace) -> str | None:
    """``--token``, else ``$JETWAKE_TOKEN``, else None."""
    return getattr(args, "token", None) or os.environ.get("JETWAKE_TOKEN") or None


def connect(args: argparse.Namespace) -> Client:
    """A client connected to ``--address`` (or ``$JETWAKE_ADDRESS``, or the default) whose
    requests time out after ``--timeout`` seconds where the command has one."""
    address = getattr(args, "address", None) or os.environ.get("JETWAKE_ADDRESS") \
        or DEFAULT_ADDRESS
    timeout = getattr(args, "timeout", None)
    try:
        return Client(address, token=token_of(args),
                      request_timeout=max(timeout, 1.0) if timeout else 300.0)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
