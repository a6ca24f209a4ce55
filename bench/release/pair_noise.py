"""Less noise per pair: how much several answers per arm, and both arms on one seed, cut
the pairs a release test needs, measured on a real engine.

The engine (`onjob engine`, vLLM's CPU build by default) serves the bundled SmolLM2-135M
as live and a LoRA candidate close to it (random weights, small: `--std`) as the other
arm, and both answer the arithmetic task's 81 questions, `--samples` answers each at
temperature 1, as a paired round asks them (`sampling.request_for`'s fields): once with
the arms on independent seeds, once on one seed per prompt (`pairs.pair_seed`, what the
loop does). Each answer is scored by the demo's referee (`task.exact`: 1 or 0).

For n answers per arm (the first n of each; the referee's `judge.group_size`) a pair's
difference is d = mean(candidate's n) - mean(live's n). Reported per way: the spread of
d over the prompts, and what a test needs: the release rule (`pairs.rule_of`, at the
levels of the 1st and the 500th candidate of a period) run on pairs drawn from the
measured d's shifted to a +0.1 candidate (bootstrap; clipped to [-1, 1]): share
promoted, median pairs, and the engine's seconds for those pairs at the measured time
per pair. A RULER referee's second reading in reverse order (`loop.gate.orders`) is not
measured here: the bundled model rarely writes the scores asked for (bench/judge/judge.py).

    python -m bench.release.pair_noise [--backend vllm|local] [--samples 8] [--std 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench import harness
from examples.arithmetic import task
from onjob import bundled
from onjob.cli.process import EngineProcess
from onjob.deploy.act import adapters
from onjob.deploy.decide import ledger, stats
from onjob.deploy.decide.pairs import pair_seed, rule_of
from onjob.deploy.settings import LoopSettings
from onjob.judge import JudgeSettings, sampling

QUESTIONS = [f"What is {a} + {b}?" for a in range(1, 10) for b in range(1, 10)]
SMALL = ["--served-model-name", "smol", "--max-model-len", "2048", "--max-lora-rank", "8",
         "--cpu-kv-cache-gib", "1"]  # fmt: skip
REPS = 400  # simulated tests per setting


def candidate_adapter(model: Path, out: Path, std: float) -> Path:
    """A LoRA on the attention projections with random weights of spread `std`: a
    candidate whose answers differ from live's a little, as a training step's do."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False)  # fmt: skip
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model), config)
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=std)
    peft_model.save_pretrained(out)
    return out


async def answers(client, model: str, question: str, samples: int, seed: int | None):
    """The arm's `samples` answers to `question`, scored by the referee (1 or 0)."""
    s = JudgeSettings(group_size=samples, max_tokens=24)
    prefix = {"request": json.dumps({"model": "smol", "messages": task.messages(question)})}
    body = sampling.request_for(prefix, model, s) | ({"seed": seed} if seed is not None else {})
    drawn = await sampling.sample(client, body)
    texts = [c["message"]["content"] for c in drawn.response["choices"]]
    return [float(task.exact(question, t)) for t in texts]


async def measure(url: str, samples: int) -> dict:
    """Per way of seeding: every prompt's scores per arm, and the engine's seconds."""
    out = {}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for way in ("independent seeds", "one seed per pair"):
            started, rows = time.monotonic(), []
            for i, q in enumerate(QUESTIONS):
                if way == "one seed per pair":
                    seed_a = seed_b = pair_seed("bench", q)
                else:
                    seed_a, seed_b = 2 * i + 1, 2 * i + 2
                a, b = await asyncio.gather(
                    answers(client, "smol", q, samples, seed_a),
                    answers(client, "candidate", q, samples, seed_b),
                )
                rows.append((a, b))
            out[way] = {"rows": rows, "seconds": time.monotonic() - started}
            print(f"{way}: {len(rows)} prompts in {out[way]['seconds']:.0f} s", flush=True)
    return out


