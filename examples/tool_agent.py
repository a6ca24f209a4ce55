"""The loop every tool-using example agent runs (examples/calculator, examples/lookup,
examples/weather): one conversation through the official `openai` client, the tool calls
the model makes run for real and their results sent back, until the model answers (at
most `max_turns` turns). The first turn forces one call (`tool_choice: "required"`,
`parallel_tool_calls: false`): a small model left to choose never calls. Only `base_url`
points at onjob; onjob stitches the turns into one trajectory by their shared messages.

A task module gives `messages(q)`, `TOOLS`, `right_call(q, call)`, `correct(q, answer)`
and `training_questions(n, seed)`; `tool(arguments)` runs its tool, or, for a task with
several tools, `tool` maps each tool's name to what runs it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

from examples.success import success


def solve(
    client: OpenAI,
    model: str,
    q: str,
    task,
    tool: Callable[[str], str] | dict[str, Callable[[str], str]],
    max_turns: int = 3,
    temperature: float = 1.0,
    forced_turns: int = 1,
):
    """One conversation; returns (final answer or None, turns taken, tool calls made,
    whether the first call was the right one, `task.right_call`). `forced_turns`: the
    first turns that must call (one by default; a two-tool chain forces two)."""
    messages = task.messages(q)
    calls, right_first = 0, False
    for turn in range(1, max_turns + 1):
        must = turn <= forced_turns
        forced = {"tool_choice": "required", "parallel_tool_calls": False} if must else {}
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
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run(tool, call)})
    return None, max_turns, calls, right_first


def run(tool: Callable[[str], str] | dict[str, Callable[[str], str]], call) -> str:
    """A call's result: `tool` run on its arguments, or the tool of its name among
    several (an unknown name answered with an error, as a real agent would)."""
    if not isinstance(tool, dict):
        return tool(call.function.arguments)
    if call.function.name not in tool:
        return f"error: no tool named {call.function.name!r}; the tools are {', '.join(tool)}"
    return tool[call.function.name](call.function.arguments)


def evaluate_chain(
    base_url: str,
    model: str,
    task,
    solve_one,
    needed: tuple[str, Callable[[str], str]],
    questions: int,
    samples: int,
) -> dict:
    """Held-out success of a two-tool chain (examples/weather, examples/library): the
    fraction of conversations (temperature 1, the tools run for real) whose final answer
    `task.correct` passes, with a 95% Wilson interval, how often the model called a tool,
    its right-first-call rate and how often the conversation got the result the answer
    needs (`needed`: its key in the figures, and what gives it for a question: the second
    call's result, the model's own choice)."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=2, timeout=600)
    key, result_of = needed

    def run(q: str) -> tuple[bool, int, bool, bool]:
        results: list[str] = []

        def recorded(name: str):
            def call(arguments: str | None) -> str:
                results.append(task.RUN[name](arguments))
                return results[-1]

            return call

        tools = {name: recorded(name) for name in task.RUN}
        answer, _, calls, right_first = solve_one(client, model, q, tools=tools)
        return task.correct(q, answer), calls, right_first, result_of(q) in results

    asked = [q for q in task.heldout_questions(questions) for _ in range(samples)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, asked))
    right_calls = sum(right for _, _, right, _ in results)
    return {
        **success(sum(ok for ok, _, _, _ in results), len(asked)),
        "used_tool": sum(calls > 0 for _, calls, _, _ in results),
        "right_call_rate": right_calls / len(asked) if asked else 0.0,
        "right_call": success(right_calls, len(asked)),
        key: success(sum(got for _, _, _, got in results), len(asked)),
    }


def evaluate_main(doc: str, evaluate) -> None:
    """An evaluation's command line: the figures of `evaluate` as one JSON line."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8001/v1")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    print(json.dumps(evaluate(args.base_url, args.model, args.questions, args.samples)))


def main(doc: str, task, solve_one, max_turns: int = 3) -> None:
    """An agent's command line: `--questions` conversations of the training split through
    `--base-url`, progress every 5."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="agent")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=max_turns)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused")
    questions = task.training_questions(args.questions, args.seed)

    def run(q: str) -> tuple[bool, int, int]:
        answer, turns, calls, _ = solve_one(client, args.model, q, args.max_turns)
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
