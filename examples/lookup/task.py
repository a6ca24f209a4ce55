"""The lookup task: "How many units of item 5560 are in stock?" with a `lookup` tool over
a stock table of made-up item numbers, the held-out set, the success check, the reward
and the referee.

The item numbers and their counts are random, so no model knows them: the count is only
in the tool's result. A conversation is two turns when the model uses the tool: the
question, a `lookup` call, the tool's result ("Item 5560: 565 units in stock."), the
final answer. As the calculator's agent does, the agent forces the first call
(`tool_choice: "required"`): the model must call `lookup` with the question's item and
then answer with the count the tool returned.

Each step is scored on the step it takes (`referee`, `reward`), as the calculator's
are: a tool-call turn on its call, an answer turn on its answer, a whole conversation on
its final answer.

The suite's near-50% task. SmolLM2-135M-Instruct (bundled) nearly always makes the right
call and then as often rambles as gives the count. Measured at temperature 1 on 30
held-out questions x 4 conversations (a local `onjob engine` on 2 shared cores): 41.7% of
120 conversations answered with the count [95% CI 33.2%, 50.6%], first calls right in
96.7% [91.7%, 98.7%].

    .venv/bin/python examples/lookup/evaluate.py --questions 30 --samples 4 \\
        --base-url http://127.0.0.1:8011/v1 --model smollm2-135m-instruct

A first design, letter-and-digit codes ("KX-4821") as a string argument and a JSON
result, had 1 of 12 conversations right and a quarter of its first calls.

The 120 items are split once by a seeded shuffle: 30 held out, 90 to train on.
"""

from __future__ import annotations

import json
import random
import re

from examples.single_turn import split

_QUESTION = re.compile(r"How many units of item (\d+) are in stock\?")

SYSTEM = "You are a stock assistant. Use the lookup tool to find an item's stock."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up an item of the stock table by its number.",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "integer", "description": "the item's number"}},
                "required": ["item"],
            },
        },
    }
]


def _table(n: int = 120, seed: int = 45) -> dict[int, int]:
    """Item number (1000-9999) -> units in stock (100-999)."""
    rng, table = random.Random(seed), {}
    while len(table) < n:
        table[rng.randint(1000, 9999)] = rng.randint(100, 999)
    return table


STOCK = _table()
HELDOUT, TRAIN = split(
    [f"How many units of item {item} are in stock?" for item in STOCK], seed=45, heldout=30
)


def item_of(q: str) -> int:
    return int(_QUESTION.search(q).group(1))


def messages(q: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]


def training_questions(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(TRAIN) for _ in range(n)]


def heldout_questions(n: int = 30) -> list[str]:
    return HELDOUT[:n]


def _item(arguments: str | None) -> int:
    """A call's `item` argument (a number, or a string of one)."""
    return int(json.loads(arguments or "{}")["item"])


def lookup(arguments: str | None) -> str:
    """The tool: what the agent answers a `lookup` call with (errors as text, as a real
    tool would, so the model sees them)."""
    try:
        item = _item(arguments)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"error: {exc!r}; call lookup with the item's number"
    if item not in STOCK:
        return f"error: no item {item} in the stock table"
    return f"Item {item}: {STOCK[item]} units in stock."


def correct(q: str, answer: str | None) -> bool:
    """The item's count appears in the final answer as a number of its own."""
    return re.search(rf"(?<!\d){STOCK[item_of(q)]}(?!\d)", answer or "") is not None


def right_call(q: str, call: dict) -> bool:
    """`lookup` with the question's item."""
    try:
        function = call["function"]
        return function["name"] == "lookup" and _item(function.get("arguments")) == item_of(q)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def question(rollout) -> str:
    return next(m["content"] for m in rollout.prompt if m["role"] == "user")


def _known(q: str, prompt: list[dict]) -> bool:
    """The count is already in a tool result: calling again is no progress."""
    return any(m["role"] == "tool" and correct(q, str(m.get("content"))) for m in prompt)


def reward(rollout) -> float:
    """`examples.lookup.task:reward`, the step the rollout takes: an answer scores 1 when it
    holds the item's count; a turn that calls tools scores the share of its calls that
    are `lookup` with the question's item (0 once the count is already known); a whole
    conversation (a trajectory member) that ends on a call never answered, 0."""
    q = question(rollout)
    calls = rollout.tool_calls
    if not calls:
        return float(correct(q, rollout.text))
    if rollout.kind == "trajectory" or _known(q, rollout.prompt):
        return 0.0
    return sum(right_call(q, c) for c in calls) / len(calls)


def referee(rollout) -> bool:
    """`examples.lookup.task:referee`, the promotion gate's check: the step is right (every
    call right, or the right answer), as `reward` scores 1."""
    return reward(rollout) == 1.0
