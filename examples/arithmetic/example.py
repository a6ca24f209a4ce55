"""examples/arithmetic as `onjob demo` runs it (the default example)."""

from __future__ import annotations

from examples.example import Example

from . import task
from .evaluate import evaluate


def _converse(client, q: str) -> None:
    client.chat.completions.create(
        model="agent", messages=task.messages(q), max_tokens=48, temperature=1.0
    )


def _table(before: dict, after: dict) -> list[str]:
    return [
        f"exact (the sum and no other number): {before['exact']['success']:.1%} -> "
        f"{after['exact']['success']:.1%}"
    ]


EXAMPLE = Example(
    name="arithmetic",
    task="examples/arithmetic: one-digit sums, reward = 1 the sum alone, 0.5 among others",
    reward="examples.arithmetic.task:reward",
    referee="examples.arithmetic.task:referee",
    questions=lambda seed: task.training_questions(8, seed),
    converse=_converse,
    evaluate=evaluate,
    first_messages=task.messages,
    heldout=task.heldout_questions,
    table=_table,
)
