"""The languages task: "What language is spoken in Brazil? Answer in one short
sentence.", its split, its success check, reward and referee.

The suite's rambling task: the answer is one word, and SmolLM2-135M-Instruct (bundled)
often knows it, but buries it in prose that runs past `MAX_TOKENS` ("In Paraguay, then -
Spanish is the state language, and it's often considered the sole official official
language of the country" and no further), so the reward's 0.5 (the language amid other
text) is GRPO's signal toward saying it plainly. Measured at temperature 1 on 30
held-out questions x 8 samples (a local `onjob engine` on 2 shared cores): 10.4% of 240
answers said plainly [95% CI 7.2%, 14.9%], 61.3% with any credit, mean reward 0.36 (a
first run: 10.4%, 56.7%, 0.34); about half the answers are cut at `MAX_TOKENS`.

    .venv/bin/python examples/single_turn.py languages --questions 30 --samples 8 \\
        --base-url http://127.0.0.1:8011/v1 --model SmolLM2-135M-Instruct

Without "Answer in one short sentence." 1 of 64 answers was plain (16 questions x 4).
The 111 countries (each with the one-word names of the languages accepted for it: its
official or main ones) are split once by a seeded shuffle: 30 held out, 81 to train on.
"""

from __future__ import annotations

import re

from examples.single_turn import plain, question, split

MAX_TOKENS = 24
WORDS = 12  # the most words a plain answer says

_QUESTION = re.compile(r"What language is spoken in (.+?)\?")

# country: the languages accepted for it
LANGUAGES = {
    "France": ("french",),
    "Germany": ("german",),
    "Italy": ("italian",),
    "Spain": ("spanish", "castilian"),
    "Portugal": ("portuguese",),
    "Brazil": ("portuguese",),
    "Mexico": ("spanish",),
    "Argentina": ("spanish",),
    "Chile": ("spanish",),
    "Peru": ("spanish", "quechua", "aymara"),
    "Colombia": ("spanish",),
    "Venezuela": ("spanish",),
    "Cuba": ("spanish",),
    "Uruguay": ("spanish",),
    "Ecuador": ("spanish",),
    "Bolivia": ("spanish", "quechua", "aymara", "guarani"),
    "Paraguay": ("spanish", "guarani"),
    "Costa Rica": ("spanish",),
    "Guatemala": ("spanish",),
    "Honduras": ("spanish",),
    "Nicaragua": ("spanish",),
    "Panama": ("spanish",),
    "El Salvador": ("spanish",),
    "the Dominican Republic": ("spanish",),
    "Japan": ("japanese",),
    "China": ("chinese", "mandarin"),
    "Taiwan": ("chinese", "mandarin"),
    "South Korea": ("korean",),
    "North Korea": ("korean",),
    "Vietnam": ("vietnamese",),
    "Thailand": ("thai",),
    "Laos": ("lao", "laotian"),
    "Cambodia": ("khmer", "cambodian"),
    "Myanmar": ("burmese",),
    "Indonesia": ("indonesian", "bahasa"),
    "Malaysia": ("malay", "bahasa"),
    "the Philippines": ("filipino", "tagalog", "english"),
    "Mongolia": ("mongolian",),
    "Russia": ("russian",),
    "Ukraine": ("ukrainian",),
    "Belarus": ("belarusian", "russian"),
    "Poland": ("polish",),
    "the Czech Republic": ("czech",),
    "Slovakia": ("slovak",),
    "Hungary": ("hungarian", "magyar"),
    "Romania": ("romanian",),
    "Moldova": ("romanian", "moldovan"),
    "Bulgaria": ("bulgarian",),
    "Serbia": ("serbian",),
    "Croatia": ("croatian",),
    "Slovenia": ("slovenian", "slovene"),
    "North Macedonia": ("macedonian",),
    "Greece": ("greek",),
    "Cyprus": ("greek", "turkish"),
    "Turkey": ("turkish",),
    "Albania": ("albanian",),
    "Sweden": ("swedish",),
    "Norway": ("norwegian",),
    "Denmark": ("danish",),
    "Finland": ("finnish", "swedish"),
    "Iceland": ("icelandic",),
    "Estonia": ("estonian",),
    "Latvia": ("latvian",),
    "Lithuania": ("lithuanian",),
    "the Netherlands": ("dutch",),
    "Austria": ("german",),
    "Ireland": ("english", "irish"),
    "the United Kingdom": ("english",),
    "the United States": ("english",),
    "Australia": ("english",),
    "New Zealand": ("english", "maori"),
    "Jamaica": ("english",),
    "Canada": ("english", "french"),
    "Belgium": ("dutch", "french", "german", "flemish"),
    "Luxembourg": ("luxembourgish", "french", "german"),
    "Malta": ("maltese", "english"),
    "Israel": ("hebrew",),
    "Egypt": ("arabic",),
    "Saudi Arabia": ("arabic",),
    "Morocco": ("arabic", "berber"),
    "Algeria": ("arabic", "berber"),
    "Tunisia": ("arabic",),
    "Libya": ("arabic",),
    "Iraq": ("arabic", "kurdish"),
    "Syria": ("arabic",),
    "Jordan": ("arabic",),
    "Lebanon": ("arabic",),
    "Yemen": ("arabic",),
    "Oman": ("arabic",),
    "Qatar": ("arabic",),
    "Kuwait": ("arabic",),
    "Iran": ("persian", "farsi"),
    "Afghanistan": ("pashto", "dari", "persian"),
    "Pakistan": ("urdu", "english"),
    "India": ("hindi", "english"),
    "Bangladesh": ("bengali", "bangla"),
    "Nepal": ("nepali",),
    "Sri Lanka": ("sinhala", "sinhalese", "tamil"),
    "Armenia": ("armenian",),
    "Georgia": ("georgian",),
    "Azerbaijan": ("azerbaijani", "azeri"),
    "Kazakhstan": ("kazakh", "russian"),
    "Uzbekistan": ("uzbek",),
    "Kyrgyzstan": ("kyrgyz", "russian"),
    "Ethiopia": ("amharic",),
    "Kenya": ("swahili", "english"),
    "Tanzania": ("swahili", "english"),
    "Somalia": ("somali", "arabic"),
    "Angola": ("portuguese",),
    "Mozambique": ("portuguese",),
    "Senegal": ("french",),
}

