"""What the single-turn examples of the learning suite share (examples/antonyms,
examples/capitals, examples/plurals): their split, their held-out evaluation, their
`Example` and their command line.

A single-turn task module holds `TRAIN` and `HELDOUT` (one seeded shuffle, `split`),
`MAX_TOKENS`, `messages(q)`, `exact(q, answer)` (the referee's check) and
`grade(q, answer)` (the reward: 1 exactly when `exact`), and its `reward` and `referee`
are `grade` and `exact` on the rollout's question and answer.

Held-out success is the referee's: the fraction of sampled answers (temperature 1) that
`exact` passes, with a 95% Wilson interval; `reward` is the mean reward of the same
answers and `credited` the fraction with any credit.

    python examples/single_turn.py antonyms --base-url http://127.0.0.1:8011/v1 \\
        --model smollm2-135m-instruct --questions 25 --samples 8
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import re
import sys
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import ModuleType

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.example import Example
from examples.success import success


def split(questions: list[str], seed: int, heldout: int) -> tuple[list[str], list[str]]:
    """(held out, train): the first `heldout` questions of one seeded shuffle, and the rest."""
    shuffled = list(questions)
    random.Random(seed).shuffle(shuffled)
    return shuffled[:heldout], shuffled[heldout:]


def draw(train: list[str], n: int, seed: int = 1) -> list[str]:
    """`n` questions drawn (with repeats) from the training split."""
    rng = random.Random(seed)
    return [rng.choice(train) for _ in range(n)]


def question(rollout) -> str:
    """The question a rollout answers: its last user message."""
    return next(m["content"] for m in reversed(rollout.prompt) if m["role"] == "user")


def plain(text: str | None) -> str:
    """Lower case, accents and punctuation dropped, words one space apart: "Bogotá." and
    '**bogota**' are both "bogota", "Washington, D.C." is "washington d c"."""
    bare = unicodedata.normalize("NFKD", text or "").encode("ascii", "ignore").decode()
    return " ".join(re.findall(r"[a-z0-9]+", bare.lower()))


def evaluate(
    task: ModuleType, base_url: str, model: str, questions: int = 25, samples: int = 8
) -> dict:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=2, timeout=600)

    def score(q: str) -> list[tuple[bool, float]]:
        reply = client.chat.completions.create(
            model=model,
            messages=task.messages(q),
            max_tokens=task.MAX_TOKENS,
            temperature=1.0,
            n=samples,
        )
        answers = [c.message.content for c in reply.choices]
        return [(task.exact(q, a), task.grade(q, a)) for a in answers]

    with ThreadPoolExecutor(4) as pool:
        scored = [s for each in pool.map(score, task.HELDOUT[:questions]) for s in each]
    n = len(scored)
    return {
        **success(sum(ok for ok, _ in scored), n),
        "reward": sum(g for _, g in scored) / n if n else 0.0,
        "credited": success(sum(g > 0 for _, g in scored), n),
    }


def _heldout(task: ModuleType, n: int = 30) -> list[str]:
    return task.HELDOUT[:n]


def _converse(task: ModuleType, client, q: str) -> None:
    client.chat.completions.create(
        model="agent", messages=task.messages(q), max_tokens=task.MAX_TOKENS, temperature=1.0
    )


def _table(before: dict, after: dict) -> list[str]:
    return [
        f"mean reward (partial credit included): {before['reward']:.2f} -> {after['reward']:.2f}",
        f"answers with any credit: {before['credited']['success']:.1%} -> "
        f"{after['credited']['success']:.1%}",
    ]


def example(name: str, task: ModuleType, line: str, sample_tokens: int) -> Example:
    """The `Example` of the single-turn task `examples/<name>/task.py`: 8 training questions
    per seed, each asked once."""
    return Example(
        name=name,
        task=line,
        reward=f"examples.{name}.task:reward",
        referee=f"examples.{name}.task:referee",
        questions=lambda seed: draw(task.TRAIN, 8, seed),
        converse=partial(_converse, task),
        evaluate=partial(evaluate, task),
        first_messages=task.messages,
        heldout=partial(_heldout, task),
        sample_tokens=sample_tokens,
        table=_table,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", help="the example's name: examples/<task>/task.py")
    parser.add_argument("--base-url", default="http://127.0.0.1:8001/v1")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--questions", type=int, default=25)
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    task = importlib.import_module(f"examples.{args.task}.task")
    print(json.dumps(evaluate(task, args.base_url, args.model, args.questions, args.samples)))


if __name__ == "__main__":
    main()
