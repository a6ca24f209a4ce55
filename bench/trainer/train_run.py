"""A whole training run's cost per trained group, this tree against another revision, side
by side: `trainer.loop.train` on one snapshot of the demo's shape (groups of 9 members,
~30-token answers, the bundled SmolLM2-135M, one thread), in a process of its own per
run, alternating. Prints CPU seconds and wall seconds per trained group, and the ratio.

What it isolates is what a run spends besides the GRPO steps themselves: the check that
the policy starts where the sampler was (a forward per group of its own before, folded
into the first training forward now) and the KL-to-base estimate.

    .venv/bin/python -m bench.trainer.train_run --before <rev> [--groups 16] [--repeats 2]
        [--set dtype=bfloat16]

Writes bench/results/train_run-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Nothing of bench/ imported here at the top: `run` loads this file in another revision's
# checkout (its onjob, this file's `worker`), where bench/ may not be a package.
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

QUESTIONS = [f"What is {a} + {b}?" for a, b in zip(range(11, 43, 2), range(7, 71, 4), strict=False)]
ANSWERS = [  # ~30 tokens each, as the demo's answers (max_tokens 48)
    "{a} + {b} = {s}. To check it, count up from {a} by {b} steps and you land on {s}.",
    "The answer is {s}. Adding the tens first and then the ones gives the same result.",
    "Let me think. {a} plus {b} is {w}, because the two numbers together make {w}.",
    "It is {s}, I think, though you may want to check it with a calculator to be sure.",
    "Sure! When you add {a} and {b} you get {s}. Arithmetic like this gets easy with practice.",
    "Maybe {w}. Adding numbers can be tricky, so I am not completely certain of this one.",
    "{a} plus {b} is {s}: first add the ones, carry if you need to, then add the tens.",
    "I do not know the answer to that question, but I can help you work through it step by step.",
    "The sum is {w}, or possibly {s}; both look plausible to me at first glance here.",
]


def snapshot(path: Path, groups: int) -> None:
    """Groups of the demo's shape, each member's logprobs the bundled model's own (what
    the engine logged when sampling it), rewards 1 for the right sum."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from onjob import bundled

    model_dir = bundled.prepare()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    rows = []
    for g in range(groups):
        q = QUESTIONS[g % len(QUESTIONS)]
        a, b = (int(x) for x in q.removeprefix("What is ").removesuffix("?").split(" + "))
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        for i, template in enumerate(ANSWERS):
            answer = template.format(a=a, b=b, s=a + b, w=a + b + 1 + i)
            completion = tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
            ids = torch.tensor([prompt + completion])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            lps = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(prompt) :, None])
            rows.append(
                {
                    "group_id": f"g{g:03d}",
                    "kind": "turn",
                    "member_id": f"g{g:03d}-{i}",
                    "position": i,
                    "reward": float(str(a + b) in answer and str(a + b + 1 + i) not in answer),
                    "checkpoint": None,
                    "prompt_ids": [prompt],
                    "completion_ids": [completion],
                    "logprobs": [lps.squeeze(-1).tolist()],
                }
            )
    pq.write_table(pa.Table.from_pylist(rows), path)


def worker(snap: Path, out: Path, extra: dict | None = None) -> dict:
    import torch

    from onjob.trainer.loop import train
    from onjob.trainer.settings import TrainSettings

    torch.set_num_threads(1)
    settings = TrainSettings(
        threads=1, learning_rate=2e-4, groups_per_step=2, lora_rank=16, **(extra or {})
    )
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    manifest = train(snap, out, settings, progress=False, echo=lambda _: None)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if isinstance(manifest, dict):  # a revision from before the typed `Manifest`
        trained, steps = len(manifest["groups"]), manifest["metrics"]["steps"]
    else:
        trained, steps = len(manifest.groups), manifest.steps
    return {
        "groups_trained": trained,
        "steps": steps,
        "cpu_s": cpu,
        "wall_s": wall,
        "cpu_s_per_group": cpu / trained,
        "wall_s_per_group": wall / trained,
    }


def run(tree: Path, snap: Path, out: Path, extra: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = (
        "import importlib.util, json, pathlib; "
        "spec = importlib.util.spec_from_file_location("
        f"'train_run', {str(HERE / 'train_run.py')!r}); "
        "train_run = importlib.util.module_from_spec(spec); spec.loader.exec_module(train_run); "
        f"print(json.dumps(train_run.worker(pathlib.Path({str(snap)!r}), "
        f"pathlib.Path({str(out)!r}), {extra!r})))"
    )
    done = subprocess.run(  # in the tree: `-c` puts the working directory first on sys.path
        [sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from bench import harness

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a trainer setting for this tree's runs only (e.g. dtype=bfloat16)",
    )
    args = harness.parse(parser)
    extra = dict(item.split("=", 1) for item in args.set)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        snap = tmp / "snapshot.parquet"
        snapshot(snap, args.groups)
        old = tmp / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(old), args.before],
            check=True,
        )
        rows = []
        try:
            for r in range(args.repeats):
                for name, tree in (("before", old), ("after", ROOT)):
                    mine = extra if name == "after" else None
                    row = {
                        "variant": name,
                        "repeat": r,
                        **run(tree, snap, tmp / f"{name}{r}", mine),
                    }
                    rows.append(row)
                    print(
                        f"{name:<7} {row['groups_trained']} groups, {row['steps']} steps: "
                        f"{row['cpu_s_per_group']:.2f} CPU s and {row['wall_s_per_group']:.2f} "
                        "wall s per trained group",
                        flush=True,
                    )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)])

    def mean(variant: str, key: str) -> float:
        values = [r[key] for r in rows if r["variant"] == variant]
        return sum(values) / len(values)

    summary = {
        v: {k: mean(v, k) for k in ("cpu_s_per_group", "wall_s_per_group")}
        for v in ("before", "after")
    }
    ratio = summary["after"]["cpu_s_per_group"] / summary["before"]["cpu_s_per_group"]
    print(f"CPU per trained group: after / before = {ratio:.2f} (before = {args.before})")
    harness.save(
        "train_run",
        {"before": args.before, "after_settings": extra, "rows": rows, "summary": summary},
        args.out,
    )


if __name__ == "__main__":
    main()
