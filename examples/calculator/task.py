"""The calculator task: two-digit products the agent should compute with its `multiply`
tool, the held-out set, the success check and the reward.

A conversation is two turns when the model uses the tool: the question, a
`multiply` call, the tool's result, the final answer. SmolLM2-135M never calls the
tool of its own accord and cannot multiply two-digit numbers in its head, so the agent
forces its first call (`tool_choice: "required"`): what the model must learn is to
call with the question's numbers and then to answer with the tool's result.

Each step is scored on the step it takes (`referee`, `reward`): a tool-call turn on its
call, an answer turn on its answer, a whole conversation on its final answer, so a
comparison on any turn of a conversation says which model took the better step.
"""

from __future__ import annotations

import json
import random
import re

_QUESTION = re.compile(r"What is (\d+) × (\d+)\?")

SYSTEM = "You are a careful assistant. Use the multiply tool for any multiplication."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]

_ALL = [f"What is {a} × {b}?" for a in range(11, 30) for b in range(11, 30)]
random.Random(11).shuffle(_ALL)
HELDOUT, TRAIN = _ALL[:30], _ALL[30:]


def operands(q: str) -> tuple[int, int]:
    a, b = _QUESTION.search(q).groups()
    return int(a), int(b)


def messages(q: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]


def training_questions(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(TRAIN) for _ in range(n)]


def heldout_questions(n: int = 30) -> list[str]:
    return HELDOUT[:n]


def multiply(arguments: str) -> str:
    """The tool: what the agent answers a `multiply` call with (errors as text, as a real
    tool would, so the model sees them)."""
    try:
        args = json.loads(arguments or "{}")
        return str(int(args["a"]) * int(args["b"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc!r}; call multiply with integer arguments a and b"


def correct(q: str, answer: str | None) -> bool:
    """The right product appears in the final answer as a number of its own."""
    a, b = operands(q)
    return re.search(rf"(?<!\d){a * b}(?!\d)", answer or "") is not None


def right_call(q: str, call: dict) -> bool:
    a, b = operands(q)
    try:
        args = json.loads(call["function"].get("arguments") or "{}")
        return call["function"]["name"] == "multiply" and {int(args["a"]), int(args["b"])} == {
            a,
            b,
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def question(rollout) -> str:
    return next(m["content"] for m in rollout.prompt if m["role"] == "user")


def _known(q: str, prompt: list[dict]) -> bool:
    """The product is already in a tool result: calling again is no progress."""
    return any(m["role"] == "tool" and correct(q, str(m.get("content"))) for m in prompt)


def reward(rollout) -> float:
    """`examples.calculator.task:reward`, the step the rollout takes: an answer scores 1
    when it holds the right product; a turn that calls tools scores the share of its
    calls that are `multiply` with the question's operands (0 once the product is
    already known); a whole conversation (a trajectory member) that ends on a call never
    answered, 0."""
    q = question(rollout)
    calls = rollout.tool_calls
    if not calls:
        return float(correct(q, rollout.text))
    if rollout.kind == "trajectory" or _known(q, rollout.prompt):
        return 0.0
    return sum(right_call(q, c) for c in calls) / len(calls)


def referee(rollout) -> bool:
    """`examples.calculator.task:referee`, the promotion gate's check: the step is right
    (every call right, or the right answer), as `reward` scores 1."""
    return reward(rollout) == 1.0
