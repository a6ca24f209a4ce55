"""An ordinary tool-using agent: asks "What is A × B?" with a `multiply` tool through the
official `openai` client, runs the tool calls the model makes and sends the results
back, until the model answers (at most `--max-turns` turns). The first turn forces one
call (`tool_choice: "required"`, `parallel_tool_calls: false`): a small model left to
choose never calls. Only `base_url` points at onjob; onjob stitches the turns into one
trajectory by their shared messages.

    python examples/calculator/agent.py --base-url http://127.0.0.1:8000/v1 --questions 20
"""

from __future__ import annotations

import sys
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples import tool_agent
from examples.calculator import task


def solve(client: OpenAI, model: str, q: str, max_turns: int = 3, temperature: float = 1.0):
    """One conversation; returns (final answer or None, turns taken, tool calls made,
    whether the first call was `multiply` with the question's numbers)."""
    return tool_agent.solve(client, model, q, task, task.multiply, max_turns, temperature)


def main() -> None:
    tool_agent.main(__doc__, task, solve)


if __name__ == "__main__":
    main()
