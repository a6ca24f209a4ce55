"""Trainer speed and memory with the real SmolLM2-135M: onjob's GRPO step against a
straightforward one, side by side; and tokens/s and peak memory by member length.

Both run the same step (4 groups x 8 members, ~70-token prompts, 20-60-token
answers, LoRA rank 16 on every projection, PPO loss, backward, AdamW):

- onjob: each group's prompt runs once and its KV cache is repeated for the
  members; the LM head and the log-softmax run only on the sampled tokens
  (`trainer.forward.sampled_logprobs`).
- straightforward: every member's whole sequence through the model, full logits,
  `log_softmax` over the 49k vocabulary, then gather.

Each variant runs in its own process (so peak RSS is its own), `--repeats` times,
alternating. Prints tokens/s and peak RSS, and the ratio; writes
bench/results/trainer-<timestamp>.json.

    .venv/bin/python -m bench.trainer.trainer [--steps 3] [--repeats 2] [--threads 2]

`--lengths 1024 4096 16384` measures one member of each length instead (a 64-token
prompt, the rest sampled answer): one GRPO step (forward, backward, AdamW) in a
process of its own, its tokens/s, and its peak RSS above the RSS once the model is
loaded (the memory the step itself needs; the target is linear in length). On a CPU
host `--layers N` keeps the first N decoder layers so that 16k tokens take minutes,
not an hour; `--checkpointing` turns on gradient checkpointing.

    .venv/bin/python -m bench.trainer.trainer --lengths 1024 4096 16384 --layers 4
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench import harness

QUESTIONS = [
    "What is the capital of France, and what is it famous for?",
    "Explain in two sentences why the sky is blue.",
    "Give me a short recipe for pancakes.",
    "What are three good habits for writing software?",
]
SYSTEM = "You are a helpful assistant. Answer clearly and concisely, and be accurate."
ANSWERS = [
    "Paris. It is known for the Eiffel Tower, museums such as the Louvre, and its food.",
    "Sunlight scatters off air molecules, and blue light scatters the most.",
    "Mix flour, milk, eggs and a pinch of salt; fry thin rounds in butter until golden on "
    "both sides, then serve warm with lemon and sugar or with fruit.",
    "Write tests, keep functions small, and name things for what they hold.",
    "I am not sure.",
    "The answer depends on many factors that we would need to discuss at length, including "
    "history, physics, culture and the particular details of what you are asking about here.",
    "Yes.",
    "Blue light has a shorter wavelength, so the atmosphere scatters it more than red light.",
]


def groups(tokenizer):
    from onjob.trainer.data import Group, Sequence

    out = []
    for g, question in enumerate(QUESTIONS):
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=False,
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        group = Group(f"g{g}", "turn")
        for i, answer in enumerate(ANSWERS):
            completion = tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
            tokens = prompt + completion
            mask = [False] * len(prompt) + [True] * len(completion)
            old = [0.0] * len(prompt) + [-1.0] * len(completion)
            adv = 1.0 if i % 2 == 0 else -1.0
            group.members.append(Sequence(f"g{g}m{i}", tokens, mask, old, adv, float(i % 2 == 0)))
        out.append(group)
    return out


def naive_logprobs(model, members, device):
    import torch

    width = max(len(m.tokens) for m in members)
    ids = torch.zeros(len(members), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for i, m in enumerate(members):
        ids[i, : len(m.tokens)] = torch.tensor(m.tokens)
        attention[i, : len(m.tokens)] = 1
        mask[i, : len(m.tokens)] = torch.tensor(m.loss_mask)
    logits = model(input_ids=ids, attention_mask=attention).logits
    logp = logits.float().log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return logp[mask[:, 1:]]


def worker(variant: str, steps: int, threads: int) -> dict:
    import torch
    from transformers import AutoTokenizer

    from onjob import bundled
    from onjob.trainer import adapter
    from onjob.trainer.forward import Head, sampled_logprobs
    from onjob.trainer.maths import policy_loss
    from onjob.trainer.settings import TrainSettings

    torch.set_num_threads(threads)
    s = TrainSettings(lora_rank=16, threads=threads)
    model, _ = adapter.load(s, None, torch.device("cpu"), torch.float32)
    head = Head.of(model.get_base_model())
    data = groups(AutoTokenizer.from_pretrained(bundled.prepare()))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    step_tokens = sum(g.loss_tokens for g in data)

    def onjob_logprobs(model, members, device):
        return sampled_logprobs(model, head, members, device)

    logprobs = onjob_logprobs if variant == "onjob" else naive_logprobs

    def step():
        for g in data:
            adv = torch.tensor([m.advantage for m in g.members for k in m.loss_mask if k])
            old = torch.tensor(
                [
                    lp
                    for m in g.members
                    for lp, k in zip(m.old_logprobs, m.loss_mask, strict=True)
                    if k
                ]
            )
            logp = logprobs(model, g.members, "cpu")
            (policy_loss(logp, old, adv).loss / step_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up
    started = time.perf_counter()
    for _ in range(steps):
        step()
    wall = time.perf_counter() - started
    return {
        "variant": variant,
        "tokens_per_step": step_tokens,
        "completions_per_step": sum(len(g.members) for g in data),
        "seconds_per_step": wall / steps,
        "tokens_per_s": step_tokens * steps / wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def long_worker(length: int, layers: int | None, threads: int, checkpointing: bool) -> dict:
    import torch

    from onjob.trainer.data import Group, Sequence
    from onjob.trainer.forward import Head, Policy, chunks, pack_limit
    from onjob.trainer.loop import chunk_loss
    from onjob.trainer.settings import TrainSettings

    torch.set_num_threads(threads)
    s = TrainSettings(lora_rank=16, threads=threads, gradient_checkpointing=checkpointing)
    model = _truncated_model(s, layers)
    head = Head.of(model.get_base_model())
    vocab = head.linear.weight.shape[0]
    prompt = 64
    tokens = [(7919 * i) % vocab for i in range(length)]
    old = [0.0] * prompt + [-10.0] * (length - prompt)
    member = Sequence("m", tokens, [False] * prompt + [True] * (length - prompt), old, 1.0, 1.0)
    group = Group("g", "turn", [member])
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    loaded_rss = _rss_mb()
    started = time.perf_counter()
    policy = Policy(model, head, pack_limit(model, s.max_batch_tokens), "cpu")
    for chunk in chunks(group, policy.limit):
        (chunk_loss(policy, chunk, s).loss / member.loss_tokens).backward()
    optimizer.step()
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "length": length,
        "layers": layers or model.config.num_hidden_layers,
        "gradient_checkpointing": checkpointing,
        "seconds": wall,
        "tokens_per_s": member.loss_tokens / wall,
        "loaded_rss_mb": loaded_rss,
        "peak_rss_mb": peak,
        "step_mb": peak - loaded_rss,
    }


def _truncated_model(s, layers: int | None):
    """The trainer's model (base + LoRA, as `trainer.adapter.load` makes it) from the bundled
    model, keeping its first `layers` decoder layers."""
    import shutil
    import tempfile

    import torch
    from transformers import AutoConfig

    from onjob import bundled
    from onjob.trainer import adapter

    base = bundled.prepare()
    if layers is None:
        return adapter.load(s, None, torch.device("cpu"), torch.float32)[0]
    tmp = Path(tempfile.mkdtemp(prefix="onjob-bench-"))
    for f in base.iterdir():
        if f.is_file():
            shutil.copy(f, tmp / f.name)
    config = AutoConfig.from_pretrained(base)
    config.num_hidden_layers = layers
    config.save_pretrained(tmp)  # from_pretrained then loads the first `layers` layers
    s = s.model_copy(update={"base_model": tmp})
    return adapter.load(s, None, torch.device("cpu"), torch.float32)[0]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def lengths_main(args) -> None:
    runs = []
    for length in args.lengths:
        cmd = [sys.executable, "-m", __spec__.name, "--long-worker", str(length)]
        cmd += ["--threads", str(args.threads)]
        cmd += ["--layers", str(args.layers)] if args.layers else []
        cmd += ["--checkpointing"] if args.checkpointing else []
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=harness.ROOT)
        run = json.loads(done.stdout.strip().splitlines()[-1])
        runs.append(run)
        print(
            f"{length:>6} tokens ({run['layers']} layers): {run['seconds']:.1f} s, "
            f"{run['tokens_per_s']:.0f} tokens/s, peak RSS {run['peak_rss_mb']:.0f} MB "
            f"({run['step_mb']:.0f} MB above the loaded model, "
            f"{run['step_mb'] / length * 1024:.0f} MB per 1k tokens)",
            flush=True,
        )
    harness.save("trainer-lengths", {"args": vars(args), "runs": runs}, args.out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", type=int, nargs="+", help="member lengths to measure")
    parser.add_argument("--layers", type=int, help="with --lengths: keep this many layers")
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    parser.add_argument("--worker", choices=["onjob", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--long-worker", type=int, help=argparse.SUPPRESS)
    args = harness.options(parser).parse_args()
    if args.long_worker:
        run = long_worker(args.long_worker, args.layers, args.threads, args.checkpointing)
        print(json.dumps(run))
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.threads)))
        return
    harness.quiet.check(fatal=args.require_quiet)
    if args.lengths:
        lengths_main(args)
        return
    runs = []
    for r in range(args.repeats):
        for variant in ("onjob", "naive") if r % 2 == 0 else ("naive", "onjob"):
            cmd = [sys.executable, "-m", __spec__.name, "--worker", variant]
            cmd += ["--steps", str(args.steps), "--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=harness.ROOT)
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs.append(run)
            print(
                f"{variant:>15}: {run['seconds_per_step']:.2f} s/step "
                f"({run['completions_per_step']} completions, {run['tokens_per_step']} tokens), "
                f"{run['tokens_per_s']:.0f} tokens/s, peak RSS {run['peak_rss_mb']:.0f} MB",
                flush=True,
            )

    def best(variant: str, key: str, fn=max):
        return fn(r[key] for r in runs if r["variant"] == variant)

    summary = {
        "onjob_tokens_per_s": best("onjob", "tokens_per_s"),
        "naive_tokens_per_s": best("naive", "tokens_per_s"),
        "onjob_peak_rss_mb": best("onjob", "peak_rss_mb", min),
        "naive_peak_rss_mb": best("naive", "peak_rss_mb", min),
    }
    summary["speedup"] = summary["onjob_tokens_per_s"] / summary["naive_tokens_per_s"]
    print(
        f"\nonjob {summary['onjob_tokens_per_s']:.0f} vs straightforward "
        f"{summary['naive_tokens_per_s']:.0f} tokens/s: {summary['speedup']:.2f}x; peak RSS "
        f"{summary['onjob_peak_rss_mb']:.0f} vs {summary['naive_peak_rss_mb']:.0f} MB"
    )
    harness.save("trainer", {"args": vars(args), "runs": runs, "summary": summary}, args.out)


if __name__ == "__main__":
    main()