def tests_on(ds: list[float], s: LoopSettings, alpha: float, rng: random.Random) -> dict:
    """The rule on pairs drawn from `ds` shifted to a +0.1 candidate."""
    centre = statistics.mean(ds)
    shifted = [max(-1.0, min(1.0, d - centre + 0.1)) for d in ds]
    rule, promoted, pairs = rule_of(s), 0, []
    for _ in range(REPS):
        paired = rule.start()
        while True:
            for _ in range(s.pairs_per_round):
                paired.add(rng.choice(shifted))
            decision = rule.decision(paired, alpha)
            if decision != "wait":
                break
        promoted += decision == "promote"
        pairs.append(paired.pairs)
    return {"promoted": promoted / REPS, "median_pairs": statistics.median(pairs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("vllm", "local"), default="vllm")
    ap.add_argument("--samples", type=int, default=8, help="answers per arm per prompt")
    ap.add_argument("--std", type=float, default=0.02, help="spread of the LoRA's weights")
    ap.add_argument("--seed", type=int, default=0)
    args = harness.parse(ap, timed=False)
    s = LoopSettings()
    planned = ledger.planned_candidates(s)
    levels = {rank: stats.spend(s.alpha, rank, planned) for rank in (1, 500)}
    model = bundled.prepare()
    with tempfile.TemporaryDirectory() as tmp:
        adapter = candidate_adapter(model, Path(tmp) / "candidate", args.std)
        engine_args = (["--backend", "vllm"] if args.backend == "vllm" else []) + [
            "--model", str(model), *SMALL]  # fmt: skip
        with EngineProcess(engine_args, timeout=900) as engine:
            asyncio.run(_load(engine.url, adapter))
            measured = asyncio.run(measure(engine.url, args.samples))
    rng = random.Random(args.seed)
    out = {"backend": args.backend, "samples": args.samples, "std": args.std,
           "prompts": len(QUESTIONS), "alpha": levels, "ways": {}}  # fmt: skip
    ns = [n for n in (1, 2, 4, 8) if n <= args.samples]
    for way, m in measured.items():
        per_pair_s = m["seconds"] / len(m["rows"])  # both arms at `samples` answers each
        rows = {}
        for n in ns:
            ds = [statistics.mean(b[:n]) - statistics.mean(a[:n]) for a, b in m["rows"]]
            row = {
                "mean_d": statistics.mean(ds),
                "sd_d": statistics.pstdev(ds),
                "live_success": statistics.mean(x for a, _ in m["rows"] for x in a[:n]),
                "candidate_success": statistics.mean(x for _, b in m["rows"] for x in b[:n]),
            }
            for rank, alpha in levels.items():
                t = tests_on(ds, s, alpha, rng)
                # Engine time scales with the answers drawn (one request per arm, n each).
                t["engine_s"] = t["median_pairs"] * per_pair_s * n / args.samples
                row[f"rank_{rank}"] = t
            rows[n] = row
        out["ways"][way] = {"seconds_per_pair_at_samples": per_pair_s, "by_n": rows}
        print(f"== {way} ({per_pair_s:.2f} s a pair at {args.samples} answers per arm)")
        print(f"{'n':>3} {'sd of d':>8} {'1st: promoted, pairs, engine s':>32} "
              f"{'500th: promoted, pairs, engine s':>34}")  # fmt: skip
        for n, row in rows.items():
            first, late = row["rank_1"], row["rank_500"]
            print(
                f"{n:>3} {row['sd_d']:>8.3f} {first['promoted']:>12.3f} "
                f"{first['median_pairs']:>8} {first['engine_s']:>9.0f} "
                f"{late['promoted']:>14.3f} {late['median_pairs']:>8} {late['engine_s']:>9.0f}"
            )
    harness.save("pair_noise", out, args.out)


async def _load(url: str, adapter: Path) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await adapters.ensure_loaded(client, "candidate", str(adapter))


if __name__ == "__main__":
    main()
