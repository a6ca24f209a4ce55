"""The engines side by side on the real SmolLM2-135M: the local engine and vLLM (its CPU
build here), one after the other in one run, same model, same requests.

For each engine, started exactly as `onjob engine [--backend vllm]` starts it:

- start time: the process started to its `/health` answering 200;
- memory: the resident set of the engine's whole process tree, idle after start and at
  the end (vLLM runs an API server, an engine core and a worker);
- tokens/s at each concurrency (`--levels`, default 1 8 32): every request decodes
  exactly `--tokens` tokens at temperature 1 (`ignore_eos`), so levels differ only in how
  many streams share the batch; also per CPU-second of the engine's processes (what a
  busy machine's neighbours do not skew);
- time to first token: streamed requests at concurrency 1 and 8, the first content chunk;
- adapter load: `POST /v1/load_lora_adapter` of a rank-8 LoRA checkpoint as the trainer
  writes one, twice (two adapters);
- mixed-adapter batches: concurrency 8 with the requests spread over the base model and
  the two adapters, against the same all on the base model;
- with `--schema`, each level again under a JSON schema (`response_format`).

Each measured level runs `--repeats` times; medians are reported.

    .venv/bin/python -m bench.engine.engine [--engines local vllm] [--levels 1 8 32] [--tokens 64]

Prints a table per engine and the ratios vLLM / local, and writes
bench/results/engine-<timestamp>.json. Run it on an idle machine: nothing else running.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from openai import AsyncOpenAI

from bench import harness
from bench.engine.lora import random_adapter
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
NAME = "smol"

# A list of 64 strings at least: more tokens than any `--tokens` this bench uses.
SCHEMA = {
    "type": "object",
    "properties": {
        "lines": {"type": "array", "items": {"type": "string"}, "minItems": 64},
    },
    "required": ["lines"],
    "additionalProperties": False,
}


def tree(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(stat[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process tree so far."""
    total = 0.0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def rss_mib(pid: int) -> float:
    total = 0
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return round(total / 1024, 1)


def shape(schema: bool) -> dict:
    if schema:
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "lines", "schema": SCHEMA},
            }
        }
    return {"extra_body": {"ignore_eos": True}}


async def level(
    client: AsyncOpenAI,
    concurrency: int,
    requests_each: int,
    tokens: int,
    pid: int,
    *,
    schema: bool = False,
    models: list[str] = (NAME,),
) -> dict:
    latencies: list[float] = []

    async def worker(w: int) -> int:
        done = 0
        for i in range(requests_each):
            started = time.perf_counter()
            r = await client.chat.completions.create(
                model=models[(w + i) % len(models)],
                messages=[{"role": "user", "content": PROMPTS[(w + i) % len(PROMPTS)]}],
                max_tokens=tokens,
                temperature=1.0,
                seed=w * 100 + i,
                **shape(schema),
            )
            latencies.append(time.perf_counter() - started)
            assert r.usage.completion_tokens == tokens, r.usage
            done += r.usage.completion_tokens
        return done

    started = time.perf_counter()
    cpu = cpu_seconds(pid)
    counts = await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - started
    cpu = cpu_seconds(pid) - cpu
    return {
        "concurrency": concurrency,
        "schema": schema,
        "models": list(models),
        "tokens": sum(counts),
        "wall_s": round(wall, 2),
        "tokens_per_s": round(sum(counts) / wall, 1),
        "engine_cpu_s": round(cpu, 2),
        "tokens_per_cpu_s": round(sum(counts) / cpu, 1) if cpu else None,
        "mean_request_s": round(sum(latencies) / len(latencies), 2),
    }


