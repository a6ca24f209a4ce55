"""Local engine throughput with the real SmolLM2-135M: tokens/s at concurrency 1, 4 and 8,
free and under a JSON schema, side by side.

Every request decodes exactly `--tokens` tokens, sampled at temperature 1, so levels
differ only in how many streams share the batch. Free requests use `ignore_eos`;
schema requests use `response_format` with `SCHEMA`, whose answer cannot be complete
in fewer than 64 lines, so the grammar never ends one early either. Each level runs
free, then under the schema, on one engine process, exactly as `onjob engine`
starts it.

    .venv/bin/python bench/engine.py [--tokens 64] [--levels 1 4 8] [--threads N]

Prints a table and writes bench/results/engine-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
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


async def level(
    client: AsyncOpenAI, concurrency: int, requests_each: int, tokens: int, schema: bool = False
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
    counts = await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - started
    return {
        "schema": schema,
        "concurrency": concurrency,
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
    args = parser.parse_args()

    bundled.prepare()
    engine_args = ["--threads", str(args.threads)] if args.threads else []
    results = []
    with EngineProcess(engine_args) as engine:
        client = AsyncOpenAI(base_url=engine.url, api_key="x", max_retries=0, timeout=600)
        await level(client, 1, 1, 8)  # warm-up
        await level(client, 1, 1, 8, schema=True)  # warm-up: xgrammar's import, the compile
        for c in args.levels:
            free = await level(client, c, args.requests_each, args.tokens)
            constrained = await level(client, c, args.requests_each, args.tokens, schema=True)
            constrained["vs_free"] = round(constrained["tokens_per_s"] / free["tokens_per_s"], 2)
            results += [free, constrained]
            print(
                f"concurrency {c:>2}: free {free['tokens_per_s']:>6.1f} tokens/s, "
                f"schema {constrained['tokens_per_s']:>6.1f} tokens/s "
                f"({constrained['vs_free']:.0%} of free; "
                f"{free['mean_request_s']} / {constrained['mean_request_s']} s per request)",
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
                "load": os.getloadavg(),
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "levels": results,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(main())
