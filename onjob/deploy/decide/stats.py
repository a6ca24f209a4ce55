"""Paired comparisons: win rates with confidence intervals, and the release test.

The release test (`Rule`) is one anytime-valid test per candidate on graded paired
differences d = canary's score - live's score in [-1, 1], read in the order the pairs were
made: a betting e-process against "no better than live by `margin`", promoted when its
e-value reaches 1 / alpha_k, where alpha_k is candidate k's level (`spend`, and
`ledger.level` for what the stream gives back). Pure functions and small records: no I/O.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

# Half of each bettor's wealth is spread over fixed bets, as a share of the largest bet
# that keeps every factor positive, from bold to timid: graded, steady differences
# (RULER's scores) grow the wealth fastest near the top, +-1 coin flips with a small edge
# near 0.1. That half's e-value is within log(7) = 1.9 nats of the best single bet in
# hindsight, less where neighbours do as well.
BETS = (0.95, 0.6, 0.4, 0.25, 0.15, 0.08, 0.04)
# The futility bettor's, bolder: its error is beta (a good candidate rolled back), and a
# candidate that loses every held-out pair should be stopped on those few pairs.
FUTILITY_BETS = (0.95, 0.8, 0.6, 0.4, 0.25)
# The other half follows the pairs: each bet sized by the mean and variance of the pairs
# before it (Waudby-Smith & Ramdas's aGRAPA), capped at this share of the largest bet.
# It stakes everything near the best bet once the pairs show it, where the fixed half
# keeps a seventh there. bench/release/decisions.py's graded model, a +0.1 candidate at the first
# candidate's level: median pairs to a decision 70 -> 60; the sign model's 159 -> 154.
PLUG_IN_CAP = 0.9
TIE = 1e-9  # differences closer to 0 than this are ties


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


def tally(differences: list[float]) -> WinRate:
    """Paired differences (B's score - A's) counted by their sign."""
    return WinRate(
        len(differences),
        sum(d > TIE for d in differences),
        sum(abs(d) <= TIE for d in differences),
        sum(d < -TIE for d in differences),
    )


def difference(a_scores: list[float], b_scores: list[float]) -> float:
    """B's mean score minus A's, clipped to [-1, 1] (scores are in [0, 1])."""
    d = sum(b_scores) / len(b_scores) - sum(a_scores) / len(a_scores)
    return min(1.0, max(-1.0, d))


def spend(alpha: float, k: int, planned: int | None = None) -> float:
    """Candidate k's share of `alpha` (k = 1, 2, ... in its stream). Without a plan,
    6 alpha / (pi^2 k^2): the shares of every candidate ever tested sum to alpha (sum of
    1 / k^2 = pi^2 / 6). With `planned` (at most that many candidates in the stream),
    half of that for each, plus alpha / (2 planned) for each of the first `planned`: again
    at most alpha in all, and a late candidate keeps a level that does not vanish (the
    500th of 2196 planned: 1.1e-5 of alpha = 0.05, where 1 / k^2 leaves 1.2e-7). Either
    way, by a union bound the chance that *any* candidate no better than live is promoted
    is at most alpha, however many are tested and however they depend on each other."""
    if k < 1:
        raise ValueError(f"candidates are counted from 1, not {k}")
    steep = 6 * alpha / (math.pi**2 * k * k)
    if planned is None:
        return steep
    return steep / 2 + (alpha / (2 * planned) if k <= planned else 0.0)


class Wealth:
    """A bettor's log-wealth on outcomes x >= -1 / top, read in order. Half its wealth is
    a mixture, with equal weights, of the fixed bets lambda * top for lambda in `bets`,
    each multiplying its share by 1 + lambda x; the other half bets a plug-in lambda_t
    chosen from x_1 .. x_{t-1} alone (`plug_in_bet`). While E[x | the past] <= 0 every
    one of these wealths is a non-negative supermartingale starting at 1, and so is their
    average: by Ville's inequality it *ever* reaches 1 / a with chance at most a, at
    whatever pairs it is looked at and whenever the looking stops."""

    def __init__(self, top: float, bets: tuple[float, ...] = BETS) -> None:
        self.bets = [b * top for b in bets]
        self.logs = [0.0] * len(bets)
        self.cap = PLUG_IN_CAP * top
        self.plug_in_log = 0.0
        self.n, self.sum, self.squares = 0, 0.0, 0.0

    def add(self, x: float, count: int = 1) -> None:
        for _ in range(count):
            for i, bet in enumerate(self.bets):
                self.logs[i] += math.log1p(bet * x)
            self.plug_in_log += math.log1p(self.plug_in_bet() * x)
            self.n, self.sum, self.squares = self.n + 1, self.sum + x, self.squares + x * x

    def plug_in_bet(self) -> float:
        """The next bet: mean / (variance + mean^2) of the outcomes so far, the bet that
        maximises the growth of log-wealth to second order, shrunk toward no edge by one
        prior outcome (mean 0, second moment 1/4) so that the first pairs bet little;
        none while the mean is not above 0, at most `cap`."""
        mean = self.sum / (self.n + 1)
        second = (0.25 + self.squares) / (self.n + 1)
        variance = max(second - mean * mean, 1e-4)
        return 0.0 if mean <= 0 else min(self.cap, mean / (variance + mean * mean))

    @property
    def log_e(self) -> float:
        """log of the e-value: half the fixed bets' mean wealth, half the plug-in's."""
        terms = [v - math.log(2 * len(self.logs)) for v in self.logs]
        terms.append(self.plug_in_log - math.log(2))
        top = max(terms)
        return top + math.log(sum(math.exp(v - top) for v in terms))


Decision = Literal["promote", "rollback", "wait"]
# Where a test stands: too few pairs, lost (futility), won, undecided at the cap, open,
# or stopped because the referee fails on too many pairs (broken).
Standing = Literal["few", "lost", "won", "cap", "open", "broken"]
_DECISIONS: dict[Standing, Decision] = {
    "few": "wait", "lost": "rollback", "won": "promote", "cap": "rollback", "open": "wait",
    "broken": "rollback",
}  # fmt: skip
# The confidence with which a share of pairs set aside must be shown past
# `Rule.max_unjudged_share` before the test stops for a broken referee (at every look).
BROKEN_ALPHA = 0.05


@dataclass
class Paired:
    """The evidence about one candidate so far: its paired differences fed to two bettors.
    `better` bets that E[d] > margin (its e-value tests "no better than live by the
    margin"); `futile` bets that E[d] < margin + delta (its e-value tests "better by the
    margin plus delta", the improvement the test is powered for)."""

    margin: float
    delta: float
    pairs: int = 0
    unjudged: int = 0
    pending: int = 0  # pairs not read yet: one being judged again, and those made after it
    aside: int = 0  # pairs the referee never scored, set aside unread, their prompts replaced
    total: float = 0.0
    better: Wealth = field(init=False)
    futile: Wealth = field(init=False)
    _seen: dict[float, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # The largest bets that keep 1 + bet * x > 0 for every d in [-1, 1].
        self.better = Wealth(1 / (1 + self.margin))
        self.futile = Wealth(1 / (1 - self.margin - self.delta), FUTILITY_BETS)

    def add(self, d: float, count: int = 1) -> None:
        self.pairs += count
        self.total += count * d
        self._seen[d] = self._seen.get(d, 0) + count
        self.better.add(d - self.margin, count)
        self.futile.add(self.margin + self.delta - d, count)

    def add_unjudged(self, count: int = 1) -> None:
        """Pairs the judge could not score after its attempts because of the candidate's
        answers: its losses."""
        self.unjudged += count
        self.add(-1.0, count)

    def set_aside(self, count: int = 1) -> None:
        """Pairs the referee never scored for a failure of its own (`pairs.ab_outcomes`):
        not read by either bettor, and another prompt drawn in their place. Counted
        toward `max_pairs` (each cost the engine) and the referee's failure share."""
        self.aside += count

    @property
    def drawn(self) -> int:
        """Every pair made: those read and those set aside."""
        return self.pairs + self.aside

    @property
    def mean(self) -> float:
        return self.total / self.pairs if self.pairs else float("nan")

    @property
    def tally(self) -> WinRate:
        signs = {"w": 0, "t": 0, "l": 0}
        for d, n in self._seen.items():
            signs["w" if d > TIE else "l" if d < -TIE else "t"] += n
        return WinRate(self.pairs, signs["w"], signs["t"], signs["l"])


@dataclass(frozen=True)
class Rule:
    """Is the candidate better than live? One anytime-valid test on its paired differences
    (its offline pairs first, then its canary's, one e-process throughout).

    Promote when the e-value against "E[d] <= margin" reaches 1 / alpha_k (alpha_k: this
    candidate's share, `spend`): a candidate no better than live by the margin is promoted
    with chance at most alpha_k, however often the rule looks. Roll back when the e-value
    against "E[d] >= margin + delta" reaches 1 / beta (futility: a candidate better by
    margin + delta is rolled back with chance at most beta), or undecided at `max_pairs`
    (every pair counts: ties, unjudged ones and those set aside too). No decision before
    `min_pairs`; more than `max_unjudged_share` of the pairs unjudged holds a promotion
    (they count as the candidate's losses already; so many says the referee is failing).

    A pair the referee never scored for a failure of its own is *set aside* (`Paired.
    set_aside`): unread, its prompt replaced. A share of them past `max_unjudged_share`
    holds a promotion, and past it with 95% confidence at every look (`anytime_interval`)
    the test stops: the referee is broken, and the candidate is not promoted on it. Why
    this keeps the error guarantee: the e-process is a supermartingale on the pairs it
    reads as long as whether a pair is read does not depend on its difference. A failure
    the candidate's answers may have caused is not set aside (`pairs.ab_outcomes` keeps
    it as the candidate's loss: a reward function that raised, a score not finite): only
    a RULER call that failed whole, both arms' answers unread alike (a provider's 429, a
    timeout, its budget). Should such failures still follow the candidate's worst
    answers, the hold bounds what they can gain: the pairs read are at least
    1 - `max_unjudged_share` of those drawn; bench/release/decisions.py measures that case (its
    `by_rank_stuck_on_losses`)."""

    margin: float = 0.0
    delta: float = 0.1
    beta: float = 0.05
    min_pairs: int = 10
    max_pairs: int = 200
    max_unjudged_share: float = 0.2

    def start(self) -> Paired:
        return Paired(self.margin, self.delta)

    def weigh(self, differences: list[float], unjudged: int = 0) -> Paired:
        """The test after `differences` in the order they were made, then `unjudged`
        pairs counted as losses."""
        p = self.start()
        for d in differences:
            p.add(d)
        if unjudged:
            p.add_unjudged(unjudged)
        return p

    def decision(self, p: Paired, alpha: float) -> Decision:
        """The verdict alone (`decide` says why)."""
        return _DECISIONS[self._standing(p, alpha)[0]]

    def decide(self, p: Paired, alpha: float) -> tuple[Decision, str]:
        standing, held = self._standing(p, alpha)
        t = p.tally
        summary = f"{t.wins} wins, {t.ties} ties, {t.losses} losses in {p.pairs} pairs"
        if p.unjudged:
            summary += f" ({p.unjudged} unjudged, counted as losses)"
        if p.pending:
            summary += f" ({p.pending} more waiting for a pair to be judged again)"
        if p.pairs:  # no pairs yet: no mean to print (it is nan)
            summary += (
                f", mean difference {p.mean:+.3f}; e-value {math.exp(p.better.log_e):.3g} "
                f"of {1 / alpha:.3g} to promote, {math.exp(p.futile.log_e):.3g} of "
                f"{1 / self.beta:.3g} to roll back"
            )
        if p.aside:
            summary += f" ({p.aside} more set aside: the referee never scored them)"
        if held:
            summary += "; too many pairs unjudged or set aside to promote"
        match standing:
            case "few":
                why = f"{summary}: fewer than {self.min_pairs} pairs"
            case "won":
                why = f"won: {summary}"
            case "lost":
                why = f"lost (not better by {self.margin + self.delta:g}): {summary}"
            case "cap":
                why = f"no decision after {p.drawn} pairs: keep live ({summary})"
            case "broken":
                why = (
                    f"stopped: the referee is broken, {p.aside} of {p.drawn} pairs never "
                    f"scored (more than {self.max_unjudged_share:.0%}); keep live ({summary})"
                )
            case "open":
                why = f"{summary}: the test has not decided"
        return _DECISIONS[standing], why

    def _standing(self, p: Paired, alpha: float) -> tuple[Standing, bool]:
        """Where the test stands, and whether it won with too many pairs unjudged to
        promote (held)."""
        if p.aside:
            low, _ = anytime_interval(p.aside, p.drawn, BROKEN_ALPHA)
            if low > self.max_unjudged_share:
                return "broken", False
        if p.pairs < self.min_pairs:
            return ("cap" if p.drawn >= self.max_pairs else "few"), False
        if p.futile.log_e >= math.log(1 / self.beta):
            return "lost", False
        won = p.better.log_e >= math.log(1 / alpha)
        failing = max(p.unjudged / p.pairs, p.aside / p.drawn)
        held = won and failing > self.max_unjudged_share
        if won and not held:
            return "won", False
        return ("cap" if p.drawn >= self.max_pairs else "open"), held


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


def promotion_chance(
    rule: Rule, alpha: float, p_win: float, p_tie: float = 0.0, runs: int = 4000, seed: int = 0
) -> float:
    """The chance that `rule` (at level `alpha`) promotes when every pair is independently a
    win (d = 1), a tie (0) or a loss (-1) with these probabilities and the rule looks after
    every pair (the most looks it can get): estimated over `runs` seeded tests (the
    plug-in bet makes the e-value depend on the pairs' order, so counts alone do not fix
    it). What `onjob demo` prints and the tests check."""
    rng = random.Random(seed)
    promoted = 0
    for _ in range(runs):
        paired = rule.start()
        while paired.pairs < rule.max_pairs:
            u = rng.random()
            paired.add(1.0 if u < p_win else 0.0 if u < p_win + p_tie else -1.0)
            decision = rule.decision(paired, alpha)
            if decision != "wait":
                promoted += decision == "promote"
                break
    return promoted / runs
