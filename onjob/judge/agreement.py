"""Is the judge right? How often each judge orders a group's members as users' feedback does.

Within a group, every pair of members that both carry a judge's score and feedback with
different values is a question judge and users both answered. Per judge source and
scenario, and per judge over all scenarios: the **pairwise accuracy** (a judge tie counts
half) with a Wilson interval, **Kendall's tau-b** pooled within groups with a bootstrap
interval over groups (none below `MIN_GROUPS`), and a **verdict**: `too few pairs` below
`MIN_PAIRS`, `agrees` or `disagrees` when the accuracy interval lies above or below 0.5,
else `chance` (the last two warn). Each feedback metric is a question of its own: a
judge is checked against the unnamed feedback and against each named metric apart, never
their mean. Feedback is read as it is now (`tables.MEMBER_FEEDBACK`). docs/judging.md
states the definitions in full.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

import msgspec

from ..collector import Store
from .tables import MEMBER_FEEDBACK, feedback_source

Verdict = Literal["agrees", "chance", "disagrees", "too few pairs"]
WARNED: frozenset[Verdict] = frozenset({"chance", "disagrees"})
MIN_PAIRS = 10  # all 10 agreeing puts Wilson's lower bound at 0.72; 8 of 10 at 0.49
MIN_GROUPS = 10  # for tau's interval
_Z95 = 1.959963984540054
# Bootstrap draws (replicates x groups) per record: ~0.1 s of Python on one core, so
# `onjob status` and the dashboard stay quick with thousands of groups.
_DRAWS = 400_000


@dataclass(frozen=True)
class PairCounts:
    """One group's pairs for one judge: members both judged and rated, two by two."""

    pairs: int  # every pair (tau-b's n0)
    judge_ties: int  # equal judge scores (n1)
    feedback_ties: int  # equal feedback (n2)
    concordant: int
    discordant: int
    judge_ties_rated: int  # equal judge scores, different feedback: half right each


class Agreement(msgspec.Struct, frozen=True, kw_only=True):
    """One judge against users' feedback, in one scenario or (scenario None) in all. A
    record the admin API sends and the client decodes as it is."""

    judge: str  # the score source: ruler:<model> or fn:<name>
    scenario_id: str | None
    scenario: str | None  # the scenario's key
    groups: int
    pairs: int  # pairs with different feedback: what accuracy is out of
    agreed: float  # of them, ordered as users did (a judge tie counts half)
    accuracy: float | None
    accuracy_ci: tuple[float, float] | None  # Wilson 95%
    tau: float | None  # Kendall's tau-b, pooled within groups
    tau_ci: tuple[float, float] | None  # bootstrap over groups, 95% (None: too few groups)
    verdict: Verdict
    metric: str | None = None  # the feedback it is checked against (None: the unnamed)
    warning: bool = False  # the verdict is one of `WARNED` (`of` sets it)

    @property
    def against(self) -> str:
        """The score source of the feedback it is checked against."""
        return feedback_source(self.metric)

    def summary(self) -> str:
        """One line: `fn:exact: 92.0% of 50 pairs agree with users (95% 81.2%–96.8%), ...`."""
        where = f" in {self.scenario}" if self.scenario_id else ""
        if self.metric:
            where += f" (users' {self.metric})"
        if self.verdict == "too few pairs":
            return (
                f"{self.judge}{where}: too few pairs with feedback to tell "
                f"({self.pairs} < {MIN_PAIRS}, {self.groups} groups)"
            )
        low, high = self.accuracy_ci or (0.0, 1.0)
        tau = "tau –" if self.tau is None else f"tau {self.tau:+.2f}"
        if self.tau is not None and self.tau_ci is not None:
            tau += f" ({self.tau_ci[0]:+.2f} to {self.tau_ci[1]:+.2f})"
        return (
            f"{self.judge}{where}: {self.accuracy:.1%} of {self.pairs} pairs agree with users "
            f"(95% {low:.1%}–{high:.1%}), {tau}, {self.groups} groups: {self.verdict}"
        )


