"""Held-out success of a model on the weather task: the fraction of conversations
(temperature 1, the tools run for real) whose final answer has the town's temperature,
with a 95% Wilson interval, how often the model called a tool, its right-first-call rate
(first calls that were `find_city` with the question's town) and how often it went on to
`forecast` with the town's id (the second call, the model's own choice).

    python examples/weather/evaluate.py --base-url http://127.0.0.1:8011/v1 \\
        --model SmolLM2-135M-Instruct --questions 30 --samples 4
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples import tool_agent
from examples.weather import task
from examples.weather.agent import solve


def _forecast(q: str) -> str:
    return task.forecast(json.dumps({"city_id": task.TOWNS[task.town_of(q)][0]}))


def evaluate(base_url: str, model: str, questions: int = 30, samples: int = 4) -> dict:
    needed = ("forecast", _forecast)
    return tool_agent.evaluate_chain(base_url, model, task, solve, needed, questions, samples)


if __name__ == "__main__":
    tool_agent.evaluate_main(__doc__, evaluate)
