"""A worker holding lineages' leases in a DuckLake (`collector/jobs.py`), as a process:
what `bench.collector.lake_workers` runs several of at once. Every `--every` seconds it
claims (or renews) each of its lineages, as the loop's holds do a third of the lease
apart, and prints a JSON line per claim: `{"t": unix time, "lineage": name, "held":
whether it holds it now, "ms": the claim's latency}`.

    python -m onjob.testing.lake_worker CATALOG DATA_PATH HOLDER agent --every 1 --lease 30
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import duckdb

from ..collector import jobs, lake


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("catalog")
    parser.add_argument("data_path")
    parser.add_argument("holder", help="this worker's name in the leases")
    parser.add_argument("lineages", nargs="+")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between rounds")
    parser.add_argument("--lease", type=float, default=30.0, help="each lease's length (s)")
    parser.add_argument("--seconds", type=float, default=None, help="stop after (default: never)")
    args = parser.parse_args()
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # stdout is the report
    lake.attach(con, args.catalog, args.data_path)
    jobs.make(con)
    print("ready", flush=True)
    end = time.monotonic() + args.seconds if args.seconds is not None else float("inf")
    while time.monotonic() < end:
        started = time.monotonic()
        for lineage in args.lineages:
            asked = time.perf_counter()
            held = jobs.claim(con, lineage, args.holder, args.lease) is None
            ms = (time.perf_counter() - asked) * 1000
            said = {"t": time.time(), "lineage": lineage, "held": held, "ms": round(ms, 2)}
            print(json.dumps(said), flush=True)
        time.sleep(max(0.0, args.every - (time.monotonic() - started)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
