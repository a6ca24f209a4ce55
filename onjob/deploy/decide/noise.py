"""How noisy the referee is, how many answers per arm a pair needs, and what a decision
will cost: pure functions of the pairs' per-answer scores and the rule's parameters.

A pair's difference with k answers per arm (both arms on one seed) is
d = mean(b_1..b_k) - mean(a_1..a_k), and over the traffic

    Var(d) = B + W / k

B the *between* part (how much the candidate's true edge varies from prompt to prompt:
no number of answers removes it) and W the *within* part (the spread of one answer pair's
difference b_i - a_i on one prompt: the referee's coarseness and the sampler's luck). A
pass/fail referee has W near 0.5 and B near 0.01: one answer per arm leaves each pair a
coin flip, and eight answers cut the spread threefold. A graded referee has a small W,
and more answers buy little. `measure` estimates both as pairs come in: W from the k
paired answers of each pair with k >= 2 (the sample variance of b_i - a_i, unbiased for
the within spread whatever the seed's pairing does), B from the spread of the d's less
what W explains.

Choosing k from earlier pairs alone keeps the test valid: every pair's expected
difference is the candidate's mean edge whatever k it was drawn with, so the e-process
(`stats.Wealth`) stays a supermartingale under "no better", whatever k each pair has.

`pairs_needed` is the forecast the test is sized by: the plug-in bettor's growth per
pair at the edge the test is powered for (`delta` over the margin) and the measured
variance, the second-order growth of log-wealth of a bet capped as `stats.PLUG_IN_CAP`
caps it, and the pairs that growth needs to reach 1 / alpha_k (half the wealth is the
plug-in's: log 2 more). On bench/release/decisions.py's graded model it says 76 pairs at the
first level and 186 at the 500th, where the simulation's medians are 72 and 180.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .stats import PLUG_IN_CAP

# Answers per arm before the referee's noise is known: two is the fewest that measure
# the within part, and bench/release/pair_noise.py's real model decided fastest per engine
# second at two on one seed.
FIRST_ANSWERS = 2
# The most answers per arm: a RULER referee reads both arms' answers in one call (32 at
# this cap), and past it a pass/fail referee's within part is under a tenth of its
# between part on bench/release/decisions.py's model.
MOST_ANSWERS = 16
# Pairs with k >= 2 answers before the measured noise sizes k (fewer: FIRST_ANSWERS).
MIN_MEASURED = 4
# The share of `max_pairs` a test is sized to decide in at this level: the pairs to a
# decision spread around their forecast, and at half the cap a +delta candidate decides
# before it in bench/release/decisions.py's models 9 times in 10 or more.
SIZED_SHARE = 0.5


@dataclass(frozen=True)
class Noise:
    """The referee's noise measured on a test's pairs: `within` (W, one answer pair's
    difference's variance on one prompt), `between` (B), the pairs it was read from, and
    how many of those had two answers or more (`measured`: W is read from them)."""

    pairs: int
    measured: int
    within: float
    between: float

    def variance(self, k: int) -> float:
        """A pair's difference's variance with k answers per arm."""
        return self.between + self.within / k

    def sd(self, k: int) -> float:
        return math.sqrt(self.variance(k))


@dataclass
class Measuring:
    """The running sums `measure` reads: each pair added as it comes (the simulation adds
    thousands; the loop reads a test's pairs at once)."""

    pairs: int = 0
    measured: int = 0
    within_sum: float = 0.0  # the pairs' within variances, summed
    explained: float = 0.0  # each pair's W / k, summed (with W as measured when added)
    d_sum: float = 0.0
    d_squares: float = 0.0

    def add(self, a: list[float], b: list[float]) -> None:
        if not a or not b:
            return
        k = min(len(a), len(b))
        if len(a) == len(b) and k >= 2:
            diffs = [y - x for x, y in zip(a, b, strict=True)]
            mean = sum(diffs) / k
            self.within_sum += sum((x - mean) ** 2 for x in diffs) / (k - 1)
            self.measured += 1
        d = sum(b) / len(b) - sum(a) / len(a)
        self.pairs += 1
        self.d_sum += d
        self.d_squares += d * d
        self.explained += 1 / k

    def noise(self) -> Noise | None:
        """None before `MIN_MEASURED` pairs with two answers or more."""
        if self.measured < MIN_MEASURED:
            return None
        within = self.within_sum / self.measured
        mean = self.d_sum / self.pairs
        spread = (self.d_squares - self.pairs * mean * mean) / (self.pairs - 1)
        between = spread - within * self.explained / self.pairs
        return Noise(self.pairs, self.measured, within, max(0.0, between))


def measure(pairs: list[tuple[list[float], list[float]]]) -> Noise | None:
    """The noise of pairs given as (live's scores, candidate's scores), one score per
    answer, the i-th answers of both arms drawn on one seed. None before `MIN_MEASURED`
    pairs with two answers or more."""
    m = Measuring()
    for a, b in pairs:
        m.add(a, b)
    return m.noise()


def growth(edge: float, variance: float, top: float = 1.0) -> float:
    """Log-wealth per pair of the plug-in bet on differences of mean `edge` over the null
    and this variance: the bet edge / (variance + edge^2) (at most `PLUG_IN_CAP` of the
    largest safe bet `top`), to second order."""
    second = variance + edge * edge
    bet = min(PLUG_IN_CAP * top, edge / second) if edge > 0 else 0.0
    return bet * edge - bet * bet * second / 2


def pairs_needed(alpha: float, edge: float, variance: float, top: float = 1.0) -> float:
    """The pairs a candidate `edge` better than the null needs to reach 1 / alpha, at this
    variance (inf when it has no edge)."""
    g = growth(edge, variance, top)
    return (math.log(1 / alpha) + math.log(2)) / g if g > 0 else math.inf


@dataclass(frozen=True)
class Cost:
    """Engine tokens a pair spends: each arm reads the prompt once (its answers share the
    prefill) and writes k answers."""

    prompt: float  # tokens per arm's prompt
    answer: float  # tokens per answer

    def per_pair(self, k: int) -> float:
        return 2 * (self.prompt + k * self.answer)

    def most_answers(self, budget: float | None, max_pairs: int) -> int:
        """The most answers per arm with which `max_pairs` pairs stay within `budget`
        tokens (at least one; `MOST_ANSWERS` at most)."""
        if budget is None:
            return MOST_ANSWERS
        k = math.floor((budget / max_pairs / 2 - self.prompt) / max(self.answer, 1.0))
        return max(1, min(MOST_ANSWERS, k))


@dataclass(frozen=True)
class Sizing:
    """The answers per arm for the next pairs, and the forecast they were chosen by."""

    answers: int
    pairs: float  # expected pairs to a decision for a +delta candidate at this level
    tokens: float  # and the engine tokens they spend
    reaches: bool  # whether that forecast is within the share of max_pairs sized for
    most: int  # the most answers the budget allows


def size(
    noise: Noise | None,
    cost: Cost,
    *,
    alpha: float,
    edge: float,
    max_pairs: int,
    budget: float | None,
    top: float = 1.0,
) -> Sizing:
    """Answers per arm for the next pairs: of the k the budget allows, the one that decides
    a candidate `edge` better at level `alpha` within `SIZED_SHARE` of `max_pairs` for the
    fewest tokens; when none does, the fewest answers within a tenth of the most any k
    gets (past it the between part dominates and answers buy little)."""
    most = cost.most_answers(budget, max_pairs)
    if noise is None:
        k = min(FIRST_ANSWERS, most)
        return Sizing(k, math.nan, math.nan, False, most)
    forecast = {k: pairs_needed(alpha, edge, noise.variance(k), top) for k in range(1, most + 1)}
    sized = SIZED_SHARE * max_pairs
    fits = [k for k, n in forecast.items() if n <= sized]
    if fits:
        k = min(fits, key=lambda k: (forecast[k] * cost.per_pair(k), k))
    else:
        best = min(forecast.values())
        k = min(k for k, n in forecast.items() if n <= 1.1 * best)
    return Sizing(k, forecast[k], forecast[k] * cost.per_pair(k), bool(fits), most)
