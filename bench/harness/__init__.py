"""What every bench shares: its options, the quiet-machine check, the result writer and
starting processes on free ports.

- `options(parser)` adds `--out` (where the result goes; bench/results/ by default) and,
  for a timed bench, `--require-quiet`; `parse(parser)` parses the command line and, for
  a timed bench, samples the machine first (`quiet.check`: a warning naming the busiest
  other processes when they use more than a tenth of a core; fatal with
  `--require-quiet`).
- `results_file.save(bench, fields, out)`: `<out>/<bench>-<timestamp>.json` with the time,
  the commit (`git rev-parse HEAD`, and whether the tree is dirty) and the machine (cores,
  CPU model, memory).
- `procs.start(cmd, port, core)`: a server on a free port (`procs.free_port`), pinned to
  a core, waited for until it answers; `procs.fake_engine_cmd(port)`: the fake engine.
- `check`: `make lint`'s check that bench/ uses only onjob's public names.

Every bench runs from the repository root as `python -m bench.<room>.<name>`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.harness import quiet
from bench.harness.results_file import RESULTS, ROOT, path_for, save

__all__ = ["RESULTS", "ROOT", "options", "parse", "path_for", "quiet", "save"]


def options(
    parser: argparse.ArgumentParser, timed: bool = True, out: bool = True
) -> argparse.ArgumentParser:
    """Add the options every bench takes: `--out` when it writes a result (unless it has
    its own) and, when `timed`, `--require-quiet`."""
    try:
        if out:
            parser.add_argument(
                "--out", type=Path, default=RESULTS, help="the directory the JSON result goes to"
            )
    except argparse.ArgumentError:  # the bench has its own --out
        pass
    if timed:
        parser.add_argument(
            "--require-quiet",
            action="store_true",
            help="exit when other processes use more than 10%% of a core before the run",
        )
    return parser


def parse(
    parser: argparse.ArgumentParser,
    argv: list[str] | None = None,
    timed: bool = True,
    out: bool = True,
) -> argparse.Namespace:
    """The command line, parsed with `options` added; for a timed bench, the machine is
    checked for other busy processes first."""
    args = options(parser, timed, out).parse_args(argv)
    if timed:
        quiet.check(fatal=args.require_quiet)
    return args
