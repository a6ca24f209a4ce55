"""How many answers per arm a test's next pairs get, and what its decision will cost: the
referee's noise and the engine's tokens, read from the test's own pairs as they come in
(`noise` holds the maths).

With `loop.gate.samples` unset each round of a release test is sized anew (`answers`):
from the pairs made so far, the referee's within and between noise, and the tokens a
prompt and an answer cost, the k that brings a +delta candidate at this candidate's level
(`ledger.level`) to a decision within half of `loop.max_pairs`, under
`loop.decision_tokens`. A pass/fail referee so decides on the mean of several answers
per arm, both arms on one seed, and a graded one on few. The held-out slice's pairs are
read too (the same referee on the same engine), so the first round of the release test
is sized already.

`forecast` is what the verdict, `onjob status` and the A/B page say of it: the pairs and
tokens expected, what happens at `max_pairs`, and the strata the test would use up.
"""

from __future__ import annotations

import math

import msgspec

from ..settings import DeploySettings
from . import ledger, noise
from .evidence import Forecast
from .pairs import HOLDOUT

# Before any pair is made: a prompt of this many tokens, answers at the judge's cap.
PROMPT_TOKENS = 1000

# Each pair's answers, one row per member with a score: its arm, its answer's index in
# the arm's sample (the i-th answers of both arms share the seed's stream), its score.
_SCORES = """
SELECT g.id, m.origin, m.choice, s.score
FROM groups g JOIN members m ON m.group_id = g.id
JOIN scores s ON s.member_id = m.id AND s.source = 'combined'
WHERE g.kind = 'ab' AND g.status = 'scored' AND list_contains(?::VARCHAR[], g.test)
ORDER BY g.id, m.origin, m.choice
"""


class _Score(msgspec.Struct, frozen=True, kw_only=True):
    """One answer's score in a pair (`_SCORES`): `origin` "a" is live's, "b" the
    candidate's; `score` may be NULL or not finite, and is then left out."""

    id: str
    origin: str
    choice: int
    score: float | None


# What the pairs' answers cost the engine: per arm's request, its prompt's tokens and its
# answers' (the usage the engine reported, else the token ids stored).
_TOKENS = """
SELECT avg(coalesce(TRY_CAST(json_extract(e.usage, '$.prompt_tokens') AS DOUBLE),
                    len(e.prompt_token_ids))) AS prompt,
       sum(coalesce(TRY_CAST(json_extract(e.usage, '$.completion_tokens') AS DOUBLE),
                    list_sum(list_transform(e.completion_token_ids, lambda x: len(x)))))
         / sum(len(e.completion_token_ids)) AS answer
FROM exchanges e
WHERE e.source = 'resample' AND len(e.completion_token_ids) > 0 AND e.id IN (
    SELECT DISTINCT m.exchange_id FROM groups g JOIN members m ON m.group_id = g.id
    WHERE g.kind = 'ab' AND list_contains(?::VARCHAR[], g.test))
"""


class _Tokens(msgspec.Struct, frozen=True, kw_only=True):
    """`_TOKENS`' one row: both None before any pair's answers."""

    prompt: float | None
    answer: float | None


# The turns per pair of a release test so far: a fresh draw answers up to four of a
# conversation's turns and its pair is their mean (`prompts._unit`, `pairs._judged`).
_TURNS = """
SELECT count(*) / count(DISTINCT coalesce(p.trajectory_id, g.id)) AS turns
FROM groups g LEFT JOIN exchanges p ON p.id = g.prefix_exchange
WHERE g.kind = 'ab' AND list_contains(?::VARCHAR[], g.test)
"""


def turns_per_pair(store, tests: list[str]) -> float:
    """The mean turns one pair of `tests` read (1 before any); the held-out slice's pairs,
    one turn each, are not the release test's and are left out."""
    release = [t for t in tests if not t.startswith(HOLDOUT)]
    turns = store.scalar(_TURNS, [release]) if release else None
    return float(turns) if turns is not None and math.isfinite(turns) else 1.0


