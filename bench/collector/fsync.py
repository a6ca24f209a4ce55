"""What each `collector.fsync` policy costs: requests/s through one `onjob serve` process
(the fake engine on the other core, its answers at once), and spool appends/s alone.

Policies, side by side in one run (each its own server, one after another, with the
same load):

- `never`: the kernel holds the spool; a killed process loses nothing, a power loss or
  a lost VM the last ~30 s the kernel had not written back (Linux's dirty expiry);
- `segment` (the default): each segment is flushed when it closes (every
  `collector.rotate_s`, and the loader's own each `flush_interval_s`), with its rename;
  a power loss takes the open segment's lines;
- `always`: each exchange is flushed before its answer leaves.

    .venv/bin/python -m bench.collector.fsync                 # ~2 minutes
    .venv/bin/python -m bench.collector.fsync --seconds 20 --concurrency 32

The disk is this machine's: on another, `always` costs what its disk takes per flush.
Writes bench/results/fsync-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import harness
from bench.proxy import proxy_overhead
from onjob.collector.spool import Spool

POLICIES = ("never", "segment", "always")
LINE = b'{"kind": "exchange", "request": "' + b"x" * 4000 + b'"}'  # ~4 KB, an agent's turn


def appends_per_s(policy: str, directory: Path, seconds: float) -> float:
    """Spool appends/s alone, rotating every 1,000 lines (about a busy second's)."""
    spool = Spool(directory, fsync=policy)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        spool.append(LINE)
        n += 1
        if n % 1000 == 0:
            spool.rotate()
    spool.close()
    return n / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15, help="of load per policy (15)")
    parser.add_argument("--warmup", type=float, default=3, help="seconds before timing (3)")
    parser.add_argument("--concurrency", type=int, default=16, help="connections (16)")
    args = harness.parse(parser)
    rows = []
    engine, engine_port = proxy_overhead.fake_engine(core=1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for policy in POLICIES:
                alone = appends_per_s(policy, Path(tmp) / f"spool-{policy}", 3.0)
                db = Path(tmp) / f"{policy}.duckdb"
                env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_COLLECTOR__FSYNC": policy}
                proc, port = proxy_overhead.proxy(engine_port, db, 0, **env)
                try:
                    m = proxy_overhead.load(port, "agent", False, args.concurrency, args)
                finally:
                    proc.terminate()
                    proc.wait()
                row = {"policy": policy, "appends_per_s": round(alone), **m}
                rows.append(row)
                print(
                    f"{policy:8s} {m['rps']:8.0f} req/s  p50 {m['p50_ms']:6.1f} ms  "
                    f"p99 {m['p99_ms']:6.1f} ms  errors {m['errors']}   "
                    f"spool alone {alone:9.0f} appends/s"
                )
    finally:
        engine.terminate()
        engine.wait()
    base = rows[0]["rps"]
    for row in rows:
        row["rps_of_never"] = round(row["rps"] / base, 3) if base else None
    load = os.getloadavg()
    harness.save("fsync", {"args": vars(args), "load_after": load, "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
