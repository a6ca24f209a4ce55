"""A group's alternatives sent as separate requests over one tool prompt: the local
engine with its last prefill kept (`prefix_cache`, the default) against without, side
by side, with the real SmolLM2-135M.

A group is `--group` requests of one choice each, sent at once (as an agent's rollouts
of one scenario, or a client that does not use `n`), over the calculator's question
with `TOOLS` (about 370 prompt tokens), each forcing one call (`tool_choice:
"required"`, `parallel_tool_calls: false`) of at most `--tokens` tokens. One request
with `n = --group` is the reference: its prompt is prefilled once either way. Two
engine processes (cache on, cache off) run the groups in turn, `--repeats` times
interleaved, so both see the same neighbours; medians are reported as wall seconds and
as CPU-seconds of the engine process (what a shared machine's neighbours do not skew).

    .venv/bin/python bench/prefill.py [--group 8] [--repeats 3] [--threads 2]

Prints a table and writes bench/results/prefill-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.engine import cpu_seconds
from examples.calculator import task
from onjob import bundled
from onjob.cli.process import EngineProcess


def _lookup(name: str, what: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Look up {what} in the company's tables (not public knowledge).",
            "parameters": {
                "type": "object",
                "properties": {
                    "key": {"type": "string", "description": f"the {what}'s identifier"},
                    "year": {"type": "integer", "description": "the year, e.g. 2024"},
                },
                "required": ["key"],
            },
        },
    }


# The calculator's tool and four table look-ups: a tool agent's usual prompt size.
TOOLS = [
    *task.TOOLS,
    _lookup("price_of", "a product's list price"),
    _lookup("stock_of", "a warehouse's stock level"),
    _lookup("owner_of", "an account's owner"),
    _lookup("region_of", "a customer's sales region"),
]


async def group(client: AsyncOpenAI, size: int, tokens: int, pid: int, n: bool) -> dict:
    body = {
        "model": bundled.MODEL_NAME,
        "messages": task.messages("What is 23 × 17?"),
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": tokens,
        "temperature": 1.0,
    }
    started, cpu = time.perf_counter(), cpu_seconds(pid)
    if n:
        answers = [await client.chat.completions.create(**body, n=size, seed=1)]
    else:
        answers = await asyncio.gather(
            *(client.chat.completions.create(**body, seed=i) for i in range(size))
        )
    wall, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu
    details = [a.usage.prompt_tokens_details for a in answers]
    return {
        "wall_s": round(wall, 3),
        "engine_cpu_s": round(cpu, 3),
        "prompt_tokens": answers[0].usage.prompt_tokens,
        "completion_tokens": sum(a.usage.completion_tokens for a in answers),
        "cached_requests": sum(d is not None and d.cached_tokens > 0 for d in details),
    }


def _median(runs: list[dict]) -> dict:
    return {
        **runs[0],
        "wall_s": statistics.median(r["wall_s"] for r in runs),
        "engine_cpu_s": statistics.median(r["engine_cpu_s"] for r in runs),
        "runs_wall_s": [r["wall_s"] for r in runs],
        "runs_engine_cpu_s": [r["engine_cpu_s"] for r in runs],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", type=int, default=8, help="alternatives per group")
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens of each")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="engine torch threads")
    args = parser.parse_args()

    bundled.prepare()
    engine_args = ["--threads", str(args.threads)] if args.threads else []
    shapes = {"separate, cache off": (False, False), "separate, cache on": (True, False)}
    shapes["one request with n, cache on"] = (True, True)
    runs: dict[str, list[dict]] = {name: [] for name in shapes}
    off = EngineProcess(engine_args, env={"ONJOB_ENGINE_PREFIX_CACHE": "false"})
    with off, EngineProcess(engine_args) as on:
        engines = {False: off, True: on}
        clients = {
            cached: AsyncOpenAI(base_url=e.url, api_key="x", max_retries=0, timeout=600)
            for cached, e in engines.items()
        }
        for cached in (False, True):  # warm-up: xgrammar's import, the grammar's compile
            await group(clients[cached], 2, 8, engines[cached].proc.pid, n=False)
        for _ in range(args.repeats):
            for name, (cached, n) in shapes.items():
                pid = engines[cached].proc.pid
                runs[name].append(await group(clients[cached], args.group, args.tokens, pid, n))
    results = {name: _median(r) for name, r in runs.items()}
    base = results["separate, cache off"]
    for name, r in results.items():
        r["wall_vs_cache_off"] = round(r["wall_s"] / base["wall_s"], 2)
        r["cpu_vs_cache_off"] = round(r["engine_cpu_s"] / base["engine_cpu_s"], 2)
        print(
            f"{name:<30} {r['wall_s']:6.2f} s wall ({r['wall_vs_cache_off']:.2f}x), "
            f"{r['engine_cpu_s']:6.2f} engine CPU-s ({r['cpu_vs_cache_off']:.2f}x), "
            f"{r['cached_requests']}/{1 if name.startswith('one') else args.group} requests "
            f"cached, {r['prompt_tokens']} prompt tokens, {r['completion_tokens']} generated",
            flush=True,
        )
    out = Path(__file__).parent / "results" / f"prefill-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "bench": "prefill",
                "model": bundled.MODEL_NAME,
                "group": args.group,
                "max_tokens": args.tokens,
                "repeats": args.repeats,
                "threads": args.threads,
                "load_at_end": os.getloadavg(),
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "results": results,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(main())
