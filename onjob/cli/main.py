"""The `onjob` command line: one parser, each group of verbs in its own module."""

from __future__ import annotations

import argparse
import os
import sys

from .. import __version__
from . import data, doctor, learning, model, release, serving
from .exits import CliError, Exit, table


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onjob",
        description="An OpenAI-compatible proxy that learns from its own traffic.",
        epilog=table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"onjob {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (serving, learning, release, data, model, doctor):
        group.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # What onjob writes (the database and its WAL, the spool, checkpoints, snapshots, the
    # admin key) holds its users' traffic: its owner's alone, 0600 files, 0700 directories.
    os.umask(0o077)
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args) or Exit.OK)
        sys.stdout.flush()  # here, where a closed pipe is caught below, not at exit
        return code
    except CliError as exc:
        for line in str(exc).splitlines() or [""]:
            print(f"onjob {args.command}: {line}", file=sys.stderr)
        return int(exc.code)
    except KeyboardInterrupt:
        return int(Exit.INTERRUPTED)
    except BrokenPipeError:
        # `onjob sql ... | head -1`: the reader has what it wanted. Nothing more is written
        # (stdout pointed at /dev/null, so the flush at exit cannot fail again).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return int(Exit.PIPE_CLOSED)


if __name__ == "__main__":
    sys.exit(main())
