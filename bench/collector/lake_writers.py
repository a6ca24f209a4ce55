"""Writers into one DuckLake at once: commits/s and exchanges/s with 1, 4 and 8 writer
processes, each a host committing its own batches of exchange rows, into a lake whose
catalog is a throwaway Postgres cluster on this machine and whose files lie in a
directory beside (the ground under issue 65's many hosts: what DuckLake's optimistic
commits take before onjob's own work is added).

Each writer (`onjob.testing.lake_writer`) attaches the lake, then for `--seconds` commits
batches of `--batch` rows shaped as the exchanges table's (ids, a request and an answer
of `--bytes` each), retrying a commit that clashes with another's. Reported per writer
count: commits/s, exchanges/s, clashes retried, and every row there once.

    .venv/bin/python -m bench.collector.lake_writers                 # 1, 4, 8 writers, 10 s
    .venv/bin/python -m bench.collector.lake_writers --writers 1 2 --batch 1000
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb

from bench import harness
from onjob.collector import lake
from onjob.testing.postgres import Postgres


def run(writers: int, seconds: float, batch: int, size: int, postgres: Postgres, work: Path):
    """`writers` processes into a new lake for `seconds`; their totals."""
    catalog = postgres.database(f"w{writers}")
    data = work / f"w{writers}"
    con = duckdb.connect()
    lake.attach(con, catalog, str(data))
    lake.migrate(con)
    given = ["--seconds", str(seconds), "--batch", str(batch), "--bytes", str(size)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "onjob.testing.lake_writer",
                catalog,
                str(data),
                f"host{n}",
                *given,
                "--wait",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(writers)
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    totals = [json.loads(p.stdout.readline()) for p in procs]
    for p in procs:
        p.wait()
    commits = sum(t["commits"] for t in totals)
    rows, distinct = con.execute("SELECT count(*), count(DISTINCT id) FROM exchanges").fetchone()
    con.close()
    return {
        "writers": writers,
        "commits": commits,
        "clashes": sum(t["clashes"] for t in totals),
        "commits_per_s": commits / seconds,
        "exchanges_per_s": rows / seconds,
        "rows": rows,
        "every_row_once": rows == distinct == commits * batch,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--seconds", type=float, default=10.0, help="each writer count's run")
    parser.add_argument("--batch", type=int, default=200, help="exchanges per commit")
    parser.add_argument("--bytes", type=int, default=4000, help="a request's and an answer's")
    args = harness.parse(parser)
    work = Path(tempfile.mkdtemp(prefix="onjob-lake-writers-"))
    results = []
    try:
        with Postgres() as postgres:
            for n in args.writers:
                r = run(n, args.seconds, args.batch, args.bytes, postgres, work)
                results.append(r)
                print(
                    f"{n} writer{'s' * (n > 1)}: {r['commits_per_s']:,.1f} commits/s, "
                    f"{r['exchanges_per_s']:,.0f} exchanges/s, {r['clashes']} clashes retried, "
                    f"every row once: {r['every_row_once']}",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    settings = {"seconds": args.seconds, "batch": args.batch, "bytes": args.bytes}
    harness.save("lake_writers", {"settings": settings, "results": results}, args.out)
    return 0 if all(r["every_row_once"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
