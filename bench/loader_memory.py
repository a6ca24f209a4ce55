"""Where the server's memory goes while it loads: the RSS of a process that only loads
spool segments into DuckDB (`Store.load_segment`, as the collector does), one segment
after another, under each DuckDB `memory_limit` given.

Each segment holds `--per-segment` exchange lines (a short request and answer, 100
prompt and 30 completion token ids, 30 logprobs). If RSS climbs to near the limit and
stays there, the growth seen in `bench/soak.py` is DuckDB's buffer pool filling up to
`collector.duckdb_memory_limit`, not a leak; if it climbs past the limit, it is not.

    .venv/bin/python bench/loader_memory.py                         # 96MB, 256MB, 1GB
    .venv/bin/python bench/loader_memory.py --limits 96MB --segments 1200

Writes bench/results/loader_memory-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import results_file

from onjob.collector.records import ExchangeRecord, encode, to_json
from onjob.collector.store import Store


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def write_segment(path: Path, first: int, count: int, rng: random.Random) -> None:
    with open(path, "wb") as f:
        for n in range(first, first + count):
            record = ExchangeRecord(
                id=f"x{n}",
                ts=time.time(),
                trajectory_id=f"t{n}",
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


def run(limit: str, segments: int, per_segment: int, every: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="onjob-loader-memory-"))
    store = Store(work / "onjob.duckdb", memory_limit=limit)
    rng, samples = random.Random(0), []
    try:
        for i in range(segments):
            segment = work / f"segment-{i:06d}.jsonl"
            write_segment(segment, i * per_segment, per_segment, rng)
            store.load_segment(segment)
            segment.unlink()
            if i % every == 0 or i == segments - 1:
                samples.append(
                    {"segments": i + 1, "rows": (i + 1) * per_segment, "rss_mb": rss_mb()}
                )
                print(
                    f"{limit:>6}  {i + 1:>5} segments  rss {samples[-1]['rss_mb']:7.1f} MB",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        store.close()
    half = samples[len(samples) // 2 :]
    return {
        "memory_limit": limit,
        "samples": samples,
        "rss_max_mb": max(s["rss_mb"] for s in samples),
        "rss_second_half_spread_mb": max(s["rss_mb"] for s in half)
        - min(s["rss_mb"] for s in half),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limits", nargs="+", default=["96MB", "256MB", "1GB"])
    parser.add_argument("--segments", type=int, default=600)
    parser.add_argument("--per-segment", type=int, default=500)
    parser.add_argument("--every", type=int, default=50, help="sample RSS every N segments")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: this limit, JSON out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run(args.one, args.segments, args.per_segment, args.every)))
        return
    runs = []
    for limit in args.limits:  # each in a process of its own: freed memory is not returned
        more = ["--segments", str(args.segments), "--per-segment", str(args.per_segment)]
        more += ["--every", str(args.every), "--one", limit]
        child = subprocess.run(
            [sys.executable, __file__, *more], stdout=subprocess.PIPE, text=True, check=True
        )
        runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    for r in runs:
        print(
            f"memory_limit {r['memory_limit']:>6}: peak RSS {r['rss_max_mb']:.0f} MB, "
            f"second-half spread {r['rss_second_half_spread_mb']:.0f} MB"
        )
    results_file.save("loader_memory", {"args": vars(args), "runs": runs})


if __name__ == "__main__":
    main()
