"""The capitals task: "What is the capital of Peru?", its split, its success check,
reward and referee. Scored exactly: the reward is the referee's verdict, 1 or 0.

SmolLM2-135M-Instruct (bundled) often says "The capital of Norway is Oslo." but as often
names a wrong city or goes on. Measured at temperature 1 on 30 held-out questions x 8
samples (a local `onjob engine` on 2 shared cores): 9.6% of 240 answers exact [95% CI
6.5%, 14.0%].

    .venv/bin/python examples/single_turn.py capitals --questions 30 --samples 8 \\
        --base-url http://127.0.0.1:8011/v1 --model smollm2-135m-instruct

The 110 countries are split once by a seeded shuffle: 30 held out, 80 to train on.
"""

from __future__ import annotations

import re

from examples.single_turn import plain, question, split

MAX_TOKENS = 32

_QUESTION = re.compile(r"What is the capital of (.+?)\?")

# country: its capital (and the other names accepted for it)
CAPITALS = {
    "France": ("Paris",),
    "Germany": ("Berlin",),
    "Italy": ("Rome",),
    "Spain": ("Madrid",),
    "Portugal": ("Lisbon",),
    "the United Kingdom": ("London",),
    "Ireland": ("Dublin",),
    "the Netherlands": ("Amsterdam",),
    "Belgium": ("Brussels",),
    "Austria": ("Vienna",),
    "Switzerland": ("Bern", "Berne"),
    "Poland": ("Warsaw",),
    "the Czech Republic": ("Prague",),
    "Hungary": ("Budapest",),
    "Greece": ("Athens",),
    "Sweden": ("Stockholm",),
    "Norway": ("Oslo",),
    "Denmark": ("Copenhagen",),
    "Finland": ("Helsinki",),
    "Iceland": ("Reykjavik",),
    "Russia": ("Moscow",),
    "Ukraine": ("Kyiv", "Kiev"),
    "Romania": ("Bucharest",),
    "Bulgaria": ("Sofia",),
    "Serbia": ("Belgrade",),
    "Croatia": ("Zagreb",),
    "Turkey": ("Ankara",),
    "Egypt": ("Cairo",),
    "Morocco": ("Rabat",),
    "Algeria": ("Algiers",),
    "Tunisia": ("Tunis",),
    "Libya": ("Tripoli",),
    "Nigeria": ("Abuja",),
    "Ghana": ("Accra",),
    "Kenya": ("Nairobi",),
    "Ethiopia": ("Addis Ababa",),
    "Uganda": ("Kampala",),
    "Tanzania": ("Dodoma",),
    "South Africa": ("Pretoria", "Cape Town", "Bloemfontein"),
    "Senegal": ("Dakar",),
    "Zimbabwe": ("Harare",),
    "Zambia": ("Lusaka",),
    "Angola": ("Luanda",),
    "Sudan": ("Khartoum",),
    "Somalia": ("Mogadishu",),
    "Madagascar": ("Antananarivo",),
    "Saudi Arabia": ("Riyadh",),
    "Iran": ("Tehran",),
    "Iraq": ("Baghdad",),
    "Syria": ("Damascus",),
    "Jordan": ("Amman",),
    "Lebanon": ("Beirut",),
    "Afghanistan": ("Kabul",),
    "Pakistan": ("Islamabad",),
    "India": ("New Delhi",),
    "Bangladesh": ("Dhaka",),
    "Nepal": ("Kathmandu",),
    "China": ("Beijing",),
    "Japan": ("Tokyo",),
    "South Korea": ("Seoul",),
    "North Korea": ("Pyongyang",),
    "Mongolia": ("Ulaanbaatar", "Ulan Bator"),
    "Vietnam": ("Hanoi",),
    "Thailand": ("Bangkok",),
    "Cambodia": ("Phnom Penh",),
    "Laos": ("Vientiane",),
    "Malaysia": ("Kuala Lumpur",),
    "Indonesia": ("Jakarta",),
    "the Philippines": ("Manila",),
    "Australia": ("Canberra",),
    "New Zealand": ("Wellington",),
    "Fiji": ("Suva",),
    "Canada": ("Ottawa",),
    "the United States": ("Washington, D.C.", "Washington"),
    "Mexico": ("Mexico City",),
    "Cuba": ("Havana",),
    "Jamaica": ("Kingston",),
    "Haiti": ("Port-au-Prince",),
    "Guatemala": ("Guatemala City",),
    "Honduras": ("Tegucigalpa",),
    "Nicaragua": ("Managua",),
    "Costa Rica": ("San José",),
    "Panama": ("Panama City",),
    "Colombia": ("Bogotá",),
    "Venezuela": ("Caracas",),
    "Ecuador": ("Quito",),
    "Peru": ("Lima",),
    "Bolivia": ("Sucre", "La Paz"),
    "Chile": ("Santiago",),
    "Argentina": ("Buenos Aires",),
    "Uruguay": ("Montevideo",),
    "Paraguay": ("Asunción",),
    "Brazil": ("Brasília",),
    "Kazakhstan": ("Astana",),
    "Uzbekistan": ("Tashkent",),
    "Georgia": ("Tbilisi",),
    "Armenia": ("Yerevan",),
    "Azerbaijan": ("Baku",),
    "Qatar": ("Doha",),
    "the United Arab Emirates": ("Abu Dhabi",),
    "Oman": ("Muscat",),
    "Estonia": ("Tallinn",),
    "Latvia": ("Riga",),
    "Lithuania": ("Vilnius",),
    "Belarus": ("Minsk",),
    "Slovakia": ("Bratislava",),
    "Slovenia": ("Ljubljana",),
    "Albania": ("Tirana",),
    "Cyprus": ("Nicosia",),
    "Malta": ("Valletta",),
}

HELDOUT, TRAIN = split([f"What is the capital of {c}?" for c in CAPITALS], seed=45, heldout=30)


def messages(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def _country(q: str) -> str:
    return _QUESTION.search(q).group(1)


def exact(q: str, answer: str | None) -> bool:
    """The answer names the capital and says nothing else: the city's name alone, or one
    plain sentence that names it the capital ("The capital of Peru is Lima.", "The
    capital is Lima.", "Lima is the capital of Peru."), whatever its case, accents and
    punctuation. "Lima, Peru", "Lima or Cusco" and a sentence that goes on fail."""
    country = _country(q)
    cities = "|".join(re.escape(plain(c)) for c in CAPITALS[country])
    of = rf"of (?:the )?{re.escape(plain(country.removeprefix('the ')))}"
    said = (
        rf"(?:(?:the capital(?: city)? {of} is|the capital is|it is) )?(?:{cities})"
        rf"|(?:{cities}) is the capital(?: city)? {of}"
    )
    return re.fullmatch(said, plain(answer)) is not None


def grade(q: str, answer: str | None) -> float:
    """1 or 0, `exact`'s verdict: no credit for a near miss."""
    return float(exact(q, answer))


def referee(rollout) -> bool:
    """`examples.capitals.task:referee`, the promotion gate's check: `exact`."""
    return exact(question(rollout), rollout.text)


def reward(rollout) -> float:
    """`examples.capitals.task:reward`: the referee's verdict as 1 or 0."""
    return grade(question(rollout), rollout.text)