def judge_agreement(
    store: Store, *, per_scenario: bool = True, checkpoint: str | None = None
) -> list[Agreement]:
    """Every judge source that has pairs with feedback, per feedback metric: its record over
    all scenarios first, then (unless `per_scenario` is false) one per scenario, most pairs
    first; judges in name order, the unnamed feedback before named metrics. `checkpoint`:
    only the pairs one of whose answers it gave (does the judge agree with users on what
    it says?)."""
    by_judge: dict[tuple[str, str], dict[tuple[str, str | None], list[PairCounts]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for row in _pair_counts(store, checkpoint):
        by_judge[row.judge, row.metric][row.scenario_id, row.scenario].append(
            PairCounts(
                pairs=row.pairs,
                judge_ties=row.judge_ties,
                feedback_ties=row.feedback_ties,
                concordant=row.concordant,
                discordant=row.discordant,
                judge_ties_rated=row.judge_ties_rated,
            )
        )
    out: list[Agreement] = []
    for judge, metric in sorted(by_judge):
        said = {"judge": judge, "metric": metric or None}
        every = [c for groups in by_judge[judge, metric].values() for c in groups]
        out.append(_record(**said, scenario_id=None, scenario=None, groups=every))
        if per_scenario:
            scenarios = [
                _record(**said, scenario_id=sid, scenario=k, groups=g)
                for (sid, k), g in by_judge[judge, metric].items()
            ]
            out += sorted(scenarios, key=lambda a: (-a.pairs, a.scenario_id or ""))
    return out


class _GroupPairs(msgspec.Struct, frozen=True, kw_only=True):
    """One group's `PairCounts` for one judge and feedback metric (`_pair_counts`)."""

    judge: str
    metric: str  # '' for the unnamed feedback
    scenario_id: str | None
    scenario: str | None
    pairs: int
    judge_ties: int
    feedback_ties: int
    concordant: int
    discordant: int
    judge_ties_rated: int


def _pair_counts(store: Store, checkpoint: str | None = None) -> list[_GroupPairs]:
    """Per judge, feedback metric ('' for the unnamed), scenario and group, the pairs of
    members both judged and rated (one of whose answers `checkpoint` gave, when set): one
    DuckDB query (a self-join within groups)."""
    return store.rows(
        _GroupPairs,
        f"""
        WITH judged AS (
            SELECT source AS judge, group_id, member_id, avg(score) AS judge_score
            FROM scores WHERE source LIKE 'ruler:%' OR source LIKE 'fn:%'
            GROUP BY ALL
        ), rated AS (
            SELECT judge, group_id, member_id, judge_score, scenario_id, checkpoint,
                   posted.metric AS metric, posted.value AS feedback
            FROM (SELECT j.*, g.scenario_id, e.checkpoint,
                         unnest({MEMBER_FEEDBACK}) AS posted
                  FROM judged j
                  JOIN members m ON m.id = j.member_id
                  JOIN groups g ON g.id = j.group_id
                  LEFT JOIN exchanges e ON e.id = m.exchange_id)
        ), pairs AS (
            SELECT a.judge, a.metric, a.scenario_id, a.group_id,
                   sign(a.judge_score - b.judge_score) AS j,
                   sign(a.feedback - b.feedback) AS f
            FROM rated a JOIN rated b
              ON a.judge = b.judge AND a.metric = b.metric AND a.group_id = b.group_id
             AND a.member_id < b.member_id
            WHERE ?::VARCHAR IS NULL OR ? IN (a.checkpoint, b.checkpoint)
        )
        SELECT p.judge, p.metric, p.scenario_id, sc.key AS scenario,
               count(*) AS pairs,
               count(*) FILTER (WHERE j = 0) AS judge_ties,
               count(*) FILTER (WHERE f = 0) AS feedback_ties,
               count(*) FILTER (WHERE j * f > 0) AS concordant,
               count(*) FILTER (WHERE j * f < 0) AS discordant,
               count(*) FILTER (WHERE j = 0 AND f <> 0) AS judge_ties_rated
        FROM pairs p LEFT JOIN scenarios sc ON sc.id = p.scenario_id
        GROUP BY p.judge, p.metric, p.scenario_id, sc.key, p.group_id
        ORDER BY p.judge, p.metric, p.scenario_id, p.group_id
        """,
        [checkpoint, checkpoint],
    )


def _record(
    *,
    judge: str,
    metric: str | None,
    scenario_id: str | None,
    scenario: str | None,
    groups: list[PairCounts],
) -> Agreement:
    rated = sum(c.pairs - c.feedback_ties for c in groups)
    agreed = sum(c.concordant + c.judge_ties_rated / 2 for c in groups)
    accuracy = agreed / rated if rated else None
    interval = wilson(agreed, rated) if rated else None
    if rated < MIN_PAIRS or interval is None:
        verdict: Verdict = "too few pairs"
    elif interval[0] > 0.5:
        verdict = "agrees"
    elif interval[1] < 0.5:
        verdict = "disagrees"
    else:
        verdict = "chance"
    return Agreement(
        judge=judge,
        metric=metric,
        scenario_id=scenario_id,
        scenario=scenario,
        groups=len(groups),
        pairs=rated,
        agreed=agreed,
        accuracy=accuracy,
        accuracy_ci=interval,
        tau=tau_b(groups),
        tau_ci=tau_interval(groups),
        verdict=verdict,
        warning=verdict in WARNED,
    )


def wilson(successes: float, n: int, z: float = _Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion (successes may be fractional: ties as half)."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def tau_b(groups: list[PairCounts]) -> float | None:
    """Kendall's tau-b over the pairs within groups: (C - D) / sqrt((n0 - n1)(n0 - n2)).
    None when either side has no untied pair."""
    return _tau(*(sum(column) for column in _columns(groups)))


def tau_interval(
    groups: list[PairCounts], *, level: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap over groups: groups drawn with replacement, tau-b of each draw."""
    if len(groups) < MIN_GROUPS or tau_b(groups) is None:
        return None
    columns = _columns(groups)
    rng = random.Random(seed)
    indices = range(len(groups))
    taus = []
    for _ in range(max(200, min(2000, _DRAWS // len(groups)))):
        drawn = rng.choices(indices, k=len(groups))
        tau = _tau(*(sum(map(column.__getitem__, drawn)) for column in columns))
        if tau is not None:
            taus.append(tau)
    if not taus:
        return None
    taus.sort()
    tail = (1 - level) / 2
    return (taus[int(tail * (len(taus) - 1))], taus[math.ceil((1 - tail) * (len(taus) - 1))])


def _columns(groups: list[PairCounts]) -> tuple[list[int], ...]:
    return (
        [c.pairs for c in groups],
        [c.judge_ties for c in groups],
        [c.feedback_ties for c in groups],
        [c.concordant for c in groups],
        [c.discordant for c in groups],
    )


def _tau(pairs: int, judge_ties: int, feedback_ties: int, concordant: int, discordant: int):
    denominator = (pairs - judge_ties) * (pairs - feedback_ties)
    if denominator <= 0:
        return None
    return (concordant - discordant) / math.sqrt(denominator)
