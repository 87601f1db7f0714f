"""The command line's exit codes, and the error that carries one to ``main``."""

from __future__ import annotations

__all__ = ["CliError", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_UNREACHABLE", "EXIT_AUTH",
           "EXIT_INTERRUPTED"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_AUTH, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130


class CliError(Exception):
    """One clear message for stderr, and the exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code
