"""What a cold adapter costs: time to first token for an adapter the engine took out of
its cache for room, against one it holds, and the base model.

Each engine as `onjob engine [--backend vllm]` starts it, serving the bundled SmolLM2-135M
with `--max-cpu-loras K` and K + 1 adapters loaded (rank 16 on every attention and MLP
projection: one set of weights under K + 1 names, which the cache tells apart by name).
Per round, side by side, each a streamed request for 1 token at temperature 0, each
with a prompt of its own (no prefix cache skips its prefill):

- `cold`: the K + 1 names in turn; with room for K, each was taken out since its last
  request, so the engine loads it again from its path first;
- `warm`: one name asked twice, the second timed (held);
- `base`: the base model.

`extra_ms` is cold minus warm (medians): what a tenant whose adapter fell out of the
cache waits once more. The answers' `model` is checked on every request: a cold adapter
is answered by itself or not at all.

    .venv/bin/python -m bench.engine.adapter_cache          # local, then vllm if installed
    .venv/bin/python -m bench.engine.adapter_cache --engines local --cache 2 --rounds 10

Writes bench/results/adapter_cache-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench import harness
from onjob import bundled
from onjob.cli.process import EngineProcess
from onjob.engine import vllm_install

NAME = "smol"
ASKED = iter(range(10**9))  # each request's prompt is new: no prefix cache hides a prefill
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(out: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(bundled.prepare())
    config = LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS)
    get_peft_model(model, config).save_pretrained(out)
    return out


def first_token_s(url: str, model: str) -> float:
    """Seconds from sending a streamed request to its first token's event."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Say yes. ({next(ASKED)})"}],
        "max_tokens": 1,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=300) as resp:
        if resp.status_code != 200:
            raise SystemExit(f"{model}: {resp.status_code} {resp.read()[:300]!r}")
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["model"] != model:
                raise SystemExit(f"asked for {model}, answered by {event['model']}")
            if any(c.get("delta", {}).get("content") for c in event.get("choices", ())):
                return time.perf_counter() - started
    raise SystemExit(f"{model}: the stream ended without a token")


def summary(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 1),
        "n": len(ordered),
    }


def measure(backend: str, args: argparse.Namespace, adapter: Path) -> dict:
    flags = ["--model", str(bundled.prepare()), "--served-model-name", NAME]
    flags += ["--max-model-len", "2048", "--max-cpu-loras", str(args.cache)]
    if backend == "vllm":
        flags += ["--backend", "vllm", "--max-lora-rank", "16", "--max-loras", str(args.cache)]
        flags += ["--cpu-kv-cache-gib", "1"]
    if args.threads:
        flags += ["--threads", str(args.threads)]
    names = [f"tenant-{i}" for i in range(args.cache + 1)]
    with EngineProcess(flags, timeout=900) as engine:
        url = engine.url
        for name in names:
            body = {"lora_name": name, "lora_path": str(adapter)}
            httpx.post(f"{url}/load_lora_adapter", json=body, timeout=300).raise_for_status()
        for model in (NAME, *names, *names):  # warm-up: first forwards, first reloads
            first_token_s(url, model)
        times: dict[str, list[float]] = {"cold": [], "warm": [], "base": []}
        for r in range(args.rounds):
            for name in names:
                times["cold"].append(first_token_s(url, name))
            held = names[r % len(names)]
            first_token_s(url, held)
            times["warm"].append(first_token_s(url, held))
            times["base"].append(first_token_s(url, NAME))
            print(f"{backend}: round {r + 1}/{args.rounds}", flush=True)
    report = {kind: summary(ts) for kind, ts in times.items()}
    report["extra_ms"] = round(report["cold"]["median_ms"] - report["warm"]["median_ms"], 1)
    report["cold_over_warm"] = round(report["cold"]["median_ms"] / report["warm"]["median_ms"], 2)
    print(
        f"{backend}: first token cold {report['cold']['median_ms']} ms "
        f"(p90 {report['cold']['p90_ms']}), warm {report['warm']['median_ms']} ms, "
        f"base {report['base']['median_ms']} ms: a cold adapter costs "
        f"{report['extra_ms']} ms more (x{report['cold_over_warm']})",
        flush=True,
    )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=["local", "vllm"])
    parser.add_argument("--cache", type=int, default=2, help="--max-cpu-loras (K)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, help="local engine: torch threads")
    args = harness.parse(parser)
    engines = list(args.engines)
    if "vllm" in engines:
        try:
            vllm_install.find()
        except vllm_install.NotInstalled:
            print("vllm: not installed (`make vllm`): skipped")
            engines.remove("vllm")
    with tempfile.TemporaryDirectory(prefix="onjob-bench-cache-") as work:
        adapter = make_adapter(Path(work) / "adapter")
        size = sum(f.stat().st_size for f in adapter.iterdir())
        reports = {backend: measure(backend, args, adapter) for backend in engines}
    harness.save(
        "adapter_cache",
        {"args": vars(args), "adapter_bytes": size, "engines": reports},
        args.out,
    )


if __name__ == "__main__":
    main()
