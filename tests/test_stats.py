"""The release test as a statistician reads it: one e-process per candidate on graded paired
differences, valid at every look; each candidate's share of alpha from a stream whose
shares sum to alpha, its index k kept in DuckDB across restarts; unjudged pairs are the
candidate's losses. Simulations are seeded and sized to run in seconds."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from datetime import UTC, datetime, timedelta

import pytest

from onjob.collector import Store
from onjob.deploy.decide import ledger, pairs, stats
from onjob.deploy.decide.verdict import decide
from onjob.deploy.settings import DeploySettings, LoopSettings

PRODUCTION = LoopSettings()
PLANNED = ledger.planned_candidates(PRODUCTION)  # a year's training budget: 6 x 366


def graded(rng: random.Random, mean: float, sd: float = 0.25, ties: float = 0.2) -> float:
    """bench/release/decisions.py's model of a referee's graded scores: a tie (d = 0) with chance
    `ties`, else d = 2 Beta - 1 with the spread `sd`, centred so that E[d] = mean."""
    if rng.random() < ties:
        return 0.0
    m = (1 + mean / (1 - ties)) / 2
    c = m * (1 - m) / (sd * sd / 4) - 1
    return 2 * rng.betavariate(m * c, (1 - m) * c) - 1


def coin(rng: random.Random, mean: float) -> float:
    """+-1 pairs: the widest spread a mean can have in [-1, 1], the hardest case."""
    return 1.0 if rng.random() < (1 + mean) / 2 else -1.0


def run(rule: stats.Rule, alpha: float, draw, per_round: int = 8) -> tuple[str, int]:
    """One candidate's test looked at after every round, as the loop looks."""
    paired = rule.start()
    while True:
        for _ in range(per_round):
            paired.add(draw())
        decision, _ = rule.decide(paired, alpha)
        if decision != "wait":
            return decision, paired.pairs


@pytest.mark.parametrize("margin", [0.0, 0.05])
def test_a_candidate_at_the_boundary_is_promoted_at_most_alpha_of_the_time(margin):
    # E[d] = margin exactly, three shapes of scores, the test looked at after every pair
    # for up to 200 pairs: Ville's inequality says at most alpha, whatever the shape.
    rule = stats.Rule(margin=margin, delta=0.1, min_pairs=1, max_pairs=200)
    alpha, reps = 0.05, 600
    rng = random.Random(f"boundary-{margin}")
    shapes = {
        "coin": lambda: coin(rng, margin),
        "graded": lambda: graded(rng, margin),
        "three-point": lambda: rng.choice((-0.5, margin, 0.5 + 2 * margin)),
    }
    for name, draw in shapes.items():
        promoted = sum(run(rule, alpha, draw, per_round=1)[0] == "promote" for _ in range(reps))
        # Allow three standard errors of the simulation over alpha (0.027 at 600 runs).
        assert promoted / reps <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps), name


def test_a_coin_flip_candidate_is_promoted_at_most_its_share_at_every_look():
    # Looked at after every pair (4000 seeded tests), production's rule, the first
    # candidate's share, with and without ties.
    rule = pairs.rule_of(PRODUCTION)
    first = stats.spend(PRODUCTION.alpha, 1)
    for p_win in (0.3, 0.4, 0.5):
        assert stats.promotion_chance(rule, first, p_win) <= first
    demo = pairs.rule_of(LoopSettings(min_pairs=6, max_pairs=48, delta=0.2, alpha=0.1))
    assert stats.promotion_chance(demo, stats.spend(0.1, 1), 0.3, 0.4) <= stats.spend(0.1, 1)


def test_a_candidate_better_by_a_tenth_is_promoted_within_100_pairs():
    # Graded scores (sd 0.25, 20% ties), mean difference +0.1, production's rule at the
    # first candidate's share of alpha (0.030): promoted at least 80% of the time, the
    # median decision within 100 pairs.
    rule = pairs.rule_of(PRODUCTION)
    alpha = stats.spend(PRODUCTION.alpha, 1)
    rng = random.Random("power")
    results = [run(rule, alpha, lambda: graded(rng, 0.1)) for _ in range(300)]
    promoted = sum(d == "promote" for d, _ in results) / len(results)
    median = statistics.median(n for _, n in results)
    assert promoted >= 0.8 and median <= 100, (promoted, median)


