"""The arithmetic task: questions, the held-out set, the success checks, the reward and
the referee.

SmolLM2-135M answers "What is A + B?" for one-digit A and B with the right sum in
about a quarter of its samples (27% of 48 measured here; with two-digit numbers, 2%):
often enough for GRPO to find and reinforce it. The 81 questions are split once:
56 to train on, 25 held out.
"""

from __future__ import annotations

import random
import re

_QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


_ALL = [f"What is {a} + {b}?" for a in range(1, 10) for b in range(1, 10)]
random.Random(7).shuffle(_ALL)
HELDOUT, TRAIN = _ALL[:25], _ALL[25:]


def messages(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def training_questions(n: int, seed: int = 1) -> list[str]:
    """`n` questions drawn (with repeats) from the training split."""
    rng = random.Random(seed)
    return [rng.choice(TRAIN) for _ in range(n)]


def heldout_questions(n: int = 25) -> list[str]:
    return HELDOUT[:n]


def correct(q: str, answer: str | None) -> bool:
    """The right sum appears in the answer as a number of its own."""
    a, b = map(int, _QUESTION.search(q).groups())
    return re.search(rf"(?<!\d){a + b}(?!\d)", answer or "") is not None


def exact(q: str, answer: str | None) -> bool:
    """Right and nothing else: the sum, and no number but the question's own. An answer
    that lists candidates ("7, or maybe 8") contains the sum but is not a success."""
    a, b = map(int, _QUESTION.search(q).groups())
    numbers = [int(n) for n in re.findall(r"\d+", answer or "")]
    return a + b in numbers and all(n in (a, b, a + b) for n in numbers)


def referee(rollout) -> bool:
    """The demo's gate (`loop.gate`): exact success, the reward's top grade alone."""
    q = next(m["content"] for m in reversed(rollout.prompt) if m["role"] == "user")
    return exact(q, rollout.text)


def reward(rollout) -> float:
    """The reward function onjob's judge calls (`examples.arithmetic.task:reward`), graded
    to agree with the referee: 1 for the sum alone (`exact`), 0.5 for the sum among other
    numbers (a hedge the referee rejects), 0 otherwise. A reward of 1 for any answer
    holding the sum paid a quarter of its positive rewards to answers the referee
    rejected, and taught hedging."""
    q = next(m["content"] for m in reversed(rollout.prompt) if m["role"] == "user")
    if exact(q, rollout.text):
        return 1.0
    return 0.5 if correct(q, rollout.text) else 0.0