def scores(store, tests: list[str]) -> list[tuple[list[float], list[float]]]:
    """Each scored pair of `tests` as (live's scores, the candidate's), answer by answer."""
    pairs: dict[str, dict[str, list[float]]] = {}
    for r in store.rows(_Score, _SCORES, [list(tests)]):
        if isinstance(r.score, int | float) and math.isfinite(r.score):
            pairs.setdefault(r.id, {"a": [], "b": []}).setdefault(r.origin, []).append(
                float(r.score)
            )
    return [(p["a"], p["b"]) for p in pairs.values()]


def cost(store, tests: list[str], max_tokens: int) -> noise.Cost:
    """Tokens per arm's prompt and per answer, as the pairs of `tests` spent them; before
    any, `PROMPT_TOKENS` and answers at their cap."""
    row = store.rows(_Tokens, _TOKENS, [list(tests)])[0]
    prompt = row.prompt if row.prompt is not None else PROMPT_TOKENS
    answer = row.answer if row.answer is not None else max_tokens
    return noise.Cost(float(prompt), float(answer))


def sizing(
    store, alias: str, candidate: str, tests: list[str], settings: DeploySettings
) -> noise.Sizing:
    """The answers per arm for the next pairs of the candidate's test (`tests`: every test
    of it, the held-out slice's first), and the forecast they were chosen by."""
    return _sized(store, alias, candidate, tests, settings)[0]


def _sized(
    store, alias: str, candidate: str, tests: list[str], settings: DeploySettings
) -> tuple[noise.Sizing, noise.Noise | None, noise.Cost]:
    loop = settings.loop
    alpha = ledger.level(store, alias, candidate, loop).alpha
    measured = noise.measure(scores(store, tests))
    spend = cost(store, tests, settings.judge.max_tokens)
    top = 1 / (1 + loop.margin)
    sized = noise.size(
        measured,
        spend,
        alpha=alpha,
        edge=loop.delta,
        max_pairs=loop.max_pairs,
        budget=loop.decision_tokens,
        top=top,
    )
    k = loop.gate.samples
    if k is None:
        return sized, measured, spend
    # Fixed by the operator: the forecast is at that k.
    if measured is None:
        return noise.Sizing(k, math.nan, math.nan, False, sized.most), measured, spend
    n = noise.pairs_needed(alpha, loop.delta, measured.variance(k), top)
    reaches = n <= noise.SIZED_SHARE * loop.max_pairs
    return noise.Sizing(k, n, n * spend.per_pair(k), reaches, sized.most), measured, spend


def forecast(
    store,
    alias: str,
    candidate: str,
    tests: list[str],
    settings: DeploySettings,
    *,
    pairs: int,
) -> Forecast:
    """What the candidate's test expects to cost (`pairs`: the pairs it read so far), and
    what it does at `max_pairs`."""
    loop = settings.loop
    sized, measured, spend = _sized(store, alias, candidate, tests, settings)
    known = math.isfinite(sized.pairs)
    # The noise is a turn's; a pair of several turns (their mean) is read as that many
    # independent ones: a conversation whose turns agree with each other needs more.
    turns = turns_per_pair(store, tests)
    return Forecast(
        answers=sized.answers,
        most_answers=sized.most,
        fixed=loop.gate.samples is not None,
        pairs_expected=round(sized.pairs / turns) if known else None,
        pairs_so_far=pairs,
        tokens_per_pair=round(spend.per_pair(sized.answers) * turns),
        tokens_expected=round(sized.tokens) if known else None,
        budget=loop.decision_tokens,
        sd=measured.sd(sized.answers) if measured else None,
        within=measured.within if measured else None,
        between=measured.between if measured else None,
        max_pairs=loop.max_pairs,
        reaches=sized.reaches,
    )
