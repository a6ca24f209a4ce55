"""Where the loader's CPU goes, statement by statement, and how it depends on the size of
a load.

For each `--segment-mb` size, a fresh collector spools `--exchanges` exchanges of
bench/collector/ingest.py's agent mix into segments of that size (nothing loads meanwhile), then
loads them all in one flush, as a server that fell behind does: one load per segment.
Each DuckDB statement `Store.load` runs is timed in the loader thread's CPU time
(`time.thread_time`; `collector.duckdb_threads` is 1, so DuckDB works in that thread),
and so is placing the lines in their trajectories. Reported per exchange.

    .venv/bin/python -m bench.collector.loader_statements                    # ~2 minutes
    .venv/bin/python -m bench.collector.loader_statements --exchanges 60000 --segment-mb 8 16 64
    .venv/bin/python -m bench.collector.loader_statements --segment-mb 0.7 --exchanges 8000 \
        --prefill 200000

`--prefill N` first fills the table with N exchanges (in 64 MB loads, not measured): whether
a load's cost grows with the table.

Writes bench/results/loader_statements-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import tempfile
import time
from pathlib import Path

from bench import harness
from bench.collector.ingest import Traffic
from onjob.collector import Collector, CollectorSettings


def _name(sql: str) -> str:
    """A statement's name: its first 60 characters, string constants as `?` (so lookups of
    different ids add up as one)."""
    return re.sub(r"'[^']*'(, '[^']*')*", "?", " ".join(sql.split()))[:60]


class _Timed:
    """The store's connection, with each statement's CPU time (fetches included) added up."""

    def __init__(self, con, cost: collections.Counter) -> None:
        self._con, self._cost = con, cost

    def execute(self, sql: str, *args):
        t0 = time.thread_time()
        result = self._con.execute(sql, *args)
        self._cost[_name(sql)] += time.thread_time() - t0
        return _Fetched(result, _name(sql), self._cost)

    def __getattr__(self, name: str):
        return getattr(self._con, name)


class _Fetched:
    def __init__(self, result, name: str, cost: collections.Counter) -> None:
        self._result, self._name, self._cost = result, name, cost

    def fetchall(self):
        t0 = time.thread_time()
        rows = self._result.fetchall()
        self._cost[self._name] += time.thread_time() - t0
        return rows

    def fetchone(self):
        t0 = time.thread_time()
        row = self._result.fetchone()
        self._cost[self._name] += time.thread_time() - t0
        return row

    def __getattr__(self, name: str):  # `description`, for `Store.rows`
        return getattr(self._result, name)


async def measure(exchanges: int, segment_bytes: int, seed: int, prefill: int = 0) -> dict:
    directory = Path(tempfile.mkdtemp(prefix="onjob-loader-statements-"))
    settings = CollectorSettings(
        db=directory / "onjob.duckdb", flush_interval_s=3600, max_segment_bytes=segment_bytes
    )
    collector = Collector(settings)
    await collector.start()
    traffic = Traffic(collector, seed)
    if prefill:  # a table that already holds this many, loaded in 64 MB pieces
        collector.spool.max_segment_bytes = 64 << 20
        for _ in range(prefill):
            collector.log(traffic.next())
        await collector.flush()
        collector.spool.max_segment_bytes = segment_bytes
    cost: collections.Counter = collections.Counter()
    store = await collector.query(lambda store: store)
    store.con = _Timed(store.con, cost)
    load = store.load

    def timed_load(paths, place):
        """`Store.load` with the collector's placing of the lines (Python) timed apart."""

        def timed_place(rows):
            t0 = time.thread_time()
            placed = place(rows)
            cost["placing the lines (Python)"] += time.thread_time() - t0
            return placed

        return load(paths, timed_place)

    store.load = timed_load
    for _ in range(exchanges):
        collector.log(traffic.next())
    segments = len(collector.spool.segments())
    cpu0 = await collector.query(lambda _store: time.thread_time())
    await collector.flush()
    cpu = await collector.query(lambda _store: time.thread_time()) - cpu0
    assert collector.loaded == prefill + exchanges, (collector.loaded, exchanges)
    await collector.close()
    return {
        "prefill": prefill,
        "segment_mb": segment_bytes / 1e6,
        "loads": segments,
        "exchanges_per_load": round(exchanges / segments),
        "loader_cpu_us_per_exchange": round(cpu / exchanges * 1e6, 1),
        "statements_us_per_exchange": {
            name: round(s / exchanges * 1e6, 2) for name, s in cost.most_common()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchanges", type=int, default=30_000, help="exchanges per size")
    parser.add_argument(
        "--segment-mb",
        type=float,
        nargs="+",
        default=[11, 22, 44],
        help="spool segment sizes, in MB: the size of each load",
    )
    parser.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="exchanges already in the table before the measured loads (does a load's cost "
        "grow with the table?)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic traffic")
    args = harness.parse(parser)
    rows = []
    for mb in args.segment_mb:
        row = asyncio.run(measure(args.exchanges, int(mb * 1e6), args.seed, args.prefill))
        rows.append(row)
        print(
            f"{mb:g} MB loads ({row['exchanges_per_load']:,} exchanges each, {row['loads']} "
            f"loads): {row['loader_cpu_us_per_exchange']} us of loader CPU per exchange",
            flush=True,
        )
        for name, us in list(row["statements_us_per_exchange"].items())[:8]:
            print(f"  {us:7.2f} us  {name}")
    harness.save(
        "loader_statements",
        {"exchanges": args.exchanges, "prefill": args.prefill, "sizes": rows},
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
