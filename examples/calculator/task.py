"""The calculator task: two-digit products the agent should compute with its `multiply`
tool, the held-out set, the success check and the reward.

A conversation is two turns when the model uses the tool: the question, a
`multiply` call, the tool's result, the final answer. SmolLM2-135M rarely calls the
tool and cannot multiply two-digit numbers in its head, so its success here is low
(see the README); the task exists to exercise multi-turn, tool-using traffic end to
end: stitching, trajectory groups, rewards on tool calls.
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


def reward(rollout) -> float:
    """`examples.calculator.task:reward`: 1 for the right product in the answer, 0.5 for a
    `multiply` call with the question's operands (progress), 0 otherwise."""
    q = next(m["content"] for m in rollout.prompt if m["role"] == "user")
    if correct(q, rollout.text):
        return 1.0
    return 0.5 if any(right_call(q, c) for c in rollout.tool_calls) else 0.0