async def first_tokens(client: AsyncOpenAI, concurrency: int) -> float:
    """The median time to the first content chunk of `concurrency` streamed requests."""

    async def one(w: int) -> float:
        started = time.perf_counter()
        stream = await client.chat.completions.create(
            model=NAME,
            messages=[{"role": "user", "content": PROMPTS[w % len(PROMPTS)]}],
            max_tokens=16,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        first = None
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - started
        return first

    return statistics.median(await asyncio.gather(*(one(w) for w in range(concurrency))))


def median_of(runs: list[dict]) -> dict:
    ordered = sorted(runs, key=lambda r: r["tokens_per_s"])
    return {
        **ordered[len(ordered) // 2],
        "tokens_per_cpu_s": statistics.median(r["tokens_per_cpu_s"] or 0 for r in runs),
        "runs_tokens_per_s": [r["tokens_per_s"] for r in runs],
    }


async def measure(backend: str, args, model: Path, adapter_paths: list[Path]) -> dict:
    flags = ["--model", str(model), "--served-model-name", NAME, "--max-model-len", "2048"]
    if backend == "vllm":
        flags += ["--backend", "vllm", "--max-lora-rank", "8"]
    if args.threads:
        flags += ["--threads", str(args.threads)]
    engine = EngineProcess(flags, timeout=900)
    started = time.perf_counter()
    with engine:
        start_s = time.perf_counter() - started
        pid = engine.proc.pid
        report: dict = {"backend": backend, "start_s": round(start_s, 1)}
        report["idle_rss_mib"] = rss_mib(pid)
        client = AsyncOpenAI(base_url=engine.url, api_key="x", max_retries=0, timeout=1200)
        await level(client, 1, 1, 8, pid)  # warm-up
        print(f"{backend}: ready in {start_s:.1f} s, {report['idle_rss_mib']} MiB", flush=True)

        rows = []
        for c in args.levels:
            for schema in (False, True) if args.schema else (False,):
                runs = [
                    await level(client, c, args.requests_each, args.tokens, pid, schema=schema)
                    for _ in range(args.repeats)
                ]
                row = median_of(runs)
                rows.append(row)
                print(
                    f"{backend}: concurrency {c:>2}{' schema' if schema else ''}: "
                    f"{row['tokens_per_s']:>6.1f} tokens/s ({row['tokens_per_cpu_s']} per "
                    f"engine CPU-s), {row['mean_request_s']} s a request",
                    flush=True,
                )
        report["levels"] = rows

        report["ttft_s"] = {}
        for c in (1, 8):
            ttft = statistics.median([await first_tokens(client, c) for _ in range(args.repeats)])
            report["ttft_s"][c] = round(ttft, 3)
        print(f"{backend}: time to first token {report['ttft_s']}", flush=True)

        loads = []
        async with httpx.AsyncClient(timeout=120) as http:
            for i, path in enumerate(adapter_paths):
                t = time.perf_counter()
                r = await http.post(
                    f"{engine.url}/load_lora_adapter",
                    json={"lora_name": f"a{i + 1}", "lora_path": str(path)},
                )
                loads.append(round(time.perf_counter() - t, 3))
                assert r.status_code == 200, r.text
        report["adapter_load_s"] = loads
        await level(client, 2, 1, 8, pid, models=["a1", "a2"])  # warm-up
        mixed = [NAME, "a1", "a2"]
        same = median_of(
            [
                await level(client, 8, args.requests_each, args.tokens, pid)
                for _ in range(args.repeats)
            ]
        )
        spread = median_of(
            [
                await level(client, 8, args.requests_each, args.tokens, pid, models=mixed)
                for _ in range(args.repeats)
            ]
        )
        report["mixed_adapters"] = {
            "base_only_tokens_per_s": same["tokens_per_s"],
            "base_and_2_adapters_tokens_per_s": spread["tokens_per_s"],
            "ratio": round(spread["tokens_per_s"] / same["tokens_per_s"], 2),
        }
        print(
            f"{backend}: adapter loads {loads} s; concurrency 8 over base + 2 adapters "
            f"{spread['tokens_per_s']} tokens/s against {same['tokens_per_s']} on the base "
            f"alone ({report['mixed_adapters']['ratio']}x)",
            flush=True,
        )
        report["end_rss_mib"] = rss_mib(pid)
    return report


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=["local", "vllm"])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per completion")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests-each", type=int, default=2, help="requests per client")
    parser.add_argument("--threads", type=int, help="engine threads (default: each's own)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (medians)")
    parser.add_argument("--schema", action="store_true", help="each level under a JSON schema too")
    args = harness.parse(parser)

    model = bundled.prepare()
    with tempfile.TemporaryDirectory() as tmp:
        adapter_paths = [
            random_adapter(model, Path(tmp) / f"a{seed}", seed=seed, std=0.02) for seed in (1, 2)
        ]
        reports = [await measure(b, args, model, adapter_paths) for b in args.engines]

    if len(reports) == 2:
        a, b = reports
        print(f"\n{b['backend']} / {a['backend']}:")
        for ra, rb in zip(a["levels"], b["levels"], strict=True):
            print(
                f"  concurrency {ra['concurrency']:>2}{' schema' if ra['schema'] else ''}: "
                f"tokens/s {rb['tokens_per_s'] / ra['tokens_per_s']:.2f}x, "
                f"per CPU-s {(rb['tokens_per_cpu_s'] or 0) / (ra['tokens_per_cpu_s'] or 1):.2f}x"
            )
        for c in (1, 8):
            print(f"  time to first token at {c}: {b['ttft_s'][c] / a['ttft_s'][c]:.2f}x")
        print(
            f"  start {b['start_s'] / a['start_s']:.1f}x, memory at the end "
            f"{b['end_rss_mib'] / a['end_rss_mib']:.1f}x"
        )
    harness.save(
        "engine",
        {
            "model": bundled.MODEL_NAME,
            "tokens_per_completion": args.tokens,
            "repeats": args.repeats,
            "threads": args.threads,
            "load_at_end": os.getloadavg(),
            "engines": reports,
        },
        args.out,
    )


if __name__ == "__main__":
    asyncio.run(main())
