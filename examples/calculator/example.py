"""examples/calculator as `onjob demo --example calculator` runs it: multi-turn
conversations with tool calls, each question asked 4 times in a row so that its
conversations share a scenario and make trajectory groups."""

from __future__ import annotations

from examples.example import Example

from . import task
from .agent import solve
from .evaluate import evaluate

ASKED = 4  # conversations per question: a trajectory group of 4


def _questions(seed: int) -> list[str]:
    return [q for q in task.training_questions(2, seed) for _ in range(ASKED)]


def _converse(client, q: str) -> None:
    solve(client, "agent", q)


def _table(before: dict, after: dict) -> list[str]:
    return [
        f"right tool calls (multiply with the question's numbers, first call): "
        f"{before['right_call_rate']:.1%} -> {after['right_call_rate']:.1%}"
    ]


EXAMPLE = Example(
    name="calculator",
    task="examples/calculator: two-digit products with a multiply tool over 2-3 turns, "
    "each step scored on the step it takes",
    reward="examples.calculator.task:reward",
    referee="examples.calculator.task:referee",
    questions=_questions,
    converse=_converse,
    evaluate=evaluate,
    first_messages=task.messages,
    heldout=task.heldout_questions,
    table=_table,
    # 200 conversations took 464 s on an engine measured at 74 tokens/s: two or three
    # turns, each prefilling the ~370-token tool prompt again.
    sample_tokens=170,
)
