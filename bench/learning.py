"""The learning benchmark: held-out success of the arithmetic agent before and after the
whole loop, through the real path (agent -> onjob serve -> judge -> trainer -> held-out
check -> canary -> paired comparison judged by the gate -> promotion), on the bundled
SmolLM2-135M, for a fixed number of canary decisions (the wall clock only a ceiling),
repeated.

    .venv/bin/python bench/learning.py [--repeats 3] [--rounds 2] [--minutes 60]

Each repeat is `onjob demo` (same configuration, same stages, the gate on: exact
success as the referee, the reward graded: 1 for the sum alone, 0.5 among others) plus an
audit: every promotion's checkpoint and the one it replaced, measured on the held-out
questions. bench/results/learning-<timestamp>.json holds every run (before/after success
with 95% intervals, wall time per stage, training runs, canaries, promotions, rollbacks,
candidates stopped before serving anyone, the audit) and the summary: the held-out gain's
mean and spread over runs, and the promotions to a checkpoint that measured worse than
the one it replaced (target 0). It is rewritten after each repeat, so a run cut short
keeps what it finished. Each run's learning.png is copied beside it (the first as
learning-<timestamp>.png, the others with -run<N>).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.arithmetic.demo import NoDecision, Options, run  # noqa: E402


def summary(runs: list[dict]) -> dict:
    """Over runs: the held-out gain (points of success, the reward's metric and exact), and
    the promotions, with those whose checkpoint measured worse than the one it replaced."""
    gains = [(r["after"]["success"] - r["before"]["success"]) * 100 for r in runs]
    exact = [(r["after"]["exact"]["success"] - r["before"]["exact"]["success"]) * 100 for r in runs]
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
        "gain_points": spread(gains),
        "exact_gain_points": spread(exact),
        "promotions": len(audits),
        "promotions_worse": sum(a["worse"] for a in audits),
        "promotions_significantly_worse": sum(a["significantly_worse"] for a in audits),
        "rollbacks": sum(r["rollbacks"] for r in runs),
        "stopped_on_held_out": sum(r["stopped"] for r in runs),
        "no_decision": sum(r.get("no_decision", False) for r in runs),
        "wall_s": [round(r["wall_s"]) for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="independent runs")
    parser.add_argument("--rounds", type=int, default=2, help="canary decisions per run")
    parser.add_argument("--minutes", type=float, default=60, help="each run's wall-clock ceiling")
    parser.add_argument("--questions", type=int, default=25)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    parser.add_argument("--engine", choices=["local", "vllm"], default="local")
    parser.add_argument(
        "--paused",
        action="store_true",
        help="the agent holds its requests while a run trains (not production conditions)",
    )
    args = parser.parse_args()
    os.chdir(ROOT)  # the demo imports examples/ from the checkout
    out = ROOT / "bench" / "results" / f"learning-{time.strftime('%Y%m%d-%H%M%S')}.json"
    work = Path(tempfile.mkdtemp(prefix="onjob-learning-"))
    runs: list[dict] = []
    for i in range(args.repeats):
        print(f"\n=== run {i + 1} of {args.repeats} ===", flush=True)
        options = Options(
            dir=work / f"run{i + 1}",
            rounds=args.rounds,
            ceiling_s=args.minutes * 60,
            questions=args.questions,
            samples=args.samples,
            audit=True,
            engine=args.engine,
            paused=args.paused,
        )
        try:
            result = run(options)
        except NoDecision:
            result = {**json.loads((options.dir / "result.json").read_text()), "no_decision": True}
        runs.append(result)
        if (options.dir / "learning.png").exists():
            picture = (
                out.with_suffix(".png") if i == 0 else out.with_name(f"{out.stem}-run{i + 1}.png")
            )
            shutil.copy(options.dir / "learning.png", picture)
        record = {
            "bench": "learning",
            "summary": summary(runs),
            "runs": runs,
            "machine": {"cpus": os.cpu_count()},
            "engine": args.engine,
            "traffic": "paused while training" if args.paused else "never paused",
        }
        out.write_text(json.dumps(record, indent=2, default=str))
        print(f"wrote {out} ({len(runs)} of {args.repeats} runs)", flush=True)
    s = record["summary"]
    g = s["gain_points"]
    print(
        f"\nheld-out gain over {s['runs']} runs: mean {g['mean']:+.1f} points"
        + (f", sd {g['sd']:.1f}" if g["sd"] is not None else "")
        + f" (each: {', '.join(f'{x:+.1f}' for x in g['each'])}); {s['promotions']} promotions, "
        f"{s['promotions_worse']} to a checkpoint worse on held-out questions "
        f"({s['promotions_significantly_worse']} beyond the 95% interval), {s['rollbacks']} "
        f"rollbacks, {s['stopped_on_held_out']} stopped before serving anyone"
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
