"""Workers on one DuckLake (issue 65 item 3): what the lineages' leases cost and how soon
a lineage a killed worker held is worked again. The catalog is a throwaway Postgres
cluster on this machine; each worker a process (`onjob.testing.lake_worker`) claiming its
leases as the loop's holds do (`collector/jobs.py`).

- *Leases under load*: 1, 4, 8 and 16 workers, each renewing its own lineage's lease
  every `--every` seconds (the loop renews a third of `collector.job_lease_s` apart:
  10 s by default; 1 s here is ten times that pace): the claims' latency (p50, p99) and
  commits/s of `lake_jobs` between them (every claim one commit, a clash retried inside).
- *Take-over*: one worker holds a lineage and renews it; another asks for it every
  `--interval` seconds (`loop.interval_s`); the first is killed (SIGKILL) and the time
  until the second holds it is measured, at a lease of `--lease` seconds.

    .venv/bin/python -m bench.collector.lake_workers
    .venv/bin/python -m bench.collector.lake_workers --lease 30 --takeovers 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from bench import harness
from onjob.collector import jobs, lake
from onjob.testing.postgres import Postgres


def _worker(catalog: str, data: Path, holder: str, *lineages: str, **flags) -> subprocess.Popen:
    given = [f"--{k}={v}" for k, v in flags.items()]
    proc = subprocess.Popen(
        [sys.executable, "-m", "onjob.testing.lake_worker", catalog, str(data), holder,
         *lineages, *given],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _lake(postgres: Postgres, name: str, work: Path) -> tuple[str, Path]:
    catalog, data = postgres.database(name), work / name
    con = duckdb.connect()
    lake.attach(con, catalog, str(data))
    lake.migrate(con)
    jobs.make(con)
    con.close()
    return catalog, data


def leases(n: int, seconds: float, every: float, postgres: Postgres, work: Path) -> dict:
    """`n` workers renewing a lineage each for `seconds`: claim latency and commits/s."""
    catalog, data = _lake(postgres, f"leases{n}", work)
    procs = [
        _worker(catalog, data, f"w{i}", f"lineage{i}", every=every, lease=30, seconds=seconds)
        for i in range(n)
    ]
    said = [json.loads(line) for p in procs for line in p.stdout if line.strip()]
    for p in procs:
        p.wait()
    ms = sorted(s["ms"] for s in said)
    return {
        "workers": n,
        "claims": len(said),
        "claims_per_s": len(said) / seconds,
        "all_held": all(s["held"] for s in said),
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
    }


def takeover(lease: float, interval: float, postgres: Postgres, work: Path, n: int) -> float:
    """Seconds from a holding worker's SIGKILL until another holds its lineage."""
    catalog, data = _lake(postgres, f"takeover{n}", work)
    first = _worker(catalog, data, "first", "agent", every=lease / 3, lease=lease)
    assert json.loads(first.stdout.readline())["held"]
    second = _worker(catalog, data, "second", "agent", every=interval, lease=lease)
    assert not json.loads(second.stdout.readline())["held"]
    time.sleep(lease / 2)  # mid-lease, as a worker dies mid-job
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed = time.time()
    for line in second.stdout:
        said = json.loads(line)
        if said["held"]:
            second.kill()
            second.wait()
            return said["t"] - killed
    raise RuntimeError("the second worker never took the lineage")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--seconds", type=float, default=10.0, help="each worker count's run")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between renewals")
    parser.add_argument("--lease", type=float, default=30.0, help="collector.job_lease_s")
    parser.add_argument("--interval", type=float, default=1.0, help="loop.interval_s")
    parser.add_argument("--takeovers", type=int, default=1, help="take-overs measured")
    args = harness.parse(parser)
    work = Path(tempfile.mkdtemp(prefix="onjob-lake-workers-"))
    results: dict = {"leases": [], "takeover_s": []}
    try:
        with Postgres() as postgres:
            for n in args.workers:
                r = leases(n, args.seconds, args.every, postgres, work)
                results["leases"].append(r)
                print(
                    f"{n} worker{'s' * (n > 1)}: {r['claims_per_s']:.1f} claims/s, "
                    f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
                    f"every claim held: {r['all_held']}",
                    flush=True,
                )
            for i in range(args.takeovers):
                took = takeover(args.lease, args.interval, postgres, work, i)
                results["takeover_s"].append(took)
                print(
                    f"take-over at a {args.lease:g} s lease, asked every {args.interval:g} s: "
                    f"{took:.1f} s after the holder's SIGKILL (killed half way through its lease)",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    settings = {k: getattr(args, k) for k in ("seconds", "every", "lease", "interval")}
    harness.save("lake_workers", {"settings": settings, "results": results}, args.out)
    return 0 if all(r["all_held"] for r in results["leases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
