"""Is the machine quiet enough to time something? Before a timed run: one second of
/proc/stat and of every other process's CPU time, and a warning naming the busiest when
the others use more than a tenth of a core (a benchmark on 2 cores shares them with
anything else running: another benchmark, a test suite, a build)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
LIMIT = 0.10  # of one core, used by other processes, before a timed run is doubtful


def _busy_ticks() -> int:
    """Every core's non-idle ticks since boot (/proc/stat's first line, less idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:8]) - fields[3] - fields[4]


def _processes() -> dict[int, tuple[str, int, int]]:
    """pid -> (command, parent pid, user + system ticks) of every process now."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").strip()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        fields = rest.split()
        found[int(entry.name)] = (
            cmd.decode(errors="replace")[:120] or f"[{name}]",
            int(fields[1]),
            int(fields[11]) + int(fields[12]),
        )
    return found


def _mine(processes: dict[int, tuple[str, int, int]]) -> set[int]:
    """This process and those below it."""
    mine, grew = {os.getpid()}, True
    while grew:
        more = {pid for pid, (_, parent, _) in processes.items() if parent in mine} - mine
        mine |= more
        grew = bool(more)
    return mine


def others(seconds: float = 1.0) -> tuple[float, list[tuple[float, int, str]]]:
    """Cores' worth of CPU that everything but this process tree used over `seconds`, and
    the busiest other processes as (cores, pid, command), busiest first."""
    busy, before, started = _busy_ticks(), _processes(), time.monotonic()
    time.sleep(seconds)
    busy_after, after = _busy_ticks(), _processes()
    elapsed = (time.monotonic() - started) * TICK
    mine = _mine(after) | _mine(before)
    used = {
        pid: (ticks - before[pid][2]) / elapsed
        for pid, (_, _, ticks) in after.items()
        if pid in before
    }
    own = sum(cores for pid, cores in used.items() if pid in mine)
    total = max(0.0, (busy_after - busy) / elapsed - own)
    busiest = sorted(
        ((cores, pid, after[pid][0]) for pid, cores in used.items() if pid not in mine and cores),
        reverse=True,
    )
    return total, busiest[:5]


def check(fatal: bool = False, limit: float = LIMIT, seconds: float = 1.0) -> float:
    """Warn on stderr (or exit, when `fatal`) if other processes used more than `limit` of
    a core over `seconds`; returns the share they used."""
    try:
        total, busiest = others(seconds)
    except OSError:  # no /proc: nothing to say
        return 0.0
    if total > limit:
        lines = [f"  {cores:5.0%} of a core  pid {pid}  {cmd}" for cores, pid, cmd in busiest]
        print(
            f"WARNING: the machine is not quiet: other processes used {total:.0%} of a core "
            f"over {seconds:g} s (more than {limit:.0%}); timings will be noisy. Busiest:",
            *lines,
            sep="\n",
            file=sys.stderr,
            flush=True,
        )
        if fatal:
            sys.exit("not quiet: stop those, or run without --require-quiet")
    return total
