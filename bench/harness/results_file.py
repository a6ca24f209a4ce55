"""Where a bench's result goes: `<out>/<bench>-<timestamp>.json` (bench/results/ unless
`--out` says otherwise), with the time, the commit and the machine it ran on ahead of
the bench's own fields. The `<bench>` prefix is what compares a run with its history:
keep it when a bench changes."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def path_for(bench: str, out: Path = RESULTS, stamp: str | None = None) -> Path:
    """The file a result of `bench` is written to, now (or at the timestamp `stamp`)."""
    return Path(out) / f"{bench}-{stamp or time.strftime('%Y%m%d-%H%M%S')}.json"


def commit() -> dict:
    """The checkout's commit (`git rev-parse HEAD`) and whether the tree differs from it
    (tracked files only); None for each when git cannot tell."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": None if status is None else bool(status)}


def machine_info(extra: dict | None = None) -> dict:
    """Cores, CPU model, memory, Python and platform of this machine, then `extra`."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory_gib = round(pages * size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model or platform.processor() or None,
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "platform": platform.platform(),
        # The storage engine's release: figures move with it (docs/scaling.md).
        "duckdb": importlib.metadata.version("duckdb"),
        **(extra or {}),
    }


def save(
    bench: str,
    fields: dict,
    out: Path = RESULTS,
    machine: dict | None = None,
    *,
    path: Path | None = None,
    quiet: bool = False,
) -> Path:
    """Write `fields` as `bench`'s result, after its name, the time, the commit and the
    machine; at `path` when given (a result rewritten as a long run goes on), else at a new
    `path_for(bench, out)`. Returns the path."""
    result = {
        "bench": bench,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "commit": commit(),
        "machine": machine_info(machine),
        **fields,
    }
    path = Path(path) if path is not None else path_for(bench, out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    if not quiet:
        print(f"wrote {path}", flush=True)
    return path
