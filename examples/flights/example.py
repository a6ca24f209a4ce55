"""examples/flights as `onjob demo --example flights` runs it: multi-turn conversations
with two tools, each question asked 4 times in a row so that its conversations share a
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
        f"right first calls (find_flight with the question's city): "
        f"{before['right_call_rate']:.1%} -> {after['right_call_rate']:.1%}",
        f"conversations that got the flight's status from flight_status: "
        f"{before['status']['success']:.1%} -> {after['status']['success']:.1%}",
    ]


EXAMPLE = Example(
    name="flights",
    task="examples/flights: a made-up flight's gate, boarding time or terminal found with "
    "find_flight then flight_status over 3-4 turns, each step scored on the step it takes",
    reward="examples.flights.task:reward",
    referee="examples.flights.task:referee",
    questions=_questions,
    converse=_converse,
    evaluate=evaluate,
    first_messages=task.messages,
    heldout=task.heldout_questions,
    table=_table,
    sample_tokens=400,  # library's: three or four turns, each prefilling the two tools
)
