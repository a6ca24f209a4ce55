"""The learning benchmark: held-out success of an example agent before and after the
whole loop, through the real path (agent -> onjob serve -> judge -> trainer -> held-out
check -> canary -> paired comparison judged by the gate -> promotion), on the bundled
SmolLM2-135M, for a number of canary decisions (the wall clock a ceiling), repeated, per
task.

    .venv/bin/python -m bench.release.learning [--example arithmetic] [--repeats 3] [--rounds 2]
    .venv/bin/python -m bench.release.learning --suite --repeats 3 --minutes 30   # issue 45's suite
    .venv/bin/python -m bench.release.learning --example weather --loop-minutes 30  # evals apart

Each repeat is `onjob demo` (production's settings but for its stated alpha, delta and KL
bound; the agent's traffic never paused unless `--paused`) plus an audit: every
promotion's checkpoint and the one it replaced, measured on the held-out questions.
`--suite` runs every task of `SUITE` with the same settings, each to its ceiling (as many
decisions as fit). bench/results/learning-<timestamp>.json holds every run (before/after
success with 95% intervals, wall time per stage, training runs, canaries, promotions,
rollbacks, candidates stopped before serving anyone, the audit) and, per task, the
summary: the held-out gain's mean and spread over runs, and the promotions to a
checkpoint that measured worse than the one it replaced (target 0). It is rewritten after
each run, so a benchmark cut short keeps what it finished. Each run's learning.png is
copied beside it (learning-<timestamp>-<task>-run<N>.png).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from bench import harness
from bench.harness import ROOT
from examples.arithmetic.demo import EXAMPLES, NoDecision, Options, run

# The learning suite (issue 45 item 4): tasks written for it, none tuned on its own.
SUITE = tuple(name for name in EXAMPLES if name not in ("arithmetic", "calculator"))


def summary(runs: list[dict]) -> dict:
    """Over runs: the held-out gain (points of success, the reward's metric and exact), and
    the promotions, with those whose checkpoint measured worse than the one it replaced."""
    gains = [(r["after"]["success"] - r["before"]["success"]) * 100 for r in runs]
    exact = [  # arithmetic's stricter measure, where an example reports one
        (r["after"]["exact"]["success"] - r["before"]["exact"]["success"]) * 100
        for r in runs
        if "exact" in r["after"]
    ]
    audits = [a for r in runs for a in (r.get("audit") or [])]

    def spread(xs: list[float]) -> dict:
        return {
            "mean": statistics.fmean(xs) if xs else None,
            "sd": statistics.stdev(xs) if len(xs) > 1 else None,
            "min": min(xs, default=None),
            "max": max(xs, default=None),
            "each": xs,
        }

    return {
        "runs": len(runs),
        "before": spread([r["before"]["success"] * 100 for r in runs]),
        "after": spread([r["after"]["success"] * 100 for r in runs]),
        "gain_points": spread(gains),
        "exact_gain_points": spread(exact),
        "promotions": len(audits),
        "promotions_worse": sum(a["worse"] for a in audits),
        "promotions_significantly_worse": sum(a["significantly_worse"] for a in audits),
        "rollbacks": sum(r["rollbacks"] for r in runs),
        "stopped_on_held_out": sum(r["stopped"] for r in runs),
        "no_decision": sum(r.get("no_decision", False) for r in runs),
        "kl_guard_stops": sum(r.get("kl_guard_stops", 0) for r in runs),
        "first_run_started_s": [(r.get("training") or {}).get("first_run_started_s") for r in runs],
        "wall_s": [round(r["wall_s"]) for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--example",
        action="append",
        choices=EXAMPLES,
        help="the task (repeatable; default arithmetic)",
    )
    parser.add_argument("--suite", action="store_true", help=f"every task of {', '.join(SUITE)}")
    parser.add_argument("--repeats", type=int, default=3, help="independent runs per task")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="canary decisions per run (default 2; with --suite, as many as fit the ceiling)",
    )
    parser.add_argument("--minutes", type=float, default=60, help="each run's wall-clock ceiling")
    parser.add_argument(
        "--loop-minutes",
        type=float,
        help="instead of --minutes: the loop's time with the agent's traffic, the held-out "
        "evaluations before and after outside it (a user's agent has those minutes whole)",
    )
    parser.add_argument(
        "--agents",
        type=int,
        default=1,
        help="the example's agents, each one conversation at a time (the traffic's pace)",
    )
    parser.add_argument("--questions", type=int, default=25)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    parser.add_argument("--engine", choices=["local", "vllm"], default="local")
    parser.add_argument(
        "--paused",
        action="store_true",
        help="the agent holds its requests while a run trains (not production conditions)",
    )
    args = harness.parse(parser, timed=False)
    args.out = args.out.resolve()  # before the chdir below
    tasks = list(SUITE) if args.suite else (args.example or ["arithmetic"])
    rounds = args.rounds or (1000 if args.suite else 2)
    os.chdir(ROOT)  # the demo imports examples/ from the checkout
    out = harness.path_for("learning", args.out)
    work = Path(tempfile.mkdtemp(prefix="onjob-learning-"))
    runs: dict[str, list[dict]] = {task: [] for task in tasks}
    # Round-robin over tasks: a benchmark cut short has runs of every task, not all of one.
    for i in range(args.repeats):
        for task in tasks:
            print(f"\n=== {task}: run {i + 1} of {args.repeats} ===", flush=True)
            options = Options(
                dir=work / f"{task}-run{i + 1}",
                rounds=rounds,
                ceiling_s=args.minutes * 60,
                loop_s=args.loop_minutes * 60 if args.loop_minutes else None,
                questions=args.questions,
                samples=args.samples,
                audit=True,
                engine=args.engine,
                paused=args.paused,
                example=task,
                agents=args.agents,
            )
            try:
                result = run(options)
            except NoDecision:
                result = {
                    **json.loads((options.dir / "result.json").read_text()),
                    "no_decision": True,
                }
            runs[task].append(result)
            if (options.dir / "learning.png").exists():
                shutil.copy(
                    options.dir / "learning.png", out.with_name(f"{out.stem}-{task}-run{i + 1}.png")
                )
            record = {
                "tasks": {t: {"summary": summary(r), "runs": r} for t, r in runs.items() if r},
                "engine": args.engine,
                "traffic": "paused while training" if args.paused else "never paused",
                "minutes": args.minutes,
                "loop_minutes": args.loop_minutes,
                "agents": args.agents,
                "rounds": rounds,
            }
            harness.save("learning", record, path=out)
    print()
    for task, task_runs in runs.items():
        print(line(task, summary(task_runs)))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def line(task: str, s: dict) -> str:
    g, b, a = s["gain_points"], s["before"], s["after"]
    return (
        f"{task}: {s['runs']} runs, held-out {b['mean']:.1f}% -> {a['mean']:.1f}%, gain mean "
        f"{g['mean']:+.1f} points"
        + (f", sd {g['sd']:.1f}" if g["sd"] is not None else "")
        + f" (each: {', '.join(f'{x:+.1f}' for x in g['each'])}); {s['promotions']} promotions, "
        f"{s['promotions_worse']} to a checkpoint worse on held-out questions "
        f"({s['promotions_significantly_worse']} beyond the 95% interval), {s['rollbacks']} "
        f"rollbacks, {s['stopped_on_held_out']} stopped before serving anyone, "
        f"{s['no_decision']} runs without a decision, {s['kl_guard_stops']} stopped by the KL "
        f"guard; first run started {s['first_run_started_s']} s after the first request"
    )


if __name__ == "__main__":
    main()