def test_the_shares_of_alpha_sum_to_at_most_alpha():
    alpha = 0.05
    for planned in (None, PLANNED, 10):
        shares = [stats.spend(alpha, k, planned) for k in range(1, 200_001)]
        assert sum(shares) <= alpha
        assert sum(shares) > alpha * 0.99999  # and spend nearly all of it
        assert all(a > b for a, b in itertools.pairwise(shares))
    assert stats.spend(alpha, 1) == pytest.approx(6 * alpha / math.pi**2)
    # With a plan, a late candidate keeps a level that does not vanish: the 500th of a
    # year's budget at production's 6 a day, against 1 / k^2 alone.
    assert stats.spend(alpha, 500, PLANNED) > 90 * stats.spend(alpha, 500)
    assert stats.spend(alpha, 500, PLANNED) >= alpha / (2 * PLANNED)
    with pytest.raises(ValueError):
        stats.spend(alpha, 0)


def test_alpha_comes_back_with_each_promotion_and_each_period(tmp_path):
    # The online fallback: a promoted candidate's level passes on to the next one, and a
    # period (a year by default) starts with all of alpha again.
    t0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    store = Store(tmp_path / "onjob.duckdb")
    try:
        for i, outcome in enumerate(["promoted", "promoted", "rolled_back", None], 1):
            ledger.enter(store, "agent", f"c{i}", t0 + timedelta(days=i))
            if outcome:
                ledger.settle(store, "agent", f"c{i}", outcome, t0 + timedelta(days=i, hours=1))
        levels = [ledger.level(store, "agent", f"c{i}", PRODUCTION) for i in range(1, 5)]
        share = [stats.spend(0.05, j, PLANNED) for j in range(1, 5)]
        assert levels[0].alpha == share[0] and levels[0].carried == 0
        assert levels[1].alpha == pytest.approx(share[1] + share[0])  # c1 was promoted
        assert levels[2].alpha == pytest.approx(share[2] + share[1] + share[0])  # and c2
        assert levels[3].alpha == share[3] and levels[3].carried == 0  # c3 was not
        # A year after the lineage's first candidate, the next starts a period at rank 1.
        later = t0 + timedelta(days=366)
        ledger.enter(store, "agent", "c5", later)
        fresh = ledger.level(store, "agent", "c5", PRODUCTION)
        assert (fresh.k, fresh.rank, fresh.period, fresh.alpha) == (5, 1, 1, share[0])
        # Before it is entered, a candidate's level is where it would enter now.
        assert ledger.level(store, "agent", "c6", PRODUCTION, now=later).rank == 2
        shorter = LoopSettings(alpha_period_days=1)
        assert ledger.level(store, "agent", "c4", shorter).rank == 1  # its own day
    finally:
        store.close()


def test_the_bet_follows_the_pairs_so_a_steady_candidate_is_promoted_sooner():
    # Graded scores, +0.1, the first candidate's level, the same seeded pairs as the power
    # test: with half the wealth betting by the pairs' own mean and variance, the median
    # decision comes at 64 pairs (72 with the fixed bets alone), and the boundary tests
    # above still hold it to alpha.
    rule = pairs.rule_of(PRODUCTION)
    alpha = stats.spend(PRODUCTION.alpha, 1)
    rng = random.Random("power")
    results = [run(rule, alpha, lambda: graded(rng, 0.1)) for _ in range(300)]
    assert statistics.median(n for _, n in results) <= 66
    # The plug-in bet: none before an edge shows, then sized by it, never past its cap.
    wealth = stats.Wealth(1.0)
    assert wealth.plug_in_bet() == 0.0
    for _ in range(30):
        wealth.add(0.1)
    assert wealth.plug_in_bet() == pytest.approx(stats.PLUG_IN_CAP)
    noisy = stats.Wealth(1.0)
    for x in [0.6, -0.4] * 15:
        noisy.add(x)
    assert 0 < noisy.plug_in_bet() < 0.5  # mean 0.1, variance 0.25: about 0.38


def test_a_pair_being_judged_again_holds_the_pairs_after_it():
    # The test reads its pairs in the order they were made and stops at a pair the judge
    # may still score: the wins after it wait (they are not read around it), and once its
    # attempts are spent it is a loss and the rest are read.
    store = Store(":memory:")
    try:
        tests = pairs.test_ids("agent", "ckpt-wait", None)
        _judged_pairs(store, "ckpt-wait", [0.5, None, *[0.5] * 8], tries=1, test=tests[0])
        weighed = pairs.weigh(store, "agent", "ckpt-wait", tests, PRODUCTION)
        paired = weighed.paired
        assert (paired.pairs, paired.pending, paired.unjudged) == (1, 9, 0)
        assert [m.counted for m in weighed.missing] == ["pending"]
        assert "9 more waiting" in weighed.decide()[1]
        store.dicts("UPDATE groups SET attempts = ? WHERE status = 'failed'",
                    [PRODUCTION.rejudge_attempts])  # fmt: skip
        weighed = pairs.weigh(store, "agent", "ckpt-wait", tests, PRODUCTION)
        paired = weighed.paired
        assert (paired.pairs, paired.pending, paired.unjudged) == (10, 0, 1)
        assert paired.mean == pytest.approx((9 * 0.5 - 1) / 10)
        assert "1 unjudged, counted as losses" in weighed.decide()[1]
    finally:
        store.close()


