"""Where a bench's result goes: `<out>/<bench>-<timestamp>.json`, with the time and the
machine it ran on ahead of the bench's own fields."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def save(bench: str, fields: dict, out: Path = RESULTS, machine: dict | None = None) -> Path:
    result = {
        "bench": bench,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **(machine or {})},
        **fields,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{bench}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return path
