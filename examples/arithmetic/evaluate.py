"""Held-out success of a model on the arithmetic task: the fraction of sampled answers
(temperature 1) that contain the right sum, with a 95% Wilson interval, and under
`exact` the fraction that give the sum and no other number.

    python examples/arithmetic/evaluate.py --base-url http://127.0.0.1:8001/v1 \\
        --model SmolLM2-135M-Instruct --questions 25 --samples 8
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.arithmetic import task
from examples.success import success


def evaluate(base_url: str, model: str, questions: int = 25, samples: int = 8) -> dict:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=2, timeout=600)

    def score(q: str) -> tuple[int, int]:
        reply = client.chat.completions.create(
            model=model, messages=task.messages(q), max_tokens=48, temperature=1.0, n=samples
        )
        answers = [c.message.content for c in reply.choices]
        return sum(task.correct(q, a) for a in answers), sum(task.exact(q, a) for a in answers)

    with ThreadPoolExecutor(4) as pool:
        scored = list(pool.map(score, task.heldout_questions(questions)))
    n = questions * samples
    return {**success(sum(r for r, _ in scored), n), "exact": success(sum(e for _, e in scored), n)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8001/v1")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--questions", type=int, default=25)
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    print(json.dumps(evaluate(args.base_url, args.model, args.questions, args.samples)))


if __name__ == "__main__":
    main()
