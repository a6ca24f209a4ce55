"""The antonyms task: 'What is the opposite of "hot"? Answer with one word.', its split,
its success check, reward and referee.

The suite's near-zero task: SmolLM2-135M-Instruct (bundled) nearly always answers in a
sentence ('The opposite of "hot" is "cold."') or rambles, so the reward's 0.5 (the
opposite among other words) is GRPO's signal. Measured at temperature 1 on 30 held-out
questions x 8 samples (a local `onjob engine` on 2 shared cores): 0.0% of 240 answers
exact [95% CI 0.0%, 1.6%], 12.5% with any credit, mean reward 0.06.

    .venv/bin/python examples/single_turn.py antonyms --questions 30 --samples 8 \\
        --base-url http://127.0.0.1:8011/v1 --model smollm2-135m-instruct

The 118 words (common adjectives, verbs, nouns and prepositions, each with the one-word
opposites accepted for it) are split once by a seeded shuffle: 30 held out, 88 to train
on.
"""

from __future__ import annotations

import re

from examples.single_turn import question, split

MAX_TOKENS = 32

_QUESTION = re.compile(r'What is the opposite of "([a-z]+)"\?')

# word: its accepted opposites
OPPOSITES = {
    "hot": ("cold",),
    "big": ("small", "little"),
    "up": ("down",),
    "open": ("closed", "close", "shut"),
    "fast": ("slow",),
    "happy": ("sad", "unhappy"),
    "light": ("dark", "heavy"),
    "old": ("new", "young"),
    "early": ("late",),
    "rich": ("poor",),
    "strong": ("weak",),
    "wet": ("dry",),
    "hard": ("soft", "easy"),
    "full": ("empty",),
    "day": ("night",),
    "win": ("lose",),
    "buy": ("sell",),
    "push": ("pull",),
    "love": ("hate",),
    "true": ("false",),
    "good": ("bad", "evil"),
    "long": ("short",),
    "tall": ("short",),
    "high": ("low",),
    "in": ("out",),
    "left": ("right",),
    "begin": ("end", "finish"),
    "clean": ("dirty",),
    "thick": ("thin",),
    "wide": ("narrow",),
    "deep": ("shallow",),
    "loud": ("quiet", "soft"),
    "cheap": ("expensive",),
    "safe": ("dangerous", "unsafe"),
    "alive": ("dead",),
    "asleep": ("awake",),
    "black": ("white",),
    "north": ("south",),
    "east": ("west",),
    "above": ("below",),
    "before": ("after",),
    "inside": ("outside",),
    "always": ("never",),
    "friend": ("enemy", "foe"),
    "question": ("answer",),
    "give": ("take", "receive"),
    "arrive": ("leave", "depart"),
    "remember": ("forget",),
    "accept": ("reject", "refuse", "decline"),
    "increase": ("decrease",),
    "maximum": ("minimum",),
    "first": ("last",),
    "front": ("back", "rear"),
    "top": ("bottom",),
    "sweet": ("sour", "bitter"),
    "smooth": ("rough",),
    "polite": ("rude", "impolite"),
    "heavy": ("light",),
    "near": ("far",),
    "young": ("old",),
    "war": ("peace",),
    "laugh": ("cry",),
    "borrow": ("lend",),
    "noisy": ("quiet", "silent"),
    "come": ("go",),
    "visible": ("invisible",),
    "possible": ("impossible",),
    "legal": ("illegal",),
    "correct": ("incorrect", "wrong"),
    "honest": ("dishonest",),
    "agree": ("disagree",),
    "appear": ("disappear",),
    "import": ("export",),
    "minor": ("major",),
    "positive": ("negative",),
    "success": ("failure",),
    "victory": ("defeat",),
    "ancient": ("modern",),
    "guilty": ("innocent",),
    "public": ("private",),
    "entrance": ("exit",),
    "sunrise": ("sunset",),
    "summer": ("winter",),
    "morning": ("evening", "night"),
    "float": ("sink",),
    "shout": ("whisper",),
    "attack": ("defend", "defense", "defence"),
    "boy": ("girl",),
    "man": ("woman",),
    "king": ("queen",),
    "husband": ("wife",),
    "brother": ("sister",),
    "male": ("female",),
    "plus": ("minus",),
    "multiply": ("divide",),
    "odd": ("even",),
    "sharp": ("dull", "blunt"),
    "tight": ("loose",),
    "careful": ("careless",),
    "useful": ("useless",),
    "healthy": ("unhealthy", "sick", "ill"),
    "wise": ("foolish", "unwise", "stupid"),
    "kind": ("cruel", "unkind", "mean"),
    "ugly": ("beautiful", "pretty"),
    "same": ("different",),
    "simple": ("complex", "complicated"),
    "forward": ("backward", "backwards"),
    "everything": ("nothing",),
    "yes": ("no",),
    "on": ("off",),
    "over": ("under",),
    "with": ("without",),
    "upstairs": ("downstairs",),
    "rise": ("fall", "set"),
    "lose": ("win", "find"),
    "student": ("teacher",),
    "mother": ("father",),
    "sit": ("stand",),
}

HELDOUT, TRAIN = split([f'What is the opposite of "{w}"?' for w in OPPOSITES], seed=45, heldout=30)


def messages(q: str) -> list[dict]:
    return [{"role": "user", "content": f"{q} Answer with one word."}]


def _words(answer: str | None) -> list[str]:
    return re.findall(r"[a-z]+", (answer or "").lower())


def opposites(q: str) -> tuple[str, ...]:
    return OPPOSITES[_QUESTION.search(q).group(1)]


def exact(q: str, answer: str | None) -> bool:
    """The answer is one accepted opposite alone: one word, whatever its case, quotes or
    final full stop ("Cold." and '"cold"' pass; "The opposite is cold." does not)."""
    return _words(answer) in ([w] for w in opposites(q))


def grade(q: str, answer: str | None) -> float:
    """1 for an accepted opposite alone (`exact`), 0.5 for one among other words (a
    sentence, or a list of candidates), 0 otherwise."""
    if exact(q, answer):
        return 1.0
    return 0.5 if set(opposites(q)) & set(_words(answer)) else 0.0


def referee(rollout) -> bool:
    """`examples.antonyms.task:referee`, the promotion gate's check: `exact`."""
    return exact(question(rollout), rollout.text)


def reward(rollout) -> float:
    """`examples.antonyms.task:reward`: `grade`, whose top grade alone the referee passes."""
    return grade(question(rollout), rollout.text)
