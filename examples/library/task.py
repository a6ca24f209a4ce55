"""The library task: 'Which shelf is "The Silver Harbor" on?' with two tools over
made-up books, `find_book` (a title -> the book's code, "QX-4821") and `locate` (a code
-> the book's floor, shelf and copies), the held-out set, the success check, the reward
and the referee. Written after the release test began answering one turn a pair when
conversations are plenty (commit 8e23430), as a multi-turn task that change never saw;
no setting of onjob was changed for it.

How it differs from examples/weather, the other two-tool chain: the first call copies a
title of three words with a space and an article ("The Silver Harbor"), the second a
code of letters and digits, not a number; `locate` answers three fields (floor, shelf,
copies on loan), and only the shelf ("17B") answers the question. The books' codes and
shelves are random, so no model knows them.

Each step is scored on the step it takes, as weather's are: a tool-call turn on its
calls (the call the conversation needs next: `find_book` with the question's title until
its code is known, `locate` with that code; none once the shelf is known), an answer
turn on its answer, a whole conversation on its final answer. The agent forces a call on
each of its first two turns, as weather's does. The 120 titles are split once by a
seeded shuffle: 30 held out, 90 to train on.
"""

from __future__ import annotations

import json
import random
import re
import string
from dataclasses import dataclass

from examples.single_turn import split

_QUESTION = re.compile(r'Which shelf is "([^"]+)" on\?')

SYSTEM = (
    "You are a library assistant. First call find_book with the book's title to get its "
    "book code, then call locate with that code, then answer with the book's shelf."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "find_book",
            "description": "Find a book by its title; returns its book code.",
            "parameters": {
                "type": "object",
                "properties": {"title": {"type": "string", "description": "the book's title"}},
                "required": ["title"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "locate",
            "description": "Where a book stands in the library, by its book code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the book code"}},
                "required": ["code"],
            },
        },
    },
]

_WORDS = (
    ("Silver", "Quiet", "Hidden", "Last", "Broken", "Golden", "Distant", "Burning", "Frozen",
     "Lonely", "Secret", "Winter", "Crimson", "Endless", "Wild"),
    ("Harbor", "Orchard", "Lantern", "Garden", "Mirror", "River", "Tower", "Valley", "Compass",
     "Forest", "Island", "Bridge", "Letter", "Meadow", "Kingdom", "Voyage"),
)  # fmt: skip


@dataclass(frozen=True)
class Book:
    code: str  # two letters and four digits, "QX-4821"
    floor: int
    shelf: str  # a number and a letter, "17B"
    out: int  # copies on loan
    copies: int


def _books(n: int = 120, seed: int = 46) -> dict[str, Book]:
    """Title -> its book (a code of two letters and four digits, a floor 1-4, a shelf of
    a number and a letter, "17B", that answers seldom hold by chance, copies on loan)."""
    rng, books, codes = random.Random(seed), {}, set()
    while len(books) < n:
        title = f"The {rng.choice(_WORDS[0])} {rng.choice(_WORDS[1])}"
        code = "".join(rng.choices(string.ascii_uppercase, k=2)) + f"-{rng.randint(1000, 9999)}"
        if title in books or code in codes:
            continue
        codes.add(code)
        copies = rng.randint(2, 6)
        shelf = f"{rng.randint(10, 59)}{rng.choice('ABCDEF')}"
        books[title] = Book(code, rng.randint(1, 4), shelf, rng.randint(0, copies), copies)
    return books


BOOKS = _books()
CODES = {book.code: title for title, book in BOOKS.items()}
HELDOUT, TRAIN = split([f'Which shelf is "{t}" on?' for t in BOOKS], seed=46, heldout=30)


def title_of(q: str) -> str:
    return _QUESTION.search(q).group(1)


def messages(q: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]


def training_questions(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(TRAIN) for _ in range(n)]


def heldout_questions(n: int = 30) -> list[str]:
    return HELDOUT[:n]


def _arguments(arguments: str | None) -> dict:
    args = json.loads(arguments or "{}")
    if not isinstance(args, dict):
        raise TypeError(f"arguments are {type(args).__name__}, not an object")
    return args


