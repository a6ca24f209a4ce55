"""Held-out success of a model on the flights task: the fraction of conversations
(temperature 1, the tools run for real) whose final answer has the asked field (the
gate, the boarding time or the terminal), with a 95% Wilson interval, how often the
model called a tool, its right-first-call rate (first calls that were `find_flight` with
the question's city) and how often it went on to `flight_status` with the flight's code
(the second call, the model's own choice).

    python examples/flights/evaluate.py --base-url http://127.0.0.1:8011/v1 \\
        --model SmolLM2-135M-Instruct --questions 30 --samples 4
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples import tool_agent
from examples.flights import task
from examples.flights.agent import solve


def evaluate(base_url: str, model: str, questions: int = 30, samples: int = 4) -> dict:
    needed = ("status", task.status)
    return tool_agent.evaluate_chain(base_url, model, task, solve, needed, questions, samples)


if __name__ == "__main__":
    tool_agent.evaluate_main(__doc__, evaluate)
