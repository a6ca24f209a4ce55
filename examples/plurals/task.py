"""The plurals task: 'What is the plural of "mouse"?', its split, its success check,
reward and referee.

SmolLM2-135M-Instruct (bundled) often knows the plural but says more ('The plural of
"box" is "boxes." It follows...'). Measured at temperature 1 on 30 held-out questions x 8
samples (a local `onjob engine` on 2 shared cores): 12.9% of 240 answers exact [95% CI
9.3%, 17.8%], 41.3% with any credit, mean reward 0.27.

    .venv/bin/python examples/single_turn.py plurals --questions 30 --samples 8 \\
        --base-url http://127.0.0.1:8011/v1 --model smollm2-135m-instruct

The 100 nouns (regular ones, -es, -ies, -ves and -oes plurals, and irregular ones such as
"mouse" and "cactus"; none whose plural is the noun itself) are split once by a seeded
shuffle: 30 held out, 70 to train on.
"""

from __future__ import annotations

import re

from examples.single_turn import plain, question, split

MAX_TOKENS = 32

_QUESTION = re.compile(r'What is the plural of "([a-z]+)"\?')

# noun: its accepted plurals
PLURALS = {
    "cat": ("cats",),
    "dog": ("dogs",),
    "book": ("books",),
    "car": ("cars",),
    "tree": ("trees",),
    "house": ("houses",),
    "bird": ("birds",),
    "apple": ("apples",),
    "chair": ("chairs",),
    "table": ("tables",),
    "pen": ("pens",),
    "cup": ("cups",),
    "door": ("doors",),
    "hat": ("hats",),
    "girl": ("girls",),
    "friend": ("friends",),
    "river": ("rivers",),
    "road": ("roads",),
    "star": ("stars",),
    "flower": ("flowers",),
    "shoe": ("shoes",),
    "window": ("windows",),
    "song": ("songs",),
    "ship": ("ships",),
    "lamp": ("lamps",),
    "egg": ("eggs",),
    "hand": ("hands",),
    "boy": ("boys",),
    "day": ("days",),
    "key": ("keys",),
    "toy": ("toys",),
    "monkey": ("monkeys",),
    "valley": ("valleys",),
    "box": ("boxes",),
    "bus": ("buses", "busses"),
    "dish": ("dishes",),
    "church": ("churches",),
    "watch": ("watches",),
    "glass": ("glasses",),
    "fox": ("foxes",),
    "brush": ("brushes",),
    "class": ("classes",),
    "kiss": ("kisses",),
    "match": ("matches",),
    "beach": ("beaches",),
    "dress": ("dresses",),
    "wish": ("wishes",),
    "tax": ("taxes",),
    "peach": ("peaches",),
    "bench": ("benches",),
    "city": ("cities",),
    "baby": ("babies",),
    "lady": ("ladies",),
    "party": ("parties",),
    "story": ("stories",),
    "country": ("countries",),
    "family": ("families",),
    "cherry": ("cherries",),
    "puppy": ("puppies",),
    "body": ("bodies",),
    "berry": ("berries",),
    "fly": ("flies",),
    "knife": ("knives",),
    "wife": ("wives",),
    "leaf": ("leaves",),
    "life": ("lives",),
    "wolf": ("wolves",),
    "half": ("halves",),
    "shelf": ("shelves",),
    "loaf": ("loaves",),
    "calf": ("calves",),
    "thief": ("thieves",),
    "scarf": ("scarves", "scarfs"),
    "potato": ("potatoes",),
    "tomato": ("tomatoes",),
    "hero": ("heroes",),
    "echo": ("echoes",),
    "piano": ("pianos",),
    "photo": ("photos",),
    "radio": ("radios",),
    "zoo": ("zoos",),
    "video": ("videos",),
    "mouse": ("mice",),
    "child": ("children",),
    "man": ("men",),
    "woman": ("women",),
    "foot": ("feet",),
    "tooth": ("teeth",),
    "goose": ("geese",),
    "person": ("people", "persons"),
    "ox": ("oxen",),
    "louse": ("lice",),
    "cactus": ("cacti", "cactuses"),
    "fungus": ("fungi", "funguses"),
    "nucleus": ("nuclei",),
    "crisis": ("crises",),
    "analysis": ("analyses",),
    "thesis": ("theses",),
    "phenomenon": ("phenomena",),
    "criterion": ("criteria",),
}

HELDOUT, TRAIN = split([f'What is the plural of "{n}"?' for n in PLURALS], seed=45, heldout=30)


def messages(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def _noun(q: str) -> str:
    return _QUESTION.search(q).group(1)


def exact(q: str, answer: str | None) -> bool:
    """The answer gives an accepted plural and says nothing else: the plural alone, or the
    one plain sentence 'The plural (form) of "mouse" is "mice".', whatever its case,
    quotes and punctuation. A sentence that goes on, or offers a second form, fails."""
    forms = "|".join(PLURALS[_noun(q)])
    said = rf"(?:the plural(?: form)? of {_noun(q)} is )?(?:{forms})"
    return re.fullmatch(said, plain(answer)) is not None


def grade(q: str, answer: str | None) -> float:
    """1 for the plural said plainly (`exact`), 0.5 for an accepted plural among other
    words (a sentence that goes on, or a list of candidates), 0 otherwise."""
    if exact(q, answer):
        return 1.0
    return 0.5 if set(PLURALS[_noun(q)]) & set(plain(answer).split()) else 0.0


def referee(rollout) -> bool:
    """`examples.plurals.task:referee`, the promotion gate's check: `exact`."""
    return exact(question(rollout), rollout.text)


def reward(rollout) -> float:
    """`examples.plurals.task:reward`: `grade`, whose top grade alone the referee passes."""
    return grade(question(rollout), rollout.text)
