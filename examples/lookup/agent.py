"""An ordinary tool-using agent: asks "How many units of item 5560 are in stock?" with a
`lookup` tool through the official `openai` client, runs the tool calls the model makes
and sends the results back, until the model answers (at most `--max-turns` turns). As
the calculator's agent does, its first turn forces one call (`tool_choice: "required"`,
`parallel_tool_calls: false`). Only `base_url` points at onjob.

    python examples/lookup/agent.py --base-url http://127.0.0.1:8000/v1 --questions 20
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.lookup import task


def solve(client: OpenAI, model: str, q: str, max_turns: int = 3, temperature: float = 1.0):
    """One conversation; returns (final answer or None, turns taken, tool calls made,
    whether the first call was `lookup` with the question's item)."""
    messages = task.messages(q)
    calls, right_first = 0, False
    for turn in range(1, max_turns + 1):
        forced = {"tool_choice": "required", "parallel_tool_calls": False} if turn == 1 else {}
        reply = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=task.TOOLS,
            max_tokens=64,
            temperature=temperature,
            **forced,
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content, turn, calls, right_first
        messages.append(message.model_dump(exclude_none=True))
        if calls == 0:
            right_first = task.right_call(q, message.tool_calls[0].model_dump())
        for call in message.tool_calls:
            calls += 1
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": task.lookup(call.function.arguments),
                }
            )
    return None, max_turns, calls, right_first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="agent")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused")
    questions = task.training_questions(args.questions, args.seed)

    def run(q: str) -> tuple[bool, int, int]:
        answer, turns, calls, _ = solve(client, args.model, q, args.max_turns)
        return task.correct(q, answer), turns, calls

    right = turns = calls = 0
    with ThreadPoolExecutor(args.concurrency) as pool:
        for i, (ok, t, c) in enumerate(pool.map(run, questions), 1):
            right, turns, calls = right + ok, turns + t, calls + c
            if i % 5 == 0 or i == len(questions):
                print(
                    f"{i} conversations ({turns} turns, {calls} tool calls), "
                    f"{right} answered right ({right / i:.0%})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
