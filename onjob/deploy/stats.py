"""Paired comparisons: win rates with confidence intervals, and the canary decision rule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class WinRate:
    pairs: int
    wins: int  # the challenger (B) scored higher
    ties: int
    losses: int

    @property
    def rate(self) -> float:
        """B's win rate, a tie counting half."""
        return (self.wins + 0.5 * self.ties) / self.pairs if self.pairs else float("nan")

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        """Wilson score interval for the rate (ties as half a win)."""
        n = self.pairs
        if n == 0:
            return (0.0, 1.0)
        p = self.rate
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return (max(0.0, centre - half), min(1.0, centre + half))

    def as_dict(self) -> dict:
        low, high = self.interval()
        return {
            "pairs": self.pairs,
            "wins": self.wins,
            "ties": self.ties,
            "losses": self.losses,
            "win_rate": self.rate,
            "ci95": [low, high],
        }


def tally(outcomes: list[float]) -> WinRate:
    """Outcomes per pair: 1 B won, 0.5 tie, 0 A won."""
    return WinRate(
        len(outcomes),
        sum(o == 1 for o in outcomes),
        sum(o == 0.5 for o in outcomes),
        sum(o == 0 for o in outcomes),
    )


def outcome(a_scores: list[float], b_scores: list[float], margin: float = 1e-9) -> float:
    a, b = sum(a_scores) / len(a_scores), sum(b_scores) / len(b_scores)
    if b > a + margin:
        return 1.0
    if a > b + margin:
        return 0.0
    return 0.5


Decision = Literal["promote", "rollback", "wait"]


@dataclass(frozen=True)
class Sprt:
    """Is the canary better than live? Wald's sequential probability ratio test of win rate
    p = 0.5 (no better) against p = 0.5 + delta, on the pairs that were not tied.

    Promote when the log-likelihood ratio reaches log(1 / alpha). Under any p <= 0.5 the
    likelihood ratio is a non-negative supermartingale that starts at 1, so by Ville's
    inequality the chance it *ever* reaches 1 / alpha is at most alpha: the promotion error
    holds however often the test looks and whenever it stops. Roll back (futility) when the
    ratio falls to beta / (1 - alpha): a canary at 0.5 + delta is rolled back with a chance
    of about beta (Wald's approximation). `bench/decisions.py` measures both."""

    delta: float = 0.1
    alpha: float = 0.05
    beta: float = 0.05

    @property
    def upper(self) -> float:
        return math.log(1 / self.alpha)

    @property
    def lower(self) -> float:
        return math.log(self.beta / (1 - self.alpha))

    def llr(self, wins: int, losses: int) -> float:
        p1 = 0.5 + self.delta
        return wins * math.log(p1 / 0.5) + losses * math.log((1 - p1) / 0.5)

    def decide(self, wins: int, losses: int) -> Decision:
        llr = self.llr(wins, losses)
        if llr >= self.upper:
            return "promote"
        if llr <= self.lower:
            return "rollback"
        return "wait"


@dataclass(frozen=True)
class Rule:
    """The paired part of a canary's verdict: the test, a minimum and a maximum sample, and
    how many pairs may go unjudged. A pair the canary could not answer counts as its loss
    (in `tally`); an undecided test at `max_pairs` keeps live."""

    sprt: Sprt
    min_pairs: int
    max_pairs: int
    max_unjudged_share: float = 0.2

    def decide(self, t: WinRate, unjudged: int = 0) -> tuple[Decision, str]:
        low, high = t.interval()
        summary = f"{t.wins} wins, {t.ties} ties, {t.losses} losses in {t.pairs} pairs"
        if t.pairs:  # no pairs yet: no rate to print (it is nan)
            summary += f" (win rate {t.rate:.2f} [{low:.2f}, {high:.2f}])"
        if t.pairs < self.min_pairs:
            return "wait", f"{summary}: fewer than {self.min_pairs} pairs"
        decision = self.sprt.decide(t.wins, t.losses)
        if decision == "rollback":
            return "rollback", f"lost: {summary}"
        share = unjudged / (t.pairs + unjudged)
        if decision == "promote" and share > self.max_unjudged_share:
            decision = "wait"
            summary += f"; {unjudged} pairs unjudged ({share:.0%}): too many to promote"
        if decision == "promote":
            return "promote", f"won: {summary}"
        if t.pairs >= self.max_pairs:
            return "rollback", f"no decision after {t.pairs} pairs: keep live ({summary})"
        return "wait", f"{summary}: the test has not decided"


Alarm = Literal["trip", "hold"] | None


def increase(canary: tuple[int, int], live: tuple[int, int], limit: float, alpha: float) -> Alarm:
    """Is the canary's rate (hits, n) more than `limit` over live's? "trip" when intervals
    valid at every look (each at alpha / 2) say so, "hold" when only the point estimates
    do, None when neither."""
    (c, cn), (lv, ln) = canary, live
    if not cn or not ln:
        return None
    c_low, _ = anytime_interval(c, cn, alpha / 2)
    _, l_high = anytime_interval(lv, ln, alpha / 2)
    if c_low - l_high > limit:
        return "trip"
    return "hold" if c / cn - lv / ln > limit else None


def majority(hits: int, n: int, alpha: float) -> Alarm:
    """Are more than half of `n` beyond a bound (the canary's median beyond it)? "trip"
    when the interval valid at every look says so, "hold" when the point estimate does."""
    if not n:
        return None
    low, _ = anytime_interval(hits, n, alpha)
    if low > 0.5:
        return "trip"
    return "hold" if hits / n > 0.5 else None


def anytime_interval(hits: int, n: int, alpha: float) -> tuple[float, float]:
    """An interval for a rate that holds at every sample size at once, with chance at least
    1 - alpha: Hoeffding's bound at level alpha / (n (n + 1)) (a union over n; the levels
    sum to alpha). Guards look at every round, so a fixed-n interval would trip by chance."""
    if n == 0:
        return (0.0, 1.0)
    eps = math.sqrt(math.log(2 * n * (n + 1) / alpha) / (2 * n))
    rate = hits / n
    return (max(0.0, rate - eps), min(1.0, rate + eps))


def promotion_chance(rule: Rule, p_win: float, p_tie: float = 0.0) -> float:
    """The exact chance that `rule` promotes when every pair is independently a win, a tie
    or a loss with these probabilities and the rule looks after every pair (the most looks
    it can get): dynamic programming over (wins, ties, losses). What `onjob demo` prints
    and `bench/decisions.py` checks its simulations against."""
    steps = ((1, 0, 0, p_win), (0, 1, 0, p_tie), (0, 0, 1, 1 - p_win - p_tie))
    alive = {(0, 0, 0): 1.0}
    promoted = 0.0
    for _ in range(rule.max_pairs):
        nxt: dict[tuple[int, int, int], float] = {}
        for (wins, ties, losses), mass in alive.items():
            for dw, dt, dl, p in steps:
                if p > 0:
                    key = (wins + dw, ties + dt, losses + dl)
                    nxt[key] = nxt.get(key, 0.0) + mass * p
        alive = {}
        for (wins, ties, losses), mass in nxt.items():
            decision, _ = rule.decide(WinRate(wins + ties + losses, wins, ties, losses))
            if decision == "promote":
                promoted += mass
            elif decision == "wait":
                alive[(wins, ties, losses)] = mass
    return promoted
