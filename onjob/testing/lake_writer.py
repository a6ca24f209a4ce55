"""A host writing its own batches of exchange rows into a DuckLake, as a process: the
writer `tests/test_lake.py` runs eight of at once and `bench.collector.lake_writers`
times. Each batch is one commit; DuckLake commits optimistically, so a commit that
clashes with another writer's is retried.

    python -m onjob.testing.lake_writer CATALOG DATA_PATH HOST --batches 5 --batch 40
    python -m onjob.testing.lake_writer CATALOG DATA_PATH HOST --seconds 10 --wait

Prints one JSON line at the end, `{"commits": n, "clashes": n}` (after `ready` with
`--wait`, which then waits for a line on stdin so that every writer starts together).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import duckdb

from ..collector import lake

_BATCH = """
INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, request, response)
SELECT ? || '-' || ? || '-' || i, now(), ? || '-' || i, 0, 's',
       to_json(repeat('r', ?)), to_json(repeat('a', ?))
FROM range(?) r(i)
"""


def commit_batch(con: duckdb.DuckDBPyConnection, host: str, n: int, batch: int, size: int) -> int:
    """Batch `n` of `host` committed, however many clashes it took; the clashes."""
    clashes = 0
    while True:
        try:
            con.execute("BEGIN TRANSACTION")
            con.execute(_BATCH, [host, n, host, size, size, batch])
            con.execute("COMMIT")
            return clashes
        except duckdb.TransactionException:
            with contextlib.suppress(duckdb.TransactionException):  # a failed COMMIT ended it
                con.execute("ROLLBACK")
            clashes += 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("catalog")
    parser.add_argument("data_path")
    parser.add_argument("host", help="this writer's name: its rows' ids begin with it")
    until = parser.add_mutually_exclusive_group(required=True)
    until.add_argument("--batches", type=int, help="commit this many batches")
    until.add_argument("--seconds", type=float, help="commit batches for this long")
    parser.add_argument("--batch", type=int, default=200, help="exchange rows per commit")
    parser.add_argument("--bytes", type=int, default=100, help="a request's and an answer's")
    parser.add_argument("--wait", action="store_true", help="say ready, start on a stdin line")
    args = parser.parse_args()
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # stdout is the report
    lake.attach(con, args.catalog, args.data_path)
    if args.wait:
        print("ready", flush=True)
        sys.stdin.readline()
    commits = clashes = 0
    end = time.perf_counter() + (args.seconds or 0)
    while commits < args.batches if args.batches is not None else time.perf_counter() < end:
        clashes += commit_batch(con, args.host, commits, args.batch, args.bytes)
        commits += 1
    print(json.dumps({"commits": commits, "clashes": clashes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
