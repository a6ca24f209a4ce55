"""The `onjob` command line: one parser, each group of verbs in its own module."""

from __future__ import annotations

import argparse
import os
import sys

from . import data, doctor, learning, model, release, serving


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onjob",
        description="An OpenAI-compatible proxy that learns from its own traffic.",
    )
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
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