def test_unjudged_pairs_count_as_the_candidates_losses():
    rule = pairs.rule_of(PRODUCTION)
    won = [0.4] * 30
    assert rule.decide(rule.weigh(won), stats.spend(0.05, 1))[0] == "promote"
    # The same wins with as many unjudged pairs: not promoted, and the unjudged counted.
    paired = rule.weigh(won, unjudged=30)
    decision, why = rule.decide(paired, stats.spend(0.05, 1))
    assert decision != "promote" and paired.pairs == 60 and "30 unjudged" in why
    assert paired.mean == pytest.approx((30 * 0.4 - 30) / 60)


def test_the_ledger_keeps_each_candidates_index_across_restarts(tmp_path):
    db = tmp_path / "onjob.duckdb"
    s = LoopSettings(backoff_s=600, max_candidates_per_day=3)
    t0 = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
    store = Store(db)
    try:
        assert [ledger.enter(store, "agent", f"c{i}", t0) for i in (1, 2)] == [1, 2]
        assert ledger.enter(store, "agent", "c1", t0) == 1  # the same candidate, the same k
        assert ledger.enter(store, "other", "c9", t0) == 1  # each alias its own stream
        ledger.settle(store, "agent", "c1", "rolled_back", t0)
        ledger.settle(store, "agent", "c2", "stopped", t0 + timedelta(minutes=1))
    finally:
        store.close()
    store = Store(db)  # a restart: the count goes on, alpha is never handed out twice
    try:
        assert ledger.level(store, "agent", "c2", PRODUCTION) == ledger.Level(
            2, stats.spend(0.05, 2, PLANNED), rank=2
        )
        assert ledger.level(store, "agent", "new", PRODUCTION).k == 3  # read only: not entered
        # Two failures in a row: the next run waits 2 x 600 s after the last one.
        soon = t0 + timedelta(minutes=5)
        assert "back-off: 2 candidate(s)" in ledger.waits(store, "agent", s, soon)
        later = t0 + timedelta(minutes=22)
        assert ledger.waits(store, "agent", s, later) is None
        assert ledger.enter(store, "agent", "c3", later) == 3
        assert "training budget: 3 candidates today" in ledger.waits(
            store, "agent", s, later + timedelta(hours=1)
        )
        tomorrow = datetime(2026, 11, 26, 0, 1, tzinfo=UTC)
        assert ledger.waits(store, "agent", s, tomorrow) is None
        ledger.settle(store, "agent", "c3", "promoted", later)
        assert ledger.backoff_s(s, 0) == 0 and ledger.backoff_s(s, 30) == ledger.MAX_BACKOFF_S
    finally:
        store.close()


def test_each_lineage_spends_alpha_by_the_stated_split(tmp_path):
    t0 = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
    store = Store(tmp_path / "onjob.duckdb")
    try:
        ledger.enter(store, "agent@acme", "a1", t0)
        ledger.enter(store, "agent", "s1", t0 + timedelta(minutes=1))
        ledger.enter(store, "agent@acme", "a2", t0 + timedelta(minutes=2))
        # Per tenant: each lineage's stream is controlled at alpha on its own.
        first = stats.spend(0.05, 1, PLANNED)
        assert ledger.level(store, "agent", "s1", PRODUCTION) == ledger.Level(1, first)
        assert ledger.level(store, "agent@acme", "a2", PRODUCTION).alpha == stats.spend(
            0.05, 2, PLANNED
        )
        # Server-wide: lineage j (by its first test) has 6 alpha / (pi^2 j^2) of alpha; a
        # lineage not tested yet comes next. Every share together stays within alpha.
        first = stats.spend(0.05, 1)
        assert ledger.lineage_alpha(store, "agent@acme", 0.05, "server") == first
        assert ledger.lineage_alpha(store, "agent", 0.05, "server") == stats.spend(0.05, 2)
        assert ledger.lineage_alpha(store, "agent@beta", 0.05, "server") == stats.spend(0.05, 3)
        server = LoopSettings(alpha_split="server")
        assert ledger.level(store, "agent", "s1", server).alpha == stats.spend(
            stats.spend(0.05, 2), 1, PLANNED
        )
        total = sum(
            stats.spend(stats.spend(0.05, j), k, PLANNED)
            for j in range(1, 400)
            for k in range(1, PLANNED + 400)
        )
        assert total <= 0.05
    finally:
        store.close()