def _plain(title: str) -> str:
    """A title as a catalogue search matches it: any case, quotes and a leading "the"
    dropped."""
    title = title.strip().strip("\"'").strip().lower()
    return title.removeprefix("the ").strip()


def _book(title: str) -> str | None:
    return next((t for t in BOOKS if _plain(t) == _plain(title)), None)


def find_book(arguments: str | None) -> str:
    """The first tool: a title -> its book code (errors as text, as a real tool would, so
    the model sees them)."""
    try:
        asked = str(_arguments(arguments)["title"])
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc!r}; call find_book with the book's title"
    title = _book(asked)
    if title is None:
        return f"error: no book titled {asked.strip()!r}"
    code = BOOKS[title].code
    return f"{title}: book code {code}. Call locate with code {code} for its shelf."


def locate(arguments: str | None) -> str:
    """The second tool: a book code (any case) -> its floor, shelf and copies on loan."""
    try:
        code = str(_arguments(arguments)["code"]).strip().upper()
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc!r}; call locate with the code find_book returned"
    if code not in CODES:
        return f"error: no book with code {code!r}"
    book = BOOKS[CODES[code]]
    return (
        f"Book {code} ({CODES[code]}): floor {book.floor}, shelf {book.shelf}, "
        f"{book.out} of {book.copies} copies on loan."
    )


# What the agent runs each call with, by the tool's name.
RUN = {"find_book": find_book, "locate": locate}


def correct(q: str, answer: str | None) -> bool:
    """The book's shelf ("17B") appears in the final answer as a word of its own (not in
    "117B" or "17BC"), in any case."""
    shelf = re.escape(BOOKS[title_of(q)].shelf)
    return re.search(rf"(?<![\w]){shelf}(?!\w)", answer or "", re.IGNORECASE) is not None


def _results(prompt: list[dict]) -> list[str]:
    return [str(m.get("content")) for m in prompt if m["role"] == "tool"]


def located(q: str) -> str:
    """What `locate` answers for the question's book: the step the answer needs."""
    return locate(json.dumps({"code": BOOKS[title_of(q)].code}))


def _code_known(q: str, prompt: list[dict]) -> bool:
    """`find_book` has already returned the book's code."""
    return find_book(json.dumps({"title": title_of(q)})) in _results(prompt)


def _known(q: str, prompt: list[dict]) -> bool:
    """`locate` has already returned the book's shelf: calling again is no progress."""
    return located(q) in _results(prompt)


def right_call(q: str, call: dict, code_known: bool = False) -> bool:
    """The call the conversation needs next: `locate` with the book's code (any case), or,
    while the code is not yet known, `find_book` with its title (as `find_book` matches)."""
    try:
        function = call["function"]
        args = _arguments(function.get("arguments"))
        if function["name"] == "locate":
            return str(args["code"]).strip().upper() == BOOKS[title_of(q)].code
        return (
            function["name"] == "find_book"
            and not code_known
            and _book(str(args["title"])) == title_of(q)
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def question(rollout) -> str:
    return next(m["content"] for m in rollout.prompt if m["role"] == "user")


def reward(rollout) -> float:
    """`examples.library.task:reward`, the step the rollout takes: an answer scores 1 when
    it holds the book's shelf; a turn that calls tools scores the share of its calls that
    are the call the conversation needs next (`right_call`: `find_book` with the title
    until its code is known, then `locate` with that code; 0 once the shelf is already
    known); a whole conversation (a trajectory member) that ends on a call never
    answered, 0."""
    q = question(rollout)
    calls = rollout.tool_calls
    if not calls:
        return float(correct(q, rollout.text))
    if rollout.kind == "trajectory" or _known(q, rollout.prompt):
        return 0.0
    code_known = _code_known(q, rollout.prompt)
    return sum(right_call(q, c, code_known) for c in calls) / len(calls)


def referee(rollout) -> bool:
    """`examples.library.task:referee`, the promotion gate's check: the step is right
    (every call right, or the right answer), as `reward` scores 1."""
    return reward(rollout) == 1.0
