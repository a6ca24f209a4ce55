"""A group's alternatives sent as separate requests over one tool prompt, in the local
engine's batcher with its last prefill kept (`prefix_cache`, the default) against
without, side by side, with the real SmolLM2-135M.

A group is `--group` requests of one choice each over the same prompt, queued at once
(as an agent's rollouts of one scenario, or a client that does not use `n`): the
calculator's question with its `multiply` tool rendered as the engine renders it (about 370
prompt tokens), each decoding `--tokens` tokens. One request with `n = --group`, whose
prompt is prefilled once either way, is the reference. `--lookups N` adds N table
look-up tools to the prompt (4: about 650 tokens). The batcher runs in this
process (no HTTP, no grammar: the prefill is what differs), the arms interleaved
`--repeats` times; medians are reported as wall seconds and as CPU-seconds of this
process (what a shared machine's neighbours do not skew).

    .venv/bin/python -m bench.engine.prefill [--group 8] [--tokens 8] [--repeats 3] [--lookups 0]

Prints a table and writes bench/results/prefill-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import msgspec
import torch

from bench import harness
from examples.calculator import task
from onjob import bundled
from onjob.engine import chat
from onjob.engine.batching import Batcher
from onjob.engine.model import LoadedModel
from onjob.engine.sampling import Sampling
from onjob.protocol.chat import Message
from onjob.protocol.fields import Tool


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


# Tools beside the calculator's, for a longer prompt (`--lookups`).
LOOKUPS = [
    _lookup("price_of", "a product's list price"),
    _lookup("stock_of", "a warehouse's stock level"),
    _lookup("owner_of", "an account's owner"),
    _lookup("region_of", "a customer's sales region"),
]


async def group(batcher: Batcher, prompt: list[int], size: int, tokens: int, n: bool) -> dict:
    def sampling(seed: int) -> Sampling:
        return Sampling(max_tokens=tokens, temperature=1.0, seed=seed, ignore_eos=True)

    started, cpu = time.perf_counter(), time.process_time()
    if n:
        gens = [batcher.submit(prompt, None, size, sampling(1))]
    else:
        gens = [batcher.submit(prompt, None, 1, sampling(i)) for i in range(size)]
    generated = 0
    for gen in gens:
        async for _ in gen.events():
            generated += 1
    return {
        "wall_s": round(time.perf_counter() - started, 3),
        "cpu_s": round(time.process_time() - cpu, 3),
        "generated": generated,
        "cached_requests": sum(g.cached_tokens > 0 for g in gens),
    }


def _median(runs: list[dict]) -> dict:
    return {
        **runs[0],
        "wall_s": statistics.median(r["wall_s"] for r in runs),
        "cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "runs_wall_s": [r["wall_s"] for r in runs],
        "runs_cpu_s": [r["cpu_s"] for r in runs],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", type=int, default=8, help="alternatives per group")
    parser.add_argument("--tokens", type=int, default=8, help="tokens each decodes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--lookups", type=int, default=0, choices=range(len(LOOKUPS) + 1))
    args = harness.parse(parser)

    torch.set_num_threads(args.threads)
    path = bundled.prepare()
    loaded = LoadedModel.load(path, name=bundled.MODEL_NAME, dtype="float32", device="cpu")
    messages = msgspec.convert(task.messages("What is 23 × 17?"), list[Message])
    tools = [*task.TOOLS, *LOOKUPS[: args.lookups]]
    text = chat.render(loaded.tokenizer, messages, msgspec.convert(tools, list[Tool]))
    prompt = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    batchers = {cached: Batcher(loaded, prefix_cache=cached) for cached in (False, True)}
    shapes = {
        "separate, cache off": (False, False),
        "separate, cache on": (True, False),
        "one request with n": (False, True),
    }
    runs: dict[str, list[dict]] = {name: [] for name in shapes}
    for b in batchers.values():
        b.start()
    try:
        for cached in (False, True):  # warm-up
            await group(batchers[cached], prompt, 2, 2, n=False)
        for _ in range(args.repeats):
            for name, (cached, n) in shapes.items():
                # A different prompt in between: no arm starts from a kept prefill.
                await group(batchers[cached], prompt[:8], 1, 1, n=False)
                runs[name].append(await group(batchers[cached], prompt, args.group, args.tokens, n))
    finally:
        for b in batchers.values():
            b.stop()
    results = {name: _median(r) for name, r in runs.items()}
    base = results["separate, cache off"]
    for name, r in results.items():
        r["wall_vs_cache_off"] = round(r["wall_s"] / base["wall_s"], 2)
        r["cpu_vs_cache_off"] = round(r["cpu_s"] / base["cpu_s"], 2)
        print(
            f"{name:<22} {r['wall_s']:6.2f} s wall ({r['wall_vs_cache_off']:.2f}x), "
            f"{r['cpu_s']:6.2f} CPU-s ({r['cpu_vs_cache_off']:.2f}x); "
            f"{r['cached_requests']} requests cached, {r['generated']} tokens generated",
            flush=True,
        )
    print(f"{len(prompt)} prompt tokens")
    harness.save(
        "prefill",
        {
            "model": bundled.MODEL_NAME,
            "prompt_tokens": len(prompt),
            "group": args.group,
            "lookups": args.lookups,
            "tokens": args.tokens,
            "repeats": args.repeats,
            "threads": args.threads,
            "load_at_end": os.getloadavg(),
            "results": results,
        },
        args.out,
    )


if __name__ == "__main__":
    asyncio.run(main())