def _judged_pairs(
    store,
    candidate: str,
    differences: list[float | None],
    tries: int = PRODUCTION.rejudge_attempts,
    test: str | None = None,
) -> None:
    """Pairs of `candidate` against live (base) as the judge leaves them, in this order:
    scored groups (live's score, the candidate's), or failed ones (None: the judge could
    not score it in `tries` attempts; by default every attempt it gets). `test`: whose
    pairs (default: the held-out slice's)."""
    test = test or pairs.holdout_test_id(candidate, None)
    for i, d in enumerate(differences):
        group = f"g-{candidate}-{i:03d}"  # ids sort as the pairs were made
        if d is None:
            store.dicts(
                "INSERT INTO groups (id, scenario_id, kind, status, reason, created, test, "
                "attempts) VALUES (?, 'scn-held', 'ab', 'failed', 'reward function raised', "
                "now(), ?, ?)",
                [group, test, tries],
            )
            continue
        store.dicts(
            "INSERT INTO groups (id, scenario_id, kind, status, created, test) "
            "VALUES (?, 'scn-held', 'ab', 'scored', now(), ?)",
            [group, test],
        )
        live, cand = (0.0, d) if d >= 0 else (-d, 0.0)
        for position, (arm, score) in enumerate((("a", live), ("b", cand))):
            member = f"{group}-{arm}"
            store.dicts(
                "INSERT INTO members (id, group_id, position, exchange_id, choice, origin) "
                "VALUES (?, ?, ?, ?, 0, ?)",
                [member, group, position, f"x-{member}", arm],
            )
            store.dicts(
                "INSERT INTO scores (id, group_id, member_id, source, score) "
                "VALUES (?, ?, ?, 'combined', ?)",
                [f"s-{member}", group, member, score],
            )


@pytest.mark.parametrize(
    "name, pairs",
    [
        # It wins a third of the pairs (a count of wins would call that close), by a
        # hair, and loses the rest outright: the mean difference is -0.65.
        ("hair", [0.05] * 4 + [-1.0] * 8),
        # Four small wins and eight pairs the judge could not score in any of its
        # attempts (dropped, it would pass on 4 wins, 0 losses); each is its loss.
        ("unjudged", [0.2] * 4 + [None] * 8),
    ],
)
def test_a_candidate_worse_on_the_held_out_slice_is_stopped(tmp_path, name, pairs):
    store = Store(tmp_path / "onjob.duckdb")
    try:
        _judged_pairs(store, f"ckpt-{name}", pairs)
        checked = decide(store, DeploySettings(loop=PRODUCTION), f"ckpt-{name}", None)
        assert checked.decision == "rollback", checked.reason
        assert "worse than live on the held-out slice" in checked.reason, checked.reason
        held = checked.evidence.held_out
        assert held.worse and held.worse_e_value >= 1 / PRODUCTION.beta
        # The slice is its own test: none of its pairs are the release test's.
        assert checked.evidence.e_process.pairs == 0
        # A candidate that wins the same slice goes on.
        _judged_pairs(store, "ckpt-good", [0.3] * 12)
        good = decide(store, DeploySettings(loop=PRODUCTION), "ckpt-good", None)
        assert good.decision == "wait", good.reason  # on: more pairs, or the canary
        assert good.evidence.held_out.wins == 12 and not good.evidence.held_out.worse
    finally:
        store.close()


def test_the_held_out_slice_neither_promotes_nor_stops_a_candidate_no_worse_there(tmp_path):
    # Never trained on, the slice's scenarios are where a candidate is expected to do as
    # well as live, not better: even, it is not stopped (as the futility test would stop
    # it, not better by delta), and many wins there pass nothing (the release test reads
    # the traffic it would serve).
    store = Store(tmp_path / "onjob.duckdb")
    try:
        _judged_pairs(store, "ckpt-even", [0.2, -0.2] * 20)
        even = decide(store, DeploySettings(loop=PRODUCTION), "ckpt-even", None)
        assert even.decision == "wait", even.reason
        _judged_pairs(store, "ckpt-wins", [0.5] * 40)
        wins = decide(store, DeploySettings(loop=PRODUCTION), "ckpt-wins", None)
        assert wins.decision == "wait" and "no pairs yet" in wins.reason, wins.reason
    finally:
        store.close()
