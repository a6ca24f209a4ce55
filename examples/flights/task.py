"""The flights task: 'Which gate does the flight to Varmont leave from?' with two tools
over made-up flights, `find_flight` (a destination -> its flight's code, "OJ 482") and
`flight_status` (a code -> the flight's terminal, gate and boarding time), the held-out
set, the success check, the reward and the referee. Written after examples/library as
the check of the defaults frozen before it: no setting of onjob was changed for it.

How it differs from examples/library, the chain it follows: the first call copies a
made-up city of one word ("Varmont"), the second a code of two letters, a space and
three digits; `flight_status` answers three fields, and the question asks one of them,
a third of the questions each: the gate ("Which gate does the flight to Varmont leave
from?", "C14"), the boarding time ("When does boarding start for the flight to
Varmont?", "17:35") or the terminal ("Which terminal is the flight to Varmont in?",
"terminal 2"). The flights' codes, gates, times and terminals are random, so no model
knows them.

Each step is scored on the step it takes, as library's are: a tool-call turn on its
calls (the call the conversation needs next: `find_flight` with the question's city
until its code is known, `flight_status` with that code; none once the status is
known), an answer turn on its answer, a whole conversation on its final answer. The
agent forces a call on each of its first two turns, as library's does. The 120 cities
are split once by a seeded shuffle (seed 47): 30 held out, 90 to train on.
"""

from __future__ import annotations

import json
import random
import re
import string
from dataclasses import dataclass

from examples.single_turn import split

SYSTEM = (
    "You are an airport assistant. First call find_flight with the destination city to "
    "get its flight code, then call flight_status with that code, then answer with what "
    "the question asks: the gate, the boarding time or the terminal."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "find_flight",
            "description": "Find today's flight to a city; returns its flight code.",
            "parameters": {
                "type": "object",
                "properties": {
                    "destination": {"type": "string", "description": "the destination city"}
                },
                "required": ["destination"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "flight_status",
            "description": "A flight's terminal, gate and boarding time, by its flight code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the flight code"}},
                "required": ["code"],
            },
        },
    },
]

# The three questions, each asking one field of `flight_status`'s answer.
ASKED = {
    "gate": "Which gate does the flight to {city} leave from?",
    "boarding": "When does boarding start for the flight to {city}?",
    "terminal": "Which terminal is the flight to {city} in?",
}
_FORMS = {
    field: re.compile(re.escape(form).replace(re.escape("{city}"), r"(\w+)"))
    for field, form in ASKED.items()
}

_PARTS = (
    ("Var", "Cor", "Dun", "Fal", "Gar", "Hal", "Kel", "Lor", "Mar", "Nor", "Pel", "Ros",
     "Sel", "Tor", "Vel", "Wen", "Zan", "Bro"),
    ("mont", "ria", "holm", "via", "dor", "stad", "mora", "essa", "ovo", "ica", "wick",
     "und"),
)  # fmt: skip


@dataclass(frozen=True)
class Flight:
    code: str  # two letters, a space and three digits, "OJ 482"
    gate: str  # a letter and a number, "C14"
    boarding: str  # a 24-hour time, "17:35"
    terminal: str  # a digit, "2"
    asked: str  # the field its question asks: "gate", "boarding" or "terminal"


def _flights(n: int = 120, seed: int = 47) -> dict[str, Flight]:
    """City -> its flight (a code of two letters and three digits, "OJ 482"; a gate of a
    letter and a number, "C14"; a boarding time from 10:00 to 22:55, "17:35"; a terminal,
    1-5), each city asked for one field, the three in turn."""
    rng, flights, codes = random.Random(seed), {}, set()
    while len(flights) < n:
        city = rng.choice(_PARTS[0]) + rng.choice(_PARTS[1])
        code = "".join(rng.choices(string.ascii_uppercase, k=2)) + f" {rng.randint(100, 999)}"
        if city in flights or code in codes:
            continue
        codes.add(code)
        gate = f"{rng.choice('ABCDEFGH')}{rng.randint(1, 39)}"
        boarding = f"{rng.randint(10, 22)}:{rng.randrange(0, 60, 5):02d}"
        asked = tuple(ASKED)[len(flights) % len(ASKED)]
        flights[city] = Flight(code, gate, boarding, str(rng.randint(1, 5)), asked)
    return flights


FLIGHTS = _flights()
CODES = {flight.code: city for city, flight in FLIGHTS.items()}
HELDOUT, TRAIN = split(
    [ASKED[f.asked].format(city=city) for city, f in FLIGHTS.items()], seed=47, heldout=30
)


def asked(q: str) -> tuple[str, str]:
    """(the question's city, the field it asks: "gate", "boarding" or "terminal")."""
    for field, form in _FORMS.items():
        if found := form.fullmatch(q):
            return found.group(1), field
    raise ValueError(f"not a flights question: {q!r}")


