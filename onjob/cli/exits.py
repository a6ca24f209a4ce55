"""The one exit-code table of `onjob`, and the errors a command raises to leave by it.

A command returns `Exit.OK` (or another member) or raises a `CliError`; `main` prints the
error's message on stderr, prefixed with the command, and exits with its code. Anything
else that escapes is a bug: Python's traceback and exit 1.
"""

from __future__ import annotations

import textwrap
from enum import IntEnum

from ..errors import OnjobError


class Exit(IntEnum):
    OK = 0
    FAILED = 1
    REFUSED = 2
    NOTHING = 3
    INTERRUPTED = 130
    PIPE_CLOSED = 141  # 128 + SIGPIPE, as a shell's own commands end


MEANING = {
    Exit.OK: "done",
    Exit.FAILED: "it ran and failed: a training run, a judge or loop stage, `onjob engine`'s "
    "launch, doctor's checks, the bundled model's download",
    Exit.REFUSED: "refused, nothing done: bad flags or settings, the database missing or "
    "held by another process, serve's port or engine child, the admin API said no",
    Exit.NOTHING: "nothing to do: train found nothing to train on, demo made no decision "
    "before --minutes",
    Exit.INTERRUPTED: "interrupted (Ctrl-C)",
    Exit.PIPE_CLOSED: "the reader of its output stopped reading (`| head`): nothing more said",
}


def table() -> str:
    """The table as `onjob --help` prints it and docs/cli.md holds it."""
    rows = (
        textwrap.fill(MEANING[c], 80, initial_indent=f"  {int(c):<4} ", subsequent_indent=" " * 7)
        for c in Exit
    )
    return "exit codes:\n" + "\n".join(rows)


class CliError(OnjobError):
    """Said on stderr as `onjob COMMAND: message` (each line), then exit `code`."""

    code = Exit.REFUSED


class Refused(CliError):
    code = Exit.REFUSED


class Failed(CliError):
    code = Exit.FAILED


class NothingToDo(CliError):
    code = Exit.NOTHING
