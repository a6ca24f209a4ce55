"""The weather task: "What is the temperature today in the town of Oakbrook?" with two
tools over made-up towns, `find_city` (a town's name -> its city id) and `forecast` (a
city id -> today's weather), the held-out set, the success check, the reward and the
referee.

The towns' ids and weather are random, so no model knows them: the temperature is only
in `forecast`'s result, and `forecast` takes only the id `find_city` returns. A
conversation is three turns when the model uses the tools: the question, a `find_city`
call, its result ("Oakbrook: city id 4821. Call forecast with city_id 4821 for its
weather."), a `forecast` call with that id, its result ("City 4821 (Oakbrook): 17.4
degrees Celsius, light rain."), the final answer. The agent forces a call on each of
its first two turns (`tool_choice: "required"`, lookup's first turn twice): left to
choose, SmolLM2-135M never made the second call (none of 28 conversations). Which tool,
with which arguments, and then the answer, are the model's.

Each step is scored on the step it takes (`referee`, `reward`), as lookup's and the
calculator's are: a tool-call turn on its calls (the call the conversation needs next:
`find_city` with the question's town until its id is known, `forecast` with that id),
an answer turn on its answer, a whole conversation on its final answer.

The suite's hardest task: three steps, each the model's to get right, and each with
something to learn. Measured on SmolLM2-135M-Instruct (bundled) at temperature 1 on 30
held-out questions x 4 conversations (a local `onjob engine` on 2 shared cores): 4.2% of
120 conversations answered with the temperature [95% CI 1.8%, 9.4%], first calls right
(`find_city` with the town) in 35.0% [27.1%, 43.9%], the town's forecast reached in
15.8% [10.4%, 23.4%]; given that forecast, an answer holds the temperature about half the
time (40 of 72 answers sampled on right conversations).

    .venv/bin/python examples/weather/evaluate.py --questions 30 --samples 4 \\
        --base-url http://127.0.0.1:8011/v1 --model SmolLM2-135M-Instruct

Town names of two common parts ("Oakbrook") are copied into a call about twice as often
as made-up syllables ("Velmora"): 21 of 96 first calls right against 23 of 192. The
question "...today in the town of Oakbrook?" does better than "...in Oakbrook today?": 36
of 96 first calls right against 21 of 96 (and, with the latter, 1.7% of 120
conversations answered, 20.0% of first calls right). The 120 towns are split once by a
seeded shuffle: 30 held out, 90 to train on.
"""

from __future__ import annotations

import json
import random
import re

from examples.single_turn import split

_QUESTION = re.compile(r"What is the temperature today in the town of (\w+)\?")

SYSTEM = (
    "You are a weather assistant. First call find_city with the town's name to get its "
    "city id, then call forecast with that city id, then answer with the temperature."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "find_city",
            "description": "Find a town by its name; returns its city id.",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string", "description": "the town's name"}},
                "required": ["name"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "forecast",
            "description": "Today's weather in a city, by its city id.",
            "parameters": {
                "type": "object",
                "properties": {"city_id": {"type": "integer", "description": "the city's id"}},
                "required": ["city_id"],
            },
        },
    },
]

_PARTS = (
    ("Oak", "Mill", "Stone", "Red", "Green", "Ash", "Elm", "Fox", "Silver", "North", "West",
     "Clear", "Bright", "Cold", "Iron", "Maple", "Pine", "Rose", "Swan", "Wolf"),
    ("ridge", "brook", "field", "ford", "haven", "wood", "vale", "port", "stead", "bury",
     "ton", "dale", "moor", "gate", "well", "marsh"),
)  # fmt: skip
SKIES = ("sunny", "cloudy", "light rain", "heavy rain", "fog", "snow", "windy", "clear")


def _town(rng: random.Random) -> str:
    """A made-up town's name of two common parts ("Oakbrook"): easy to copy into a call."""
    return rng.choice(_PARTS[0]) + rng.choice(_PARTS[1])


def _towns(n: int = 120, seed: int = 45) -> dict[str, tuple[int, str, str]]:
    """Town -> (its city id, 1000-9999; today's temperature, "2.0" to "34.9" degrees, a
    decimal that answers seldom hold by chance; the sky)."""
    rng, towns, ids = random.Random(seed), {}, set()
    while len(towns) < n:
        town, city_id = _town(rng), rng.randint(1000, 9999)
        if town in towns or city_id in ids:
            continue
        ids.add(city_id)
        towns[town] = (city_id, f"{rng.randint(20, 349) / 10:.1f}", rng.choice(SKIES))
    return towns