def city_of(q: str) -> str:
    return asked(q)[0]


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


def _city(destination: str) -> str | None:
    """The city a destination names, as a booking search matches it: any case, quotes
    and spaces around it dropped."""
    name = destination.strip().strip("\"'").strip().lower()
    return next((c for c in FLIGHTS if c.lower() == name), None)


def _plain(code: str) -> str:
    """A code as the status board matches it: any case, spaces and dashes dropped
    ("oj482", "OJ-482" and "OJ 482" are one flight)."""
    return re.sub(r"[\s-]", "", code).upper()


_PLAIN = {_plain(code): code for code in CODES}


def find_flight(arguments: str | None) -> str:
    """The first tool: a destination -> its flight's code (errors as text, as a real tool
    would, so the model sees them)."""
    try:
        destination = str(_arguments(arguments)["destination"])
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc!r}; call find_flight with the destination city"
    city = _city(destination)
    if city is None:
        return f"error: no flight to {destination.strip()!r} today"
    code = FLIGHTS[city].code
    return (
        f"{city}: flight {code}. Call flight_status with code {code} for its gate, "
        f"boarding time and terminal."
    )


def flight_status(arguments: str | None) -> str:
    """The second tool: a flight code (any case, with or without its space) -> the
    flight's terminal, gate and boarding time."""
    try:
        asked_code = str(_arguments(arguments)["code"]).strip().upper()
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc!r}; call flight_status with the code find_flight returned"
    code = _PLAIN.get(_plain(asked_code))
    if code is None:
        return f"error: no flight with code {asked_code!r}"
    flight = FLIGHTS[CODES[code]]
    return (
        f"Flight {code} to {CODES[code]}: terminal {flight.terminal}, gate {flight.gate}, "
        f"boarding at {flight.boarding}."
    )


# What the agent runs each call with, by the tool's name.
RUN = {"find_flight": find_flight, "flight_status": flight_status}


def answer_of(q: str) -> str:
    """The asked field's value: the gate ("C14"), the boarding time ("17:35") or the
    terminal ("2")."""
    city, field = asked(q)
    return getattr(FLIGHTS[city], field)


def correct(q: str, answer: str | None) -> bool:
    """The asked field appears in the final answer on its own, in any case: the gate
    ("C14", not in "C140" or "BC14"), the boarding time ("17:35", not in "17:355"), the
    terminal as "terminal 2" (a digit alone is held by chance). The other fields beside
    it do not matter, as library's floor beside its shelf does not."""
    _, field = asked(q)
    value = re.escape(answer_of(q))
    pattern = {
        "gate": rf"(?<!\w){value}(?!\w)",
        "boarding": rf"(?<![\d:]){value}(?![\d:])",
        "terminal": rf"\bterminal\s+{value}(?!\w)",
    }[field]
    return re.search(pattern, answer or "", re.IGNORECASE) is not None


def _results(prompt: list[dict]) -> list[str]:
    return [str(m.get("content")) for m in prompt if m["role"] == "tool"]


def status(q: str) -> str:
    """What `flight_status` answers for the question's flight: the step the answer
    needs."""
    return flight_status(json.dumps({"code": FLIGHTS[city_of(q)].code}))


def _code_known(q: str, prompt: list[dict]) -> bool:
    """`find_flight` has already returned the flight's code."""
    return find_flight(json.dumps({"destination": city_of(q)})) in _results(prompt)


def _known(q: str, prompt: list[dict]) -> bool:
    """`flight_status` has already returned the flight's status: calling again is no
    progress."""
    return status(q) in _results(prompt)


def right_call(q: str, call: dict, code_known: bool = False) -> bool:
    """The call the conversation needs next: `flight_status` with the flight's code (as
    `flight_status` matches it), or, while the code is not yet known, `find_flight` with
    the question's city (as `find_flight` matches it)."""
    try:
        function = call["function"]
        args = _arguments(function.get("arguments"))
        if function["name"] == "flight_status":
            return _plain(str(args["code"])) == _plain(FLIGHTS[city_of(q)].code)
        return (
            function["name"] == "find_flight"
            and not code_known
            and _city(str(args["destination"])) == city_of(q)
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def question(rollout) -> str:
    return next(m["content"] for m in rollout.prompt if m["role"] == "user")


def reward(rollout) -> float:
    """`examples.flights.task:reward`, the step the rollout takes: an answer scores 1 when
    it holds the asked field; a turn that calls tools scores the share of its calls that
    are the call the conversation needs next (`right_call`: `find_flight` with the city
    until its code is known, then `flight_status` with that code; 0 once the status is
    already known); a whole conversation (a trajectory member) that ends on a call never
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
    """`examples.flights.task:referee`, the promotion gate's check: the step is right
    (every call right, or the right answer), as `reward` scores 1."""
    return reward(rollout) == 1.0
