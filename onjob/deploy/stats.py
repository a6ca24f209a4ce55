"""Paired comparisons: win rates with confidence intervals, and the canary decision rule."""

from __future__ import annotations

import math
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Sprt:
    """Wald's sequential probability ratio test on paired wins (ties dropped): is the
    challenger's win rate 0.5 + delta (promote) or 0.5 - delta (roll back)? Checked after
    every round, it keeps its error rates (alpha: promoting a worse checkpoint, beta:
    rolling back a better one) however often it looks."""

    delta: float = 0.1
    alpha: float = 0.05
    beta: float = 0.05

    @property
    def upper(self) -> float:
        return math.log((1 - self.beta) / self.alpha)

    @property
    def lower(self) -> float:
        return math.log(self.beta / (1 - self.alpha))

    def llr(self, wins: int, losses: int) -> float:
        p1, p0 = 0.5 + self.delta, 0.5 - self.delta
        return wins * math.log(p1 / p0) + losses * math.log((1 - p1) / (1 - p0))

    def decide(self, wins: int, losses: int) -> str | None:
        llr = self.llr(wins, losses)
        if llr >= self.upper:
            return "promote"
        if llr <= self.lower:
            return "rollback"
        return None
