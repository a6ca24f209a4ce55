"""The canary's decision rule, as a statistician reads it: a canary no better than live is
promoted at most its share of `alpha` of the time however often the rule looks; a pair
the canary could not answer is its loss; too many unjudged pairs hold a promotion; guard
intervals hold at every look. Probabilities on +-1 pairs looked at after every pair
(`stats.promotion_chance`, 4000 seeded tests: the plug-in bet makes the e-value depend on
the pairs' order, so no exact count-by-count sum). Power on graded scores, with ties, is in
tests/test_stats.py."""

from __future__ import annotations

import pytest

from onjob.deploy.decide import ledger, stats
from onjob.deploy.decide.pairs import rule_of
from onjob.deploy.settings import LoopSettings

DEMO = LoopSettings(min_pairs=6, max_pairs=48, delta=0.2, alpha=0.1, beta=0.1)
PRODUCTION = LoopSettings()


def first(s: LoopSettings) -> float:
    """The first candidate's share of alpha: the largest any candidate gets (but for what
    a promoted one passes on)."""
    return stats.spend(s.alpha, 1, ledger.planned_candidates(s))


@pytest.mark.parametrize("settings", [PRODUCTION, DEMO], ids=["production", "demo"])
@pytest.mark.parametrize("p_win", [0.3, 0.4, 0.45, 0.5])
def test_a_canary_no_better_than_live_is_promoted_at_most_alpha_of_the_time(settings, p_win):
    chance = stats.promotion_chance(rule_of(settings), first(settings), p_win)
    assert chance <= first(settings), f"promoted {chance:.3f} at true win rate {p_win}"


def test_ties_do_not_let_an_equal_canary_through():
    chance = stats.promotion_chance(rule_of(DEMO), first(DEMO), p_win=0.3, p_tie=0.4)
    assert chance <= first(DEMO)


def test_too_many_unjudged_pairs_hold_a_promotion():
    rule = rule_of(DEMO)
    assert rule.decide(rule.weigh([1.0] * 20), first(DEMO))[0] == "promote"
    # The same wins with a third of the pairs unjudged (each counted as a loss too).
    decision, why = rule.decide(rule.weigh([1.0] * 20, unjudged=10), first(DEMO))
    assert decision == "wait" and "unjudged" in why


def test_undecided_at_max_pairs_keeps_live():
    even = [1.0] * 20 + [0.0] + [-1.0] * 17 + [0.5] * 10  # 48 pairs, the test undecided
    decision, why = rule_of(DEMO).decide(rule_of(DEMO).weigh(even), first(DEMO))
    assert decision == "rollback" and "keep live" in why


def test_the_anytime_interval_covers_the_rate_at_every_sample_size():
    # Exact: for a Bernoulli(0.2) stream, the chance the interval ever excludes 0.2 within
    # 200 samples is below alpha (summed over n, a union bound that is itself exact here).
    from math import comb

    alpha, p = 0.05, 0.2
    miss = 0.0
    for n in range(1, 201):
        for k in range(n + 1):
            low, high = stats.anytime_interval(k, n, alpha)
            if not low <= p <= high:
                miss += comb(n, k) * p**k * (1 - p) ** (n - k)
    assert miss <= alpha


def test_a_guard_holds_on_a_point_estimate_and_trips_only_on_evidence():
    # 3 of 20 canary conversations failed against 0 of 20: over +5 points, not yet proven.
    assert stats.increase((3, 20), (0, 20), limit=0.05, alpha=0.05) == "hold"
    # 300 of 1000 against 0 of 1000: proven at every look.
    assert stats.increase((300, 1000), (0, 1000), limit=0.05, alpha=0.05) == "trip"
    assert stats.increase((1, 20), (1, 20), limit=0.05, alpha=0.05) is None
    assert stats.majority(12, 20, alpha=0.05) == "hold"
    assert stats.majority(950, 1000, alpha=0.05) == "trip"
    assert stats.majority(5, 20, alpha=0.05) is None


def test_a_round_with_no_pairs_yet_says_so_without_a_rate():
    s = LoopSettings()
    decision, why = rule_of(s).decide(rule_of(s).start(), first(s))
    assert decision == "wait" and "0 pairs: fewer than" in why and "nan" not in why
