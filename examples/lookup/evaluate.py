"""Held-out success of a model on the lookup task: the fraction of conversations
(temperature 1, the tool run for real) whose final answer has the item's count, with a
95% Wilson interval, how often the model called the tool, and its right-tool-call rate
(first calls that were `lookup` with the question's item).

    python examples/lookup/evaluate.py --base-url http://127.0.0.1:8011/v1 \\
        --model smollm2-135m-instruct --questions 30 --samples 4
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.lookup import task
from examples.lookup.agent import solve
from examples.success import success


def evaluate(base_url: str, model: str, questions: int = 30, samples: int = 2) -> dict:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=2, timeout=600)

    def run(q: str) -> tuple[bool, int, bool]:
        answer, _, calls, right_first = solve(client, model, q)
        return task.correct(q, answer), calls, right_first

    asked = [q for q in task.heldout_questions(questions) for _ in range(samples)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, asked))
    right_calls = sum(right for _, _, right in results)
    return {
        **success(sum(ok for ok, _, _ in results), len(asked)),
        "used_tool": sum(calls > 0 for _, calls, _ in results),
        "right_call_rate": right_calls / len(asked) if asked else 0.0,
        "right_call": success(right_calls, len(asked)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8001/v1")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--samples", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(evaluate(args.base_url, args.model, args.questions, args.samples)))


if __name__ == "__main__":
    main()
