"""Where the server's memory goes while it loads: the RSS of a process that only loads
spool segments into DuckDB (`Store.load_segment`, as the collector does), one segment
after another, under each DuckDB `memory_limit` given, with `Store.release_memory` after
each load (as the collector does) and without it (`--release off`: as before it).

Each segment holds `--per-segment` exchange lines (a short request and answer, 100
prompt and 30 completion token ids, 30 logprobs; random exchange and trajectory ids, as
the proxy makes them). Sampled beside RSS: DuckDB's own account of its buffers
(`duckdb_memory()`) and of them its primary keys' index (ART_INDEX: held whole once a
load touches it, so it grows with the rows), the entries in its eviction queues
(`duckdb_eviction_queues()`, stale ones included) and the bytes malloc has handed out
(glibc's `mallinfo2`), where DuckDB keeps each queue entry's block record.

    .venv/bin/python -m bench.collector.loader_memory                         # 96MB, 256MB, 1GB
    .venv/bin/python -m bench.collector.loader_memory --limits 1GB --per-segment 19 --segments 4000
        # the soak's loads: 19 exchanges every 0.25 s; 4,000 of them are ~17 minutes' worth

Writes bench/results/loader_memory-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import harness
from onjob.collector.ids import new_id
from onjob.collector.records import ExchangeRecord, encode, to_json
from onjob.collector.store import Store

_MALLINFO2 = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2.split()]


def malloc_mb() -> float | None:
    """Bytes malloc has handed out and not had back (glibc only)."""
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def write_segment(path: Path, count: int, rng: random.Random) -> None:
    with open(path, "wb") as f:
        for _ in range(count):
            record = ExchangeRecord(
                id=new_id("chatcmpl-"),  # random, as the proxy's: the primary keys' index
                ts=time.time(),
                trajectory_id=new_id("traj_"),
                turn=0,
                scenario_id="s",
                scenario_key="k",
                scenario_keyed="k",
                request=to_json(
                    {"model": "agent", "messages": [{"role": "user", "content": "hi " * 20}]}
                ),
                response=to_json(
                    {"choices": [{"message": {"role": "assistant", "content": "ok " * 30}}]}
                ),
                prompt_token_ids=[rng.randrange(50_000) for _ in range(100)],
                completion_token_ids=[[rng.randrange(50_000) for _ in range(30)]],
                completion_logprobs=[[-rng.random() for _ in range(30)]],
            )
            f.write(encode(record) + b"\n")


def run(limit: str, release: bool, segments: int, per_segment: int, every: int) -> dict:
    if not release:
        Store.release_memory = lambda self: False  # as before it was there
    work = Path(tempfile.mkdtemp(prefix="onjob-loader-memory-"))
    store = Store(work / "onjob.duckdb", threads=1, memory_limit=limit)  # as the collector
    rng, samples = random.Random(0), []
    start = time.monotonic()
    try:
        for i in range(segments):
            segment = work / f"segment-{i:06d}.jsonl"
            write_segment(segment, per_segment, rng)
            store.load_segment(segment)
            segment.unlink()
            if i % every == 0 or i == segments - 1:
                duckdb_mb, index_mb, queued = store.con.execute(
                    "SELECT (SELECT sum(memory_usage_bytes) FROM duckdb_memory()) / 2^20, "
                    "(SELECT memory_usage_bytes FROM duckdb_memory() WHERE tag = 'ART_INDEX') "
                    "/ 2^20, (SELECT sum(approximate_size) FROM duckdb_eviction_queues())"
                ).fetchone()
                sample = {
                    "segments": i + 1,
                    "rows": (i + 1) * per_segment,
                    "rss_mb": round(rss_mb(), 1),
                    "duckdb_mb": round(duckdb_mb, 1),
                    "index_mb": round(index_mb, 1),
                    "queue_entries": int(queued),
                    "malloc_mb": round(malloc_mb() or float("nan"), 1),
                    "seconds": round(time.monotonic() - start, 1),
                }
                samples.append(sample)
                print(
                    f"{limit:>6} release {'on ' if release else 'off'} {i + 1:>5} segments  "
                    f"rss {sample['rss_mb']:7.1f} MB  duckdb {sample['duckdb_mb']:6.1f} MB (index "
                    f"{sample['index_mb']:5.1f})  "
                    f"queued {sample['queue_entries']:7d}  malloc {sample['malloc_mb']:6.1f} MB",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        store.close()
    half = samples[len(samples) // 2 :]
    return {
        "memory_limit": limit,
        "release": release,
        "samples": samples,
        "rss_max_mb": max(s["rss_mb"] for s in samples),
        "rss_second_half_spread_mb": max(s["rss_mb"] for s in half)
        - min(s["rss_mb"] for s in half),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limits", nargs="+", default=["96MB", "256MB", "1GB"])
    parser.add_argument("--release", choices=["both", "on", "off"], default="both")
    parser.add_argument("--segments", type=int, default=600)
    parser.add_argument("--per-segment", type=int, default=500)
    parser.add_argument("--every", type=int, default=50, help="sample RSS every N segments")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: this limit, JSON out
    parser.add_argument("--one-release", choices=["on", "off"], help=argparse.SUPPRESS)
    args = harness.options(parser).parse_args()
    if args.one:
        run_args = (args.segments, args.per_segment, args.every)
        print(json.dumps(run(args.one, args.one_release == "on", *run_args)))
        return
    harness.quiet.check(fatal=args.require_quiet)
    runs = []
    releases = ["on", "off"] if args.release == "both" else [args.release]
    for limit in args.limits:  # each in a process of its own: freed memory is not returned
        for release in releases:
            more = ["--segments", str(args.segments), "--per-segment", str(args.per_segment)]
            more += ["--every", str(args.every), "--one", limit, "--one-release", release]
            child = subprocess.run(
                [sys.executable, "-m", __spec__.name, *more],
                stdout=subprocess.PIPE,
                text=True,
                check=True,
                cwd=harness.ROOT,
            )
            runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    for r in runs:
        first, last = r["samples"][0], r["samples"][-1]
        print(
            f"memory_limit {r['memory_limit']:>6}, release {'on ' if r['release'] else 'off'}: "
            f"RSS {first['rss_mb']:.0f} -> {last['rss_mb']:.0f} MB (peak {r['rss_max_mb']:.0f}), "
            f"DuckDB's index {first['index_mb']:.1f} -> {last['index_mb']:.1f} MB, "
            f"malloc {first['malloc_mb']:.0f} -> {last['malloc_mb']:.0f} MB, queue entries "
            f"{first['queue_entries']} -> {last['queue_entries']}, {last['seconds']:.0f} s"
        )
    harness.save("loader_memory", {"args": vars(args), "runs": runs}, args.out)


if __name__ == "__main__":
    main()
