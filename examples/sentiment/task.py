"""The sentiment task: a short made-up product review and 'Is this review positive,
negative or neutral? Answer with one word.', its split, its success check, reward and
referee.

The reviews are drawn from seeded tables (a product; two sentences of one label's, one
naming the product) so that each states its label plainly and none is in any model's
data; the three labels are asked equally often.

SmolLM2-135M-Instruct (bundled) answers in a sentence ("This review is mostly
positive..."), hedges between labels, or names the wrong one. Measured at temperature 1
on 30 held-out questions x 8 samples (a local `onjob engine` on 2 shared cores): 7.5% of
240 answers exact [95% CI 4.8%, 11.5%], 18.8% with any credit, mean reward 0.13 (a first
run: 6.3% [3.8%, 10.1%], 14.2%, 0.10).

    .venv/bin/python examples/single_turn.py sentiment --questions 30 --samples 8 \\
        --base-url http://127.0.0.1:8011/v1 --model SmolLM2-135M-Instruct

Without "Answer with one word." none of 64 answers was the label alone (16 questions x
4). The 120 reviews (40 of each label) are split once by a seeded shuffle: 30 held out, 90 to
train on.
"""

from __future__ import annotations

import random

from examples.single_turn import plain, question, split

MAX_TOKENS = 16

LABELS = ("positive", "negative", "neutral")
PRODUCTS = (
    "kettle", "lamp", "blender", "backpack", "desk chair", "toaster", "umbrella",
    "phone case", "water bottle", "keyboard", "frying pan", "jacket", "tent",
    "coffee grinder", "speaker", "pillow", "watch", "suitcase", "hair dryer", "bike lock",
)  # fmt: skip
# label: (sentences naming the product, sentences that do not)
SENTENCES = {
    "positive": (
        (
            "I love this {p}.",
            "The {p} works perfectly and looks great.",
            "This is the best {p} I have ever owned.",
            "The {p} is sturdy and well made.",
            "The {p} was worth every penny.",
        ),
        (
            "It exceeded my expectations.",
            "I would happily buy it again.",
            "It has worked flawlessly since the first day.",
            "My whole family is delighted with it.",
            "Highly recommended.",
            "Great value for the price.",
        ),
    ),
    "negative": (
        (
            "The {p} broke after two days.",
            "I regret buying this {p}.",
            "The {p} is flimsy and badly made.",
            "This is the worst {p} I have ever owned.",
            "The {p} was a complete waste of money.",
        ),
        (
            "It stopped working within a week.",
            "Customer service ignored my complaint.",
            "It arrived scratched and missing parts.",
            "I am sending it back.",
            "Do not buy it.",
            "I am very disappointed.",
        ),
    ),
    "neutral": (
        (
            "The {p} arrived on Tuesday.",
            "The {p} is grey and about the size I expected.",
            "The {p} does what the description says, nothing more.",
            "The {p} is neither good nor bad.",
            "I bought the {p} to replace an older one.",
        ),
        (
            "It came in a plain cardboard box.",
            "I have used it twice so far.",
            "The instructions were one page long.",
            "It is about average for the price.",
            "It weighs about a kilogram.",
            "It is fine, I suppose.",
        ),
    ),
}


ASK = "Is this review positive, negative or neutral? Answer with one word."


def _reviews(per_label: int = 40, seed: int = 45) -> dict[str, str]:
    """Question -> its review's label: `per_label` reviews of each label."""
    rng, table = random.Random(seed), {}
    for label in LABELS:
        named, general = SENTENCES[label]
        drawn = 0
        while drawn < per_label:
            first = rng.choice(named).format(p=rng.choice(PRODUCTS))
            text = f"{first} {rng.choice(general)}"
            q = f'Review: "{text}"\n{ASK}'
            drawn += q not in table
            table[q] = label
    return table


REVIEWS = _reviews()
HELDOUT, TRAIN = split(list(REVIEWS), seed=45, heldout=30)


def messages(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def label(q: str) -> str:
    return REVIEWS[q]


def exact(q: str, answer: str | None) -> bool:
    """The answer is the review's label alone, whatever its case, quotes or final full
    stop ("Negative.", '"negative"'); "The review is negative." fails."""
    return plain(answer) == label(q)


def grade(q: str, answer: str | None) -> float:
    """1 for the label alone (`exact`), 0.5 for the label among other words that name no
    other label ("This review is negative."), 0 for a wrong label, a hedge between two
    ("mostly positive, partly negative"), or none."""
    if exact(q, answer):
        return 1.0
    named = set(LABELS) & set(plain(answer).split())
    return 0.5 if named == {label(q)} else 0.0


def referee(rollout) -> bool:
    """`examples.sentiment.task:referee`, the promotion gate's check: `exact`."""
    return exact(question(rollout), rollout.text)


def reward(rollout) -> float:
    """`examples.sentiment.task:reward`: `grade`, whose top grade alone the referee passes."""
    return grade(question(rollout), rollout.text)
