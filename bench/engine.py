"""Local engine throughput with the real SmolLM2-135M: tokens/s at concurrency 1, 4 and 8,
free and under a JSON schema, side by side.

Every request decodes exactly `--tokens` tokens, sampled at temperature 1, so levels
differ only in how many streams share the batch. Free requests use `ignore_eos`;
schema requests use `response_format` with `SCHEMA`, whose answer cannot be complete
in fewer than 64 lines, so the grammar never ends one early either. Each level runs
free, then under the schema, `--repeats` times interleaved, on one engine process
(exactly as `onjob engine` starts it); the medians are reported, as wall-clock tokens/s
and as tokens per CPU-second of the engine process (what a shared machine's neighbours
do not skew).

    .venv/bin/python bench/engine.py [--tokens 64] [--levels 1 4 8] [--threads N]

Prints a table and writes bench/results/engine-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path

from openai import AsyncOpenAI

from onjob import bundled
from onjob.cli.process import EngineProcess

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a hash table is.",
    "Give me three tips for learning to cook.",
    "Describe a walk in the mountains.",
    "What makes a good API?",
    "Tell me a story about a robot and a cat.",
    "Why is the sky blue?",
    "List some uses of a paperclip.",
]


# A list of 64 strings at least: more tokens than any `--tokens` this bench uses.
SCHEMA = {
    "type": "object",
    "properties": {
        "lines": {"type": "array", "items": {"type": "string"}, "minItems": 64},
    },
    "required": ["lines"],
    "additionalProperties": False,
}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far: the engine's cost whatever else the
    machine runs (wall-clock tokens/s on a shared machine measures the neighbours too)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def level(
    client: AsyncOpenAI,
    concurrency: int,
    requests_each: int,
    tokens: int,
    schema: bool = False,
    pid: int | None = None,
) -> dict:
    latencies: list[float] = []
    if schema:
        shape: dict = {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "lines", "schema": SCHEMA},
            }
        }
    else:
        shape = {"extra_body": {"ignore_eos": True}}

    async def worker(w: int) -> int:
        done = 0
        for i in range(requests_each):
            started = time.perf_counter()
            r = await client.chat.completions.create(
                model=bundled.MODEL_NAME,
                messages=[{"role": "user", "content": PROMPTS[(w + i) % len(PROMPTS)]}],
                max_tokens=tokens,
                temperature=1.0,
                seed=w * 100 + i,
                **shape,
            )
            latencies.append(time.perf_counter() - started)
            assert r.usage.completion_tokens == tokens, r.usage
            done += r.usage.completion_tokens
        return done

    started = time.perf_counter()
    cpu = cpu_seconds(pid) if pid else 0.0
    counts = await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - started
    cpu = cpu_seconds(pid) - cpu if pid else 0.0
    return {
        "schema": schema,
        "concurrency": concurrency,
        "engine_cpu_s": round(cpu, 2),
        "tokens_per_cpu_s": round(sum(counts) / cpu, 1) if cpu else None,
        "requests": concurrency * requests_each,
        "tokens": sum(counts),
        "wall_s": round(wall, 2),
        "tokens_per_s": round(sum(counts) / wall, 1),
        "mean_request_s": round(sum(latencies) / len(latencies), 2),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per completion")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--requests-each", type=int, default=2, help="requests per client")
    parser.add_argument("--threads", type=int, help="engine torch threads")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per level and shape (medians reported)"
    )
    args = parser.parse_args()

    bundled.prepare()
    engine_args = ["--threads", str(args.threads)] if args.threads else []
    results = []
    with EngineProcess(engine_args) as engine:
        client = AsyncOpenAI(base_url=engine.url, api_key="x", max_retries=0, timeout=600)
        pid = engine.proc.pid
        await level(client, 1, 1, 8)  # warm-up
        await level(client, 1, 1, 8, schema=True)  # warm-up: xgrammar's import, the compile
        for c in args.levels:
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(args.repeats):  # interleaved, so both see the same neighbours
                for schema in (False, True):
                    runs[schema].append(
                        await level(client, c, args.requests_each, args.tokens, schema, pid)
                    )
            free, constrained = (_median(runs[False]), _median(runs[True]))
            for key in ("tokens_per_s", "tokens_per_cpu_s"):
                constrained[f"{key}_vs_free"] = round(constrained[key] / free[key], 2)
            results += [free, constrained]
            print(
                f"concurrency {c:>2}: free {free['tokens_per_s']:>6.1f} tokens/s "
                f"({free['tokens_per_cpu_s']} per engine CPU-s), "
                f"schema {constrained['tokens_per_s']:>6.1f} tokens/s "
                f"({constrained['tokens_per_cpu_s']} per engine CPU-s): "
                f"{constrained['tokens_per_s_vs_free']:.0%} of free, "
                f"{constrained['tokens_per_cpu_s_vs_free']:.0%} per CPU-s",
                flush=True,
            )
    free_rows = [r for r in results if not r["schema"]]
    base = free_rows[0]["tokens_per_s"]
    for row in results:
        row["speedup_vs_first"] = round(row["tokens_per_s"] / base, 2)
    print(
        "speedup over free concurrency",
        free_rows[0]["concurrency"],
        ":",
        ", ".join(f"c={r['concurrency']}: {r['speedup_vs_first']}x" for r in free_rows),
    )
    out = Path(__file__).parent / "results" / f"engine-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "bench": "engine",
                "model": bundled.MODEL_NAME,
                "tokens_per_completion": args.tokens,
                "schema": SCHEMA,
                "repeats": args.repeats,
                "load_at_end": os.getloadavg(),
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "levels": results,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


def _median(runs: list[dict]) -> dict:
    """The run with the median tokens/s, with every run's figures beside it."""
    ordered = sorted(runs, key=lambda r: r["tokens_per_s"])
    return {
        **ordered[len(ordered) // 2],
        "tokens_per_cpu_s": statistics.median(r["tokens_per_cpu_s"] for r in runs),
        "runs_tokens_per_s": [r["tokens_per_s"] for r in runs],
        "runs_tokens_per_cpu_s": [r["tokens_per_cpu_s"] for r in runs],
    }


if __name__ == "__main__":
    asyncio.run(main())
