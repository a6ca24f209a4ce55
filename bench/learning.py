"""The learning benchmark: held-out success of the arithmetic agent before and after the
whole loop, through the real path (agent -> onjob serve -> judge -> trainer -> canary ->
paired comparison -> promotion), on the bundled SmolLM2-135M, for a fixed number of canary
decisions (the wall clock only a ceiling).

    .venv/bin/python bench/learning.py [--rounds 2] [--minutes 60] [--questions 25 --samples 8]

It is `onjob demo` (same configuration, same stages) with its result copied to
bench/results/learning-<timestamp>.json: before/after success with 95% intervals,
wall time per stage, training runs, canaries, promotions and rollbacks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.arithmetic.demo import Options, run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="canary decisions to make")
    parser.add_argument("--minutes", type=float, default=60, help="the wall clock's ceiling")
    parser.add_argument("--questions", type=int, default=25)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    os.chdir(ROOT)  # the demo imports examples/ from the checkout
    work = Path(tempfile.mkdtemp(prefix="onjob-learning-")) / "demo"
    options = Options(
        dir=work,
        rounds=args.rounds,
        ceiling_s=args.minutes * 60,
        questions=args.questions,
        samples=args.samples,
    )
    result = run(options)
    result = {"bench": "learning", **result, "machine": {"cpus": os.cpu_count()}}
    out = ROOT / "bench" / "results" / f"learning-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    shutil.copy(work / "learning.png", out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png').name}")
    if not args.keep:
        shutil.rmtree(work.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
