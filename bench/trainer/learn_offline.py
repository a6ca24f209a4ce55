"""The offline learning benchmark: what a trainer setting does to held-out success, in
minutes, without the loop. One frozen snapshot of judged groups, the real trainer on it,
the held-out questions asked straight of the engine, several seeds, settings side by side.

1. snapshot (made once, reused with --snapshot): the arithmetic example's training
   questions asked of `onjob engine` serving the bundled SmolLM2-135M-Instruct, `--size`
   alternatives each (temperature 1, seeded, token ids and logprobs as the judge's
   re-sampling logs them), scored by the example's reward;
2. per setting and seed: `--groups` groups drawn from it (the seed draws which and their
   order), `trainer.loop.train` on them, the adapter loaded into the engine;
3. held-out success before and after: the example's 25 held-out questions, `--samples`
   answers each at temperature 1 with the same seeds before and after (the seed picks
   them), judged exact as the demo's referee (`examples.arithmetic.task.exact`).

Prints per setting: exact success before and after and the gain with a 95% interval over
seeds (Student's t), the reward's mean after, and the training run's CPU seconds; and
how often a question whose last group had all-equal rewards has all-equal rewards again
(what the judge's down-weighting of such questions saves). Settings are TrainSettings
fields (aliases: lr, warmup, clip = eps_low and eps_high); the base is the demo's.

    .venv/bin/python -m bench.trainer.learn_offline \
        [--snapshot bench/results/learn-snapshot.parquet]
        [--groups 24] [--seeds 3] [--compare lr=5e-5,2e-4,1e-3] [--compare epochs=2]
        [--set warmup=2]

Writes bench/results/learn_offline-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import harness
from examples.arithmetic import task

ALIASES = {"lr": ["learning_rate"], "warmup": ["warmup_steps"], "clip": ["eps_low", "eps_high"]}
# The demo's trainer (examples/arithmetic/demo.py's config), the KL guard's own samples
# off: a guard, not learning, and decoding is most of its cost.
BASE = {"learning_rate": 5e-4, "groups_per_step": 2, "lora_rank": 16, "kl_own_prompts": 0}
MAX_TOKENS = 48  # the demo's agent and judge
# One request is a whole batch (25 questions x --samples): on a busy machine it took past
# 600 s, and a timeout loses the sweep; the engine is ours, so a hang is a bug to see.
HTTP_TIMEOUT_S = 3600


def snapshot(url: str, model: str, path: Path, groups: int, size: int) -> None:
    """`groups` groups of `size` alternatives to the training questions, as the judge logs
    them (prompt and completion token ids, the sampler's logprobs), scored by the reward."""
    import httpx
    import pyarrow as pa
    import pyarrow.parquet as pq

    from onjob.judge.rollouts import Rollout

    # Each question twice (as an agent repeats them), so a question's second group can be
    # compared with its first (`equal_streaks`).
    questions = [q for q in task.TRAIN[: math.ceil(groups / 2)] for _ in (0, 1)][:groups]

    def one(i: int) -> list[dict]:
        q = questions[i]
        body = {
            "model": model,
            "messages": task.messages(q),
            "n": size,
            "temperature": 1.0,
            "max_tokens": MAX_TOKENS,
            "seed": 1000 * i,
            "logprobs": True,
            "return_token_ids": True,
        }
        data = httpx.post(f"{url}/chat/completions", json=body, timeout=HTTP_TIMEOUT_S).json()
        rows = []
        for c in sorted(data["choices"], key=lambda c: c["index"]):
            answer = {"role": "assistant", "content": c["message"]["content"]}
            rows.append(
                {
                    "group_id": f"g{i:04d}",
                    "question": q,
                    "kind": "turn",
                    "member_id": f"g{i:04d}-{c['index']}",
                    "position": c["index"],
                    "reward": float(task.reward(Rollout("m", [*task.messages(q), answer]))),
                    "checkpoint": None,
                    "prompt_ids": [data["prompt_token_ids"]],
                    "completion_ids": [c["token_ids"]],
                    "logprobs": [[t["logprob"] for t in c["logprobs"]["content"]]],
                }
            )
        return rows

    # Each group appended as it comes: a run cut short (a busy machine) resumes there.
    partial = path.with_suffix(".partial.jsonl")
    done = [json.loads(line) for line in partial.open()] if partial.exists() else []
    have = {r["group_id"] for r in done}
    with ThreadPoolExecutor(2) as pool, partial.open("a") as log:
        todo = [i for i in range(groups) if f"g{i:04d}" not in have]
        for group in pool.map(one, todo):
            log.write("".join(json.dumps(r) + "\n" for r in group))
            log.flush()
            done.extend(group)
    pq.write_table(pa.Table.from_pylist(sorted(done, key=lambda r: r["member_id"])), path)
    partial.unlink()


def draw(pool: Path, out: Path, groups: int, seed: int) -> None:
    """`groups` of the pool's groups, chosen and ordered by `seed` (the trainer orders by
    id, so the ids carry the order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(pool).to_pylist()
    ids = sorted({r["group_id"] for r in rows})
    chosen = random.Random(seed).sample(ids, min(groups, len(ids)))
    rank = {g: n for n, g in enumerate(chosen)}
    kept = [{**r, "group_id": f"{rank[r['group_id']]:04d}-{r['group_id']}"} for r in rows
            if r["group_id"] in rank]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(kept), out)


def heldout(url: str, model: str, samples: int, seed: int) -> dict:
    """Exact success and the mean reward on the held-out questions, `samples` answers
    each, seeded by `seed` (the same answers for the same weights)."""
    import httpx

    from onjob.judge.rollouts import Rollout

    def one(i: int, q: str) -> tuple[int, float]:
        body = {
            "model": model,
            "messages": task.messages(q),
            "n": samples,
            "temperature": 1.0,
            "max_tokens": MAX_TOKENS,
            "seed": 7919 * seed + 100 * i,
        }
        data = httpx.post(f"{url}/chat/completions", json=body, timeout=HTTP_TIMEOUT_S).json()
        texts = [c["message"]["content"] for c in data["choices"]]
        rewards = [
            task.reward(Rollout("m", [*task.messages(q), {"role": "assistant", "content": t}]))
            for t in texts
        ]
        return sum(task.exact(q, t) for t in texts), sum(rewards)

    questions = task.heldout_questions()
    with ThreadPoolExecutor(len(questions)) as pool:  # one batch: the engine's rows fill up
        scored = list(pool.map(one, range(len(questions)), questions))
    n = len(questions) * samples
    return {"exact": sum(e for e, _ in scored) / n, "reward": sum(r for _, r in scored) / n}


def trained(snap: Path, out: Path, overrides: dict, seed: int, threads: int) -> dict:
    """One training run; its CPU seconds (this process: the engine idles meanwhile)."""
    from onjob.trainer.loop import train
    from onjob.trainer.settings import TrainSettings

    settings = TrainSettings(**{**BASE, **overrides, "seed": seed, "threads": threads})
    cpu = time.process_time()
    manifest = train(snap, out, settings, progress=False, echo=lambda _: None)
    m = manifest.metrics
    return {
        "cpu_s": time.process_time() - cpu,
        "groups": m["groups"],
        "steps": m["steps"],
        "clip_fraction": m["clip_fraction"],
        "kl_to_base": m["kl_to_base"],
        "kl_to_base_own": m.get("kl_to_base_own"),  # with kl_own_prompts > 0
    }


def settings_of(base: list[str], compare: list[str]) -> list[tuple[str, dict]]:
    """(label, TrainSettings overrides) per setting: `--set`s for all, one per value of
    each `--compare key=v1,v2` (several `--compare`s: their settings one after another)."""

    def fields(key: str, value: str) -> dict:
        try:  # numbers, booleans, lists; anything else is a string (dtype=bfloat16)
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        return {name: parsed for name in ALIASES.get(key, [key])}

    common: dict = {}
    for item in base:
        key, _, value = item.partition("=")
        common |= fields(key, value)
    if not compare:
        return [(" ".join(base) or "default", common)]
    out = []
    for item in compare:
        key, _, values = item.partition("=")
        out += [(f"{key}={v}", common | fields(key, v)) for v in values.split(",")]
    return out


# Student's t, 97.5% quantile, by degrees of freedom (no scipy in the environment).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(xs: list[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% Student-t interval."""
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return mean, math.nan
    t = T975.get(len(xs) - 1, 2.2 if len(xs) <= 12 else 1.96)
    return mean, t * statistics.stdev(xs) / math.sqrt(len(xs))


def equal_streaks(pool: Path) -> dict:
    """Per question, in the order its groups were sampled: how often a group's rewards are
    all equal, overall and right after a group of the same question that was."""
    import pyarrow.parquet as pq

    rewards: dict[str, list[float]] = defaultdict(list)
    question = {}
    for r in pq.read_table(pool).to_pylist():
        rewards[r["group_id"]].append(r["reward"])
        question[r["group_id"]] = r["question"]
    equal = {g: max(rs) - min(rs) <= 1e-6 for g, rs in rewards.items()}
    by_question: dict[str, list[bool]] = defaultdict(list)
    for g in sorted(equal):
        by_question[question[g]].append(equal[g])
    after = [b for seq in by_question.values() for a, b in itertools.pairwise(seq) if a]
    return {
        "groups": len(equal),
        "equal": sum(equal.values()) / len(equal),
        "after_equal": len(after),
        "equal_after_equal": sum(after) / len(after) if after else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snapshot", type=Path, help="the pool of judged groups: reused if "
                        "it exists, else made there (default: a temporary file)")  # fmt: skip
    parser.add_argument("--pool", type=int, default=32, help="groups in a new snapshot")
    parser.add_argument("--size", type=int, default=6, help="alternatives per group")
    parser.add_argument("--groups", type=int, default=24, help="groups each run trains on")
    parser.add_argument("--seeds", type=int, default=3, help="0: make the snapshot only")
    parser.add_argument("--samples", type=int, default=4, help="answers per held-out question")
    parser.add_argument("--set", action="append", default=[], help="FIELD=VALUE for every run")
    parser.add_argument("--compare", action="append", default=[],
                        help="FIELD=V1,V2,...: one setting per value (repeatable)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2, help="torch threads (engine, trainer)")
    args = harness.parse(parser, timed=False)
    # A kill (a timeout) unwinds like Ctrl-C, so the engine process is stopped with us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import httpx

    from onjob import bundled
    from onjob.cli.process import EngineProcess

    settings = settings_of(args.set, args.compare)
    model_dir = bundled.prepare()
    engine_args = ["--model", str(model_dir), "--served-model-name", "base"]
    rows: list[dict] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        EngineProcess([*engine_args, "--threads", str(args.threads)], timeout=900) as engine,
    ):
        tmp = Path(tmp)
        pool = args.snapshot or tmp / "pool.parquet"
        if not pool.exists():
            started = time.perf_counter()
            snapshot(engine.url, "base", pool, args.pool, args.size)
            print(f"snapshot: {args.pool} groups of {args.size} in "
                  f"{time.perf_counter() - started:.0f} s -> {pool}", flush=True)  # fmt: skip
        streaks = equal_streaks(pool)
        print(
            f"snapshot {pool}: {streaks['groups']} groups, {streaks['equal']:.0%} with all-equal "
            f"rewards; after such a group, the same question's next group: "
            f"{streaks['equal_after_equal'] or 0:.0%} of {streaks['after_equal']}",
            flush=True,
        )
        before = {seed: heldout(engine.url, "base", args.samples, seed) for seed in
                  range(args.seeds)}  # fmt: skip
        for label, overrides in settings:
            for seed in range(args.seeds):
                snap = tmp / f"s{seed}.parquet"
                draw(pool, snap, args.groups, seed)
                name = f"run-{len(rows)}"
                run = trained(snap, tmp / name, overrides, seed, args.threads)
                body = {"lora_name": name, "lora_path": str(tmp / name)}
                httpx.post(f"{engine.url}/load_lora_adapter", json=body, timeout=120)
                after = heldout(engine.url, name, args.samples, seed)
                httpx.post(f"{engine.url}/unload_lora_adapter", json={"lora_name": name},
                           timeout=120)  # fmt: skip
                row = {"setting": label, "seed": seed, "before": before[seed], "after": after,
                       **run}  # fmt: skip
                rows.append(row)
                print(
                    f"{label:<24} seed {seed}: exact {before[seed]['exact']:.1%} -> "
                    f"{after['exact']:.1%}, reward {after['reward']:.2f}, {run['steps']} steps, "
                    f"{run['cpu_s']:.0f} CPU s",
                    flush=True,
                )
    if not rows:
        return
    summary = {}
    print(f"\nheld-out exact success, {args.seeds} seeds, {args.groups} groups each "
          f"(95% interval over seeds):")  # fmt: skip
    for label, _ in settings:
        mine = [r for r in rows if r["setting"] == label]
        gain, half = interval([(r["after"]["exact"] - r["before"]["exact"]) * 100 for r in mine])
        summary[label] = {
            "before": statistics.fmean(r["before"]["exact"] for r in mine),
            "after": statistics.fmean(r["after"]["exact"] for r in mine),
            "gain_points": gain,
            "gain_ci95_half": half,
            "reward_after": statistics.fmean(r["after"]["reward"] for r in mine),
            "cpu_s": statistics.fmean(r["cpu_s"] for r in mine),
        }
        s = summary[label]
        print(
            f"  {label:<24} {s['before']:.1%} -> {s['after']:.1%}: {gain:+.1f} points "
            f"(± {half:.1f}), reward after {s['reward_after']:.2f}, {s['cpu_s']:.0f} CPU s a run"
        )
    harness.save(
        "learn_offline",
        {"args": {k: str(v) for k, v in vars(args).items()}, "base": BASE, "streaks": streaks,
         "rows": rows, "summary": summary},
        args.out,
    )  # fmt: skip


if __name__ == "__main__":
    main()
