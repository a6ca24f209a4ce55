"""How far the logprobs an engine reports when it samples are from the ones onjob's
trainer computes for the same tokens: the importance ratio's noise floor.

For each engine setting (`--engines`, default: vLLM in float32, vLLM in bfloat16, the
local engine in float32), started as `onjob engine` starts it, `--prompts` chat prompts
are each answered `--n` times at temperature 1 (`--tokens` tokens at most), half on the
base model and half on a rank-8 LoRA checkpoint as the trainer writes one, with
`logprobs` and `return_token_ids` as the proxy asks for them. The trainer then scores
every sampled token with its own forward (`trainer/forward.py:sampled_logprobs`, the path
a training step takes), its model in float32 and in bfloat16 (`trainer.dtype`), and the
bench prints per pair:

- |policy - sampler| per token: mean, median, p99 and max (nats);
- the importance ratio r = exp(policy - sampler): its standard deviation, 1st and 99th
  percentiles, and the share of tokens outside PPO's clip range [0.8, 1.2].

    .venv/bin/python -m bench.engine.logprob_agreement \
        [--engines vllm:float32 vllm:bfloat16 local:float32]

Writes bench/results/logprob-agreement-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import httpx
import torch

from bench import harness
from bench.engine.lora import random_adapter
from onjob import bundled
from onjob.cli.process import EngineProcess
from onjob.trainer.data import Sequence
from onjob.trainer.forward import Head, sampled_logprobs

PROMPTS = [
    "What is 17 + 25? Answer with the number.",
    "Write a haiku about autumn.",
    "Explain recursion to a child.",
    "Give three uses for a brick.",
    "What is the capital of France, and why is it famous?",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "List the planets of the solar system.",
    "How do I boil an egg?",
    "What is 9 times 7?",
    "Describe the smell of rain.",
    "Why do cats purr?",
    "Translate 'good morning' into French and Spanish.",
    "Write a limerick about a programmer.",
    "What is a prime number? Give an example.",
    "Name two rivers in Africa.",
    "What should I pack for a day hike?",
]
NAME = "smol"
ADAPTER = "ckpt"


def sample(engine: EngineProcess, adapter: Path, args) -> list[dict]:
    """Every sampled answer: its model, prompt ids, completion ids and logprobs."""
    out = []
    with httpx.Client(timeout=600) as http:
        loaded = http.post(
            f"{engine.url}/load_lora_adapter",
            json={"lora_name": ADAPTER, "lora_path": str(adapter)},
        )
        assert loaded.status_code == 200, loaded.text
        for i, prompt in enumerate(PROMPTS[: args.prompts]):
            model = ADAPTER if i % 2 else NAME
            r = http.post(
                f"{engine.url}/chat/completions",
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": prompt}],
                    "n": args.n,
                    "max_tokens": args.tokens,
                    "temperature": 1.0,
                    "seed": i,
                    "logprobs": True,
                    "return_token_ids": True,
                },
            )
            assert r.status_code == 200, r.text
            body = r.json()
            for choice in body["choices"]:
                out.append(
                    {
                        "model": model,
                        "prompt": body["prompt_token_ids"],
                        "ids": choice["token_ids"],
                        "logprobs": [t["logprob"] for t in choice["logprobs"]["content"]],
                    }
                )
    return out


def score(samples: list[dict], model_dir: Path, adapter: Path, dtype: torch.dtype) -> list[float]:
    """policy - sampler for every sampled token, the trainer's forward in `dtype`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    policy = PeftModel.from_pretrained(base, adapter).eval()
    diffs = []
    with torch.no_grad():
        for s in samples:
            member = Sequence(
                "m",
                s["prompt"] + s["ids"],
                [False] * len(s["prompt"]) + [True] * len(s["ids"]),
                [0.0] * (len(s["prompt"]) + len(s["ids"])),
                0.0,
                0.0,
            )
            if s["model"] == ADAPTER:
                mine = sampled_logprobs(policy, Head.of(policy), [member], "cpu")
            else:
                with policy.disable_adapter():
                    mine = sampled_logprobs(policy, Head.of(policy), [member], "cpu")
            diffs += (mine - torch.tensor(s["logprobs"])).tolist()
    return diffs


def summary(diffs: list[float]) -> dict:
    d = torch.tensor(diffs, dtype=torch.float64)
    gap = d.abs()
    ratio = d.exp()
    return {
        "tokens": len(diffs),
        "gap_mean": round(gap.mean().item(), 6),
        "gap_median": round(gap.median().item(), 6),
        "gap_p99": round(gap.quantile(0.99).item(), 6),
        "gap_max": round(gap.max().item(), 6),
        "ratio_std": round(ratio.std().item(), 6),
        "ratio_p01": round(ratio.quantile(0.01).item(), 4),
        "ratio_p99": round(ratio.quantile(0.99).item(), 4),
        "outside_clip": round(((ratio < 0.8) | (ratio > 1.2)).double().mean().item(), 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--engines", nargs="+", default=["vllm:float32", "vllm:bfloat16", "local:float32"]
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4, help="answers per prompt")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per answer at most")
    args = harness.parse(parser, timed=False)

    model = bundled.prepare()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        adapter = random_adapter(model, Path(tmp) / "adapter", seed=0, std=0.02)
        for spec in args.engines:
            backend, _, dtype = spec.partition(":")
            flags = ["--model", str(model), "--served-model-name", NAME, "--dtype", dtype]
            if backend == "vllm":
                flags += ["--backend", "vllm", "--max-model-len", "2048", "--max-lora-rank", "8"]
            with EngineProcess(flags, timeout=900) as engine:
                samples = sample(engine, adapter, args)
            for trainer in ("float32", "bfloat16"):
                diffs = score(samples, model, adapter, getattr(torch, trainer))
                row = {"engine": backend, "engine_dtype": dtype, "trainer_dtype": trainer}
                row |= summary(diffs)
                results.append(row)
                print(
                    f"{backend} {dtype:>8} vs trainer {trainer:>8}: {row['tokens']} tokens, "
                    f"|gap| mean {row['gap_mean']:.2e} p99 {row['gap_p99']:.2e} max "
                    f"{row['gap_max']:.2e}; ratio sd {row['ratio_std']:.2e}, p1-p99 "
                    f"[{row['ratio_p01']}, {row['ratio_p99']}], outside [0.8, 1.2] "
                    f"{row['outside_clip']:.3%}",
                    flush=True,
                )
    harness.save("logprob-agreement", {"args": vars(args), "rows": results}, args.out)


if __name__ == "__main__":
    main()
