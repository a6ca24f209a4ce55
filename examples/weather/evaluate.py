"""Held-out success of a model on the weather task: the fraction of conversations
(temperature 1, the tools run for real) whose final answer has the town's temperature,
with a 95% Wilson interval, how often the model called a tool, its right-first-call rate
(first calls that were `find_city` with the question's town) and how often it went on to
`forecast` with the town's id (the second call, the model's own choice).

    python examples/weather/evaluate.py --base-url http://127.0.0.1:8011/v1 \\
        --model SmolLM2-135M-Instruct --questions 30 --samples 4
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.success import success
from examples.weather import task
from examples.weather.agent import solve


def evaluate(base_url: str, model: str, questions: int = 30, samples: int = 4) -> dict:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=2, timeout=600)

    def run(q: str) -> tuple[bool, int, bool, bool]:
        weather = task.forecast(json.dumps({"city_id": task.TOWNS[task.town_of(q)][0]}))
        results: list[str] = []

        def recorded(name: str):
            def call(arguments: str | None) -> str:
                results.append(task.RUN[name](arguments))
                return results[-1]

            return call

        tools = {name: recorded(name) for name in task.RUN}
        answer, _, calls, right_first = solve(client, model, q, tools=tools)
        return task.correct(q, answer), calls, right_first, weather in results

    asked = [q for q in task.heldout_questions(questions) for _ in range(samples)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, asked))
    right_calls = sum(right for _, _, right, _ in results)
    return {
        **success(sum(ok for ok, _, _, _ in results), len(asked)),
        "used_tool": sum(calls > 0 for _, calls, _, _ in results),
        "right_call_rate": right_calls / len(asked) if asked else 0.0,
        "right_call": success(right_calls, len(asked)),
        "forecast": success(sum(got for _, _, _, got in results), len(asked)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8001/v1")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    print(json.dumps(evaluate(args.base_url, args.model, args.questions, args.samples)))


if __name__ == "__main__":
    main()
