"""examples/lookup as `onjob demo --example lookup` runs it: multi-turn conversations
with tool calls, each question asked 4 times in a row so that its conversations share a
scenario and make trajectory groups."""

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
        f"right tool calls (lookup with the question's item, first call): "
        f"{before['right_call_rate']:.1%} -> {after['right_call_rate']:.1%}"
    ]


EXAMPLE = Example(
    name="lookup",
    task="examples/lookup: made-up items' stock found with a lookup tool over 2-3 turns, "
    "each step scored on the step it takes",
    reward="examples.lookup.task:reward",
    referee="examples.lookup.task:referee",
    questions=_questions,
    converse=_converse,
    evaluate=evaluate,
    first_messages=task.messages,
    heldout=task.heldout_questions,
    table=_table,
    # 120 conversations took 295 s on an engine measured at 59-68 tokens/s: two turns,
    # each prefilling the tool prompt again (about 590 prompt and answer tokens in all).
    sample_tokens=155,
)