# Every language the table names, and a few others an answer may name instead.
NAMES = {lang for accepted in LANGUAGES.values() for lang in accepted} | {
    "latin",
    "hindustani",
    "cantonese",
    "catalan",
    "basque",
    "welsh",
    "scottish",
    "yiddish",
    "creole",
    "afrikaans",
    "zulu",
    "hausa",
    "yoruba",
    "bosnian",
    "tajik",
    "turkmen",
    "punjabi",
    "tamil",
    "malagasy",
}

HELDOUT, TRAIN = split([f"What language is spoken in {c}?" for c in LANGUAGES], seed=45, heldout=30)


def messages(q: str) -> list[dict]:
    return [{"role": "user", "content": f"{q} Answer in one short sentence."}]


def languages(q: str) -> tuple[str, ...]:
    return LANGUAGES[_QUESTION.search(q).group(1)]


def _sentences(answer: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+|\n+", answer.strip()) if plain(s)]


def exact(q: str, answer: str | None) -> bool:
    """The answer says it plainly: one sentence of at most `WORDS` words ("Portuguese.",
    "The official language of Brazil is Portuguese.") that names an accepted language and
    no other, whatever its case, accents and punctuation. Prose that goes on, a second
    sentence, or another language named besides ("Spanish and Portuguese") fails."""
    words = plain(answer).split()
    named = NAMES & set(words)
    return (
        len(_sentences(answer or "")) == 1
        and len(words) <= WORDS
        and bool(named)
        and named <= set(languages(q))
    )


def grade(q: str, answer: str | None) -> float:
    """1 for an accepted language said plainly (`exact`), 0.5 for one amid other text (the
    answer buried in prose, or a list of candidates), 0 otherwise."""
    if exact(q, answer):
        return 1.0
    return 0.5 if set(languages(q)) & set(plain(answer).split()) else 0.0


def referee(rollout) -> bool:
    """`examples.languages.task:referee`, the promotion gate's check: `exact`."""
    return exact(question(rollout), rollout.text)


def reward(rollout) -> float:
    """`examples.languages.task:reward`: `grade`, whose top grade alone the referee passes."""
    return grade(question(rollout), rollout.text)
