"""The extract task: a short made-up customer message and a question asking for one of its
fields ('Message: "Hi, this is Nora Keller. My order 48213 was due in Leeds on March 14,
but it has not arrived." What is the order number in this message?'), under the system
prompt "Answer in as few words as you can.", its split, its success check, reward and
referee.

The messages are drawn from seeded tables (names, order numbers, cities, dates) into a
few templates, so no model knows them: the field is only in the message. Each message is
asked for one field, the four in turn.

SmolLM2-135M-Instruct (bundled) often finds the field but says more, echoes the
message, or names the wrong one; it answered with the field alone in none of 248
answers (with the system prompt, without it, and asked to "Reply with the number only"),
so the referee also passes the one plain sentence that says it ("The order number is
48213."). Measured at temperature 1 on 30 held-out questions x 8 samples (a local `onjob
engine` on 2 shared cores): 10.8% of 240 answers exact [95% CI 7.5%, 15.4%], 29.2% with
any credit, mean reward 0.20.

    .venv/bin/python examples/single_turn.py extract --questions 30 --samples 8 \\
        --base-url http://127.0.0.1:8011/v1 --model SmolLM2-135M-Instruct

Without the system prompt: 3.3% of 240 answers exact [95% CI 1.7%, 6.4%], 27.1% with any
credit. The 120 messages are split once by a seeded shuffle: 30 held out, 90 to train
on.
"""

from __future__ import annotations

import random
import re

from examples.single_turn import plain, question, split

MAX_TOKENS = 24

FIRST = (
    "Nora", "Tomas", "Ada", "Ivo", "Lena", "Marek", "Sofia", "Pavel", "Greta", "Omar",
    "Ines", "Bruno", "Hana", "Felix", "Mira", "Otto", "Clara", "Dario", "Vera", "Emil",
)  # fmt: skip
LAST = (
    "Keller", "Ruiz", "Brennan", "Lindqvist", "Okafor", "Novak", "Marchetti", "Haldane",
    "Sorensen", "Petrov", "Delacroix", "Varga", "Moreau", "Tanaka", "Castell", "Weir",
    "Albright", "Fenwick", "Quist", "Rosales",
)  # fmt: skip
CITIES = (
    "Leeds", "Denver", "Lyon", "Porto", "Graz", "Tampere", "Bergen", "Utrecht", "Malaga",
    "Krakow", "Ghent", "Aarhus", "Brno", "Turin", "Bilbao", "Dresden", "Galway", "Omaha",
    "Tucson", "Halifax",
)  # fmt: skip
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
TEMPLATES = (
    "Hi, this is {name}. My order {order} was due in {city} on {date}, but it has not arrived.",
    "Hello, {name} here. I placed order {order} on {date} and want it sent to {city} instead.",
    "Dear team, please cancel order {order}, placed by {name} on {date} for delivery to {city}.",
    "Order {order} for {name} will ship to {city} on {date}.",
    "{name} called on {date} about order {order}, which is stuck in {city}.",
    "Good morning. Order {order} reached our {city} depot on {date}; please tell {name}.",
)
ASKED = {
    "order": "What is the order number in this message?",
    "name": "What is the customer's name in this message?",
    "city": "Which city is named in this message?",
    "date": "What date is given in this message?",
}


def _messages(n: int = 120, seed: int = 45) -> dict[str, dict[str, str]]:
    """`n` questions, each a drawn message and one field asked for (the four in turn) ->
    the message's fields, the one asked for under "asked"."""
    rng, table = random.Random(seed), {}
    while len(table) < n:
        fields = {
            "name": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
            "order": str(rng.randint(10000, 99999)),
            "city": rng.choice(CITIES),
            "date": f"{rng.choice(MONTHS)} {rng.randint(1, 28)}",
        }
        field = tuple(ASKED)[len(table) % len(ASKED)]
        text = rng.choice(TEMPLATES).format(**fields)
        table.setdefault(f'Message: "{text}"\n{ASKED[field]}', {**fields, "asked": field})
    return table


FIELDS = _messages()
HELDOUT, TRAIN = split(list(FIELDS), seed=45, heldout=30)


SYSTEM = "Answer in as few words as you can."


def messages(q: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]


def field(q: str) -> str:
    """The value the question asks for ("48213", "Nora Keller", "Leeds", "March 14")."""
    fields = FIELDS[q]
    return fields[fields["asked"]]


def _others(q: str) -> list[str]:
    """The message's other fields: naming one of them as well is naming a wrong one."""
    fields = FIELDS[q]
    return [v for k, v in fields.items() if k not in ("asked", fields["asked"])]


def _plain(text: str | None) -> str:
    """`plain`, with ordinals' suffixes dropped ("March 14th" is "march 14")."""
    return re.sub(r"\b(\d+)(?:st|nd|rd|th)\b", r"\1", plain(text))


def _holds(text: str, value: str) -> bool:
    return re.search(rf"(?<![a-z0-9]){re.escape(_plain(value))}(?![a-z0-9])", text) is not None


# What may say the field: "The order number (in this message) is 48213."
_SAID = {
    "order": r"(?:the )?order(?: number)?",
    "name": r"(?:the )?customer s name|(?:the )?(?:customer s |customer )?name",
    "city": r"(?:the )?city(?: named)?",
    "date": r"(?:the )?date(?: given)?",
}


def exact(q: str, answer: str | None) -> bool:
    """The answer is the field alone, or the one plain sentence that says it ("The order
    number is 48213.", "The customer's name in this message is Nora Keller."), whatever its
    case, quotes, final full stop or a date's ordinal suffix ("48213", '"Nora Keller"',
    "March 14th."); a sentence that goes on, another field named, and "Nora" (half a name)
    fail."""
    said = rf"(?:(?:{_SAID[FIELDS[q]['asked']]})(?: in (?:this|the) message)? is )?"
    return re.fullmatch(said + re.escape(_plain(field(q))), _plain(answer)) is not None


def grade(q: str, answer: str | None) -> float:
    """1 for the field said plainly (`exact`), 0.5 for the field among other words that
    name none of the message's other fields (a longer sentence around it; an echo of the
    message, which holds them all, scores 0), 0 otherwise."""
    if exact(q, answer):
        return 1.0
    said = _plain(answer)
    right = _holds(said, field(q)) and not any(_holds(said, v) for v in _others(q))
    return 0.5 if right else 0.0


def referee(rollout) -> bool:
    """`examples.extract.task:referee`, the promotion gate's check: `exact`."""
    return exact(question(rollout), rollout.text)


def reward(rollout) -> float:
    """`examples.extract.task:reward`: `grade`, whose top grade alone the referee passes."""
    return grade(question(rollout), rollout.text)