TOWNS = _towns()
CITY_IDS = {city_id: town for town, (city_id, _, _) in TOWNS.items()}
HELDOUT, TRAIN = split(
    [f"What is the temperature today in the town of {t}?" for t in TOWNS], seed=45, heldout=30
)


def town_of(q: str) -> str:
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


def find_city(arguments: str | None) -> str:
    """The first tool: a town's name (any case) -> its city id (errors as text, as a real
    tool would, so the model sees them)."""
    try:
        name = str(_arguments(arguments)["name"]).strip()
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc!r}; call find_city with the town's name"
    town = next((t for t in TOWNS if t.lower() == name.lower()), None)
    if town is None:
        return f"error: no town named {name!r}"
    city_id = TOWNS[town][0]
    return f"{town}: city id {city_id}. Call forecast with city_id {city_id} for its weather."


def forecast(arguments: str | None) -> str:
    """The second tool: a city id (a number, or a string of one) -> today's weather."""
    try:
        city_id = int(_arguments(arguments)["city_id"])
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc!r}; call forecast with the city id find_city returned"
    if city_id not in CITY_IDS:
        return f"error: no city with id {city_id}"
    _, degrees, sky = TOWNS[CITY_IDS[city_id]]
    return f"City {city_id} ({CITY_IDS[city_id]}): {degrees} degrees Celsius, {sky}."


# What the agent runs each call with, by the tool's name.
RUN = {"find_city": find_city, "forecast": forecast}


def correct(q: str, answer: str | None) -> bool:
    """The town's temperature ("17.4") appears in the final answer as a number of its own
    (not in "117.4" or "17.45")."""
    degrees = re.escape(TOWNS[town_of(q)][1])
    return re.search(rf"(?<![\d.]){degrees}(?!\d)", answer or "") is not None


def _results(prompt: list[dict]) -> list[str]:
    return [str(m.get("content")) for m in prompt if m["role"] == "tool"]


def _id_known(q: str, prompt: list[dict]) -> bool:
    """`find_city` has already returned the town's id."""
    return find_city(json.dumps({"name": town_of(q)})) in _results(prompt)


def _known(q: str, prompt: list[dict]) -> bool:
    """`forecast` has already returned the town's weather: calling again is no progress."""
    return forecast(json.dumps({"city_id": TOWNS[town_of(q)][0]})) in _results(prompt)


def right_call(q: str, call: dict, id_known: bool = False) -> bool:
    """The call the conversation needs next: `forecast` with the town's id, or, while the
    id is not yet known, `find_city` with the town's name (any case)."""
    try:
        function = call["function"]
        args = _arguments(function.get("arguments"))
        if function["name"] == "forecast":
            return int(args["city_id"]) == TOWNS[town_of(q)][0]
        return (
            function["name"] == "find_city"
            and not id_known
            and str(args["name"]).strip().lower() == town_of(q).lower()
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def question(rollout) -> str:
    return next(m["content"] for m in rollout.prompt if m["role"] == "user")


def reward(rollout) -> float:
    """`examples.weather.task:reward`, the step the rollout takes: an answer scores 1 when it
    holds the town's temperature; a turn that calls tools scores the share of its calls
    that are the call the conversation needs next (`right_call`: `find_city` with the
    town until its id is known, then `forecast` with that id; 0 once the weather is
    already known); a whole conversation (a trajectory member) that ends on a call never
    answered, 0."""
    q = question(rollout)
    calls = rollout.tool_calls
    if not calls:
        return float(correct(q, rollout.text))
    if rollout.kind == "trajectory" or _known(q, rollout.prompt):
        return 0.0
    id_known = _id_known(q, rollout.prompt)
    return sum(right_call(q, c, id_known) for c in calls) / len(calls)


def referee(rollout) -> bool:
    """`examples.weather.task:referee`, the promotion gate's check: the step is right (every
    call right, or the right answer), as `reward` scores 1."""
    return reward(rollout) == 1.0
