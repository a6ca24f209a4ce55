"""An ordinary tool-using agent with two tools: asks 'Which gate does the flight to
Varmont leave from?' (or its boarding time, or its terminal) with `find_flight` and
`flight_status` through the official `openai` client, runs the tool calls the model
makes (each by its name) and sends the results back, until the model answers (at most
`--max-turns` turns, 4 by default: the two calls, the answer and one spare). Its first
two turns force one call each (`tool_choice: "required"`, `parallel_tool_calls: false`),
as library's agent does: a small model left to choose never makes the second call. Only
`base_url` points at onjob.

    python examples/flights/agent.py --base-url http://127.0.0.1:8000/v1 --questions 20
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples import tool_agent
from examples.flights import task

MAX_TURNS = 4
FORCED_TURNS = 2  # a two-step pipeline: which tool, with what, is the model's choice


def solve(
    client: OpenAI,
    model: str,
    q: str,
    max_turns: int = MAX_TURNS,
    temperature: float = 1.0,
    tools: dict[str, Callable[[str], str]] | None = None,
):
    """One conversation; returns (final answer or None, turns taken, tool calls made,
    whether the first call was `find_flight` with the question's city). `tools`: what
    runs each tool by its name (default `task.RUN`)."""
    return tool_agent.solve(
        client, model, q, task, tools or task.RUN, max_turns, temperature, FORCED_TURNS
    )


def main() -> None:
    tool_agent.main(__doc__, task, solve, max_turns=MAX_TURNS)


if __name__ == "__main__":
    main()
