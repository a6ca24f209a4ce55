"""How often the release rule is wrong over a year of candidates, how many good ones it
promotes, and whether a good candidate still gets through late in the year: the loop
simulated with the project's own objects (`pairs.rule_of`: the e-process `stats.Rule`;
`ledger.enter`, `ledger.settle` and `ledger.level` on a real DuckDB ledger: each
candidate's level, the period's plan, what a promotion passes on; `ledger.backoff_s` and
`loop.max_candidates_per_day`: the back-off and the training budget), under production's
settings and the demo's.

The model of scores (`--scores`):

- `graded` (the default): a referee's graded scores (RULER, a reward in [0, 1]). Each
  pair's difference d = canary - live is a tie (d = 0, both scored alike) with chance
  `TIES`, else 2 Beta - 1 with standard deviation `SD`, centred so that E[d] is the
  candidate's true difference;
- `sign`: +-1 pairs (a 0/1 score such as exact success), the same ties; a candidate
  "+0.1" wins 60% of its decided pairs (ten points of win rate: E[d] = 0.2 x (1 - ties)).

The judge: each attempt to score a pair fails with chance `--judge-failures` (2%), at
random (a provider's 429, a timeout); the loop judges a failed pair again, up to
`loop.rejudge_attempts` attempts in all, and one failed every time counts as the
candidate's loss. `--stuck` (0 by default) adds a share of pairs the judge can never score.

A year: the loop trains a candidate (`TRAIN_S`), tests it on `holdout_pairs` held-out
pairs (their own test: stopped when shown worse than live), then on rounds of
`pairs_per_round` pairs of the release test until the rule decides, at the engine's
measured speed (`PAIRS_PER_S`); then the next one as the budget and the back-off allow.
Candidates are drawn from `MIX`: no better (E[d] = 0), worse (-0.1) and better (+0.1,
+0.2); a promoted one becomes live, so the next are drawn against it the same way. Each
stream runs `--years` years, so the second year starts a new period of alpha. Pairs
here are independent draws of the candidate's mean over the traffic: what
`prompts.fresh` makes of real strata is bench/drift.py's. Not simulated: the guards
(errors, latency, shape, KL, agreement: they only stop more) and the canary's caps (a
test open at the end of its offline rounds goes on on the canary's prompts).

Reported per settings: P(any bad promotion in a year, and in a month) (bad: E[d] <= 0),
good promotions per month and in each month of a year, candidates per year, per kind of
candidate the share promoted, the pairs to a decision and its time at the engine's
speed; then a +0.1 candidate at the levels of the 1st, 500th and 2000th candidate of a
period (promoted share, median pairs), with and without judge failures; and the
hedging candidate of issue 33 judged by a referee that pays for exact answers, and by
its coach (half credit for a hedge).

Targets: P(any bad promotion in a year) <= alpha; a +0.1 candidate promoted >= 80%
whether it is the 1st or the 500th of its period; the hedger never promoted by the
referee.

    python bench/decisions.py [--streams 20] [--years 2] [--scores graded|sign] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import results_file

from examples.arithmetic.demo import Options, loop_settings
from onjob.collector import Store
from onjob.deploy.decide import ledger, pairs, stats
from onjob.deploy.decide.pairs import rule_of
from onjob.deploy.settings import LoopSettings

TIES = 0.2  # pairs the referee scores alike
SD = 0.25  # spread of a graded difference that is not a tie
MIX = {  # kind: (share of candidates, true E[d] on judged pairs)
    "no better": (0.45, 0.0),
    "worse": (0.25, -0.1),
    "better": (0.2, 0.1),
    "much better": (0.1, 0.2),
}
DAY = 86400.0
YEAR = 365 * DAY
MONTH = YEAR / 12
START = datetime(2026, 1, 1, tzinfo=UTC)
# A training run's wall time (stated), and pairs per second at the engine's speed (2
# answers and a judgement each), as measured on this 2-core machine with vLLM's CPU build
# and the bundled model judging (docs/benchmarks.md, "Learning": 44 pairs in 451 s).
TRAIN_S = {"production": 600.0, "demo": 300.0}
PAIRS_PER_S = 0.1


@dataclass
class Decided:
    kind: str
    mean: float
    at: float  # seconds into the stream when its test started
    decision: str  # promote | rollback | stopped
    pairs: int
    rounds: int

    @property
    def year(self) -> int:
        return int(self.at // YEAR)

    @property
    def month(self) -> int:
        return int(self.at // MONTH)

    @property
    def wall_s(self) -> float:
        """Its test's time at the engine's speed (pairs, each sampled and judged)."""
        return self.pairs / PAIRS_PER_S


@dataclass(frozen=True)
class Judge:
    """How the referee fails: each attempt at random, and a share of pairs for ever."""

    failures: float
    stuck: float
    attempts: int

    def unjudged(self, rng: random.Random) -> bool:
        """Whether a pair stays unjudged after every attempt (the loop judging it again)."""
        if rng.random() < self.stuck:
            return True
        return all(rng.random() < self.failures for _ in range(self.attempts))


def draw(rng: random.Random, mean: float, scores: str, judge: Judge) -> float:
    """One pair's difference for a candidate `mean` better than live: its true E[d] on
    judged pairs (graded), or its win rate on decided pairs less 0.5 (sign)."""
    if judge.unjudged(rng):
        return float("nan")  # unjudged after every attempt: the rule counts it as -1
    if rng.random() < TIES:
        return 0.0
    if scores == "sign":  # `mean`: points of win rate over 0.5 on the decided pairs
        return 1.0 if rng.random() < 0.5 + mean else -1.0
    m = mean / (1 - TIES)  # the mean of the pairs that are not ties
    mid = (1 + m) / 2
    c = mid * (1 - mid) / (SD * SD / 4) - 1
    return 2 * rng.betavariate(mid * c, (1 - mid) * c) - 1


def test_one(
    rule: stats.Rule, s: LoopSettings, alpha: float, sample, at: float, kind: str, mean: float
) -> Decided:
    """One candidate through the loop's tests: the held-out slice's own (`pairs.held_out`:
    stopped when shown worse than live there; its pairs drawn like the others, the
    candidate as good on the slice as elsewhere), then rounds of the release test until
    the rule decides."""

    def add(paired: stats.Paired, n: int) -> None:
        for _ in range(n):
            d = sample()
            if d != d:  # nan: unjudged
                paired.add_unjudged()
            else:
                paired.add(d)

    held = stats.Paired(margin=-s.delta, delta=s.delta)
    add(held, s.holdout_pairs)
    if pairs.HeldOut(held, s.beta).worse:
        return Decided(kind, mean, at, "stopped", held.pairs, 0)
    paired, rounds = rule.start(), 0
    while True:
        add(paired, s.pairs_per_round)
        rounds += 1
        decision = rule.decision(paired, alpha)
        if decision != "wait":
            return Decided(kind, mean, at, decision, held.pairs + paired.pairs, rounds)


def stream(
    name: str, s: LoopSettings, scores: str, judge: Judge, years: int, rng: random.Random
) -> tuple[list[Decided], list[int]]:
    """Every candidate of one simulated stream of `years` years, in order, each tested at
    the level the ledger gives it; and the ranks the levels were at."""
    rule = rule_of(s)
    store = Store(":memory:")
    t, failures, out, ranks = 0.0, 0, [], []
    today, today_count = 0, 0
    kinds = list(MIX)
    weights = [MIX[c][0] for c in kinds]
    try:
        while True:
            t += ledger.backoff_s(s, failures)
            if s.max_candidates_per_day is not None:
                if int(t // DAY) != today:
                    today, today_count = int(t // DAY), 0
                if today_count >= s.max_candidates_per_day:
                    t = (today + 1) * DAY
                    today, today_count = today + 1, 0
            t += TRAIN_S[name]
            if t >= years * YEAR:
                return out, ranks
            today_count += 1
            name_k = f"c{len(out) + 1}"
            at = START + timedelta(seconds=t)
            ledger.enter(store, "agent", name_k, at)
            level = ledger.level(store, "agent", name_k, s)
            ranks.append(level.rank)
            kind = rng.choices(kinds, weights)[0]
            mean = MIX[kind][1]
            sample = lambda m=mean: draw(rng, m, scores, judge)  # noqa: E731
            d = test_one(rule, s, level.alpha, sample, t, kind, mean)
            out.append(d)
            t += d.pairs / PAIRS_PER_S  # offline rounds run back to back
            outcome = {"promote": "promoted", "rollback": "rolled_back"}.get(d.decision, "stopped")
            ledger.settle(store, "agent", name_k, outcome, START + timedelta(seconds=t))
            failures = 0 if d.decision == "promote" else failures + 1
    finally:
        store.close()


def measure(
    name: str, s: LoopSettings, scores: str, judge: Judge, streams: int, years: int, seed: int
) -> dict:
    rng = random.Random(f"{seed}-{name}-{scores}")
    runs = [stream(name, s, scores, judge, years, rng) for _ in range(streams)]
    by_year = [[d for d in r if d.year == y] for r, _ in runs for y in range(years)]
    months = [[d for d in r if d.month == m] for r, _ in runs for m in range(12 * years)]
    bad = sum(any(d.decision == "promote" and d.mean <= 0 for d in y) for y in by_year)
    bad_months = sum(any(d.decision == "promote" and d.mean <= 0 for d in m) for m in months)
    good = [sum(d.decision == "promote" and d.mean > 0 for d in y) for y in by_year]
    # Good promotions in each month of a year, over every stream and year: does it learn
    # in month 12 as in month 1?
    month_of_year = [
        statistics.mean(
            sum(d.decision == "promote" and d.mean > 0 for d in months[i])
            for i in range(len(months))
            if i % 12 == m
        )
        for m in range(12)
    ]
    per_kind = {}
    for kind in MIX:
        ds = [d for y in by_year for d in y if d.kind == kind]
        if not ds:
            continue
        pairs = [d.pairs for d in ds]
        per_kind[kind] = {
            "candidates": len(ds),
            "promoted": round(sum(d.decision == "promote" for d in ds) / len(ds), 4),
            "stopped_on_held_out": round(sum(d.decision == "stopped" for d in ds) / len(ds), 4),
            "median_pairs": statistics.median(pairs),
            "median_wall_s_at_engine_speed": statistics.median(d.wall_s for d in ds),
            "p90_wall_s_at_engine_speed": statistics.quantiles([d.wall_s for d in ds], n=10)[-1],
        }
    later = [d for y in by_year for d in y[len(y) // 2 :] if d.kind == "better"]
    return {
        "settings": {
            k: getattr(s, k)
            for k in (
                "margin",
                "delta",
                "alpha",
                "alpha_period_days",
                "beta",
                "min_pairs",
                "max_pairs",
                "pairs_per_round",
                "holdout_pairs",
                "interval_s",
                "backoff_s",
                "max_candidates_per_day",
                "rejudge_attempts",
            )
        },
        "train_s": TRAIN_S[name],
        "pairs_per_s": PAIRS_PER_S,
        "years": len(by_year),
        "any_bad_promotion_in_a_year": bad / len(by_year),
        "any_bad_promotion_in_a_month": bad_months / len(months),
        "target_met": bad / len(by_year) <= s.alpha,
        "good_promotions_per_month": round(statistics.mean(good) / 12, 3),
        "good_promotions_by_month_of_year": [round(x, 2) for x in month_of_year],
        "candidates_per_year": round(statistics.mean(len(y) for y in by_year), 1),
        "highest_rank": max(max(ranks) for _, ranks in runs),
        "by_kind": per_kind,
        "better_0.1_promoted_in_second_half_of_year": (
            round(sum(d.decision == "promote" for d in later) / len(later), 4) if later else None
        ),
        "by_rank": [
            by_rank(s, scores, j, rank, rng)
            for rank in (1, 500, 2000)
            for j in sorted({Judge(0.0, 0.0, s.rejudge_attempts), judge}, key=str)
        ],
    }


def by_rank(s: LoopSettings, scores: str, judge: Judge, rank: int, rng: random.Random) -> dict:
    """A +0.1 candidate tested at the level of the `rank`-th candidate of a period (none
    passed on), and the hedger of issue 33 at the same level."""
    rule, reps = rule_of(s), 400
    alpha = stats.spend(s.alpha, rank, ledger.planned_candidates(s))
    better = [
        test_one(rule, s, alpha, lambda: draw(rng, 0.1, scores, judge), 0, "better", 0.1)
        for _ in range(reps)
    ]

    def hedger(coach: bool) -> float:
        # Live is right 30% of the time; the hedger always names the right answer among
        # others. The referee (exact): hedger 0, live 1 or 0. The coach: hedger 0.5.
        def pair() -> float:
            live = 1.0 if rng.random() < 0.3 else 0.0
            return (0.5 if coach else 0.0) - live

        runs = [test_one(rule, s, alpha, pair, 0, "hedger", -0.3) for _ in range(reps)]
        return sum(d.decision == "promote" for d in runs) / reps

    return {
        "rank": rank,
        "judge_failures": judge.failures,
        "alpha": alpha,
        "better_0.1_promoted": sum(d.decision == "promote" for d in better) / reps,
        "better_0.1_median_pairs": statistics.median(d.pairs for d in better),
        "hedger_promoted_judged_by_referee": hedger(coach=False) if rank == 1 else None,
        "hedger_promoted_judged_by_coach": hedger(coach=True) if rank == 1 else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=20, help="simulated streams per settings")
    ap.add_argument("--years", type=int, default=2, help="years per stream")
    ap.add_argument("--scores", choices=("graded", "sign"), default="graded")
    ap.add_argument(
        "--judge-failures", type=float, default=0.02,
        help="chance that one attempt to judge a pair fails (judged again, up to "
        "loop.rejudge_attempts)",
    )  # fmt: skip
    ap.add_argument(
        "--stuck", type=float, default=0.0, help="share of pairs the judge never scores"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    settings = {"production": LoopSettings(), "demo": loop_settings(Options())}
    out = {}
    for name, s in settings.items():
        started = time.monotonic()
        judge = Judge(args.judge_failures, args.stuck, s.rejudge_attempts)
        r = out[name] = measure(name, s, args.scores, judge, args.streams, args.years, args.seed)
        met = "met" if r["target_met"] else "MISSED"
        print(
            f"== {name} ({args.scores} scores; alpha {s.alpha} a period of "
            f"{s.alpha_period_days:g} days, delta {s.delta}; {r['years']} simulated years, "
            f"{time.monotonic() - started:.0f} s)\n"
            f"P(any bad promotion in a year) {r['any_bad_promotion_in_a_year']:.3f} "
            f"(target <= {s.alpha}: {met}); good promotions per month "
            f"{r['good_promotions_per_month']:.2f}; {r['candidates_per_year']:.0f} "
            f"candidates per year (the highest rank in a period: {r['highest_rank']})\n"
            f"P(any bad promotion in a month) {r['any_bad_promotion_in_a_month']:.4f}; good "
            f"promotions in months 1..12 of a year: {r['good_promotions_by_month_of_year']}"
        )
        print(f"{'kind':>12} {'n':>6} {'promoted':>8} {'stopped':>8} {'pairs':>6} "
              f"{'time to decide, median / p90':>30}")  # fmt: skip
        for kind, row in r["by_kind"].items():
            print(
                f"{kind:>12} {row['candidates']:>6} {row['promoted']:>8.3f} "
                f"{row['stopped_on_held_out']:>8.3f} {row['median_pairs']:>6} "
                f"{row['median_wall_s_at_engine_speed'] / 60:>18.1f} / "
                f"{row['p90_wall_s_at_engine_speed'] / 60:.1f} min"
            )
        print(
            "a +0.1 candidate in the second half of a year's candidates: promoted "
            f"{r['better_0.1_promoted_in_second_half_of_year']}"
        )
        for f in r["by_rank"]:
            hedger = (
                f"; hedger promoted {f['hedger_promoted_judged_by_referee']:.3f} judged by "
                f"the referee, {f['hedger_promoted_judged_by_coach']:.3f} by its coach"
                if f["hedger_promoted_judged_by_referee"] is not None
                else ""
            )
            print(
                f"candidate {f['rank']} of a period (alpha {f['alpha']:.2e}, each judging "
                f"attempt failing {f['judge_failures']:.0%}): +0.1 promoted "
                f"{f['better_0.1_promoted']:.3f}, median {f['better_0.1_median_pairs']} "
                f"pairs{hedger}"
            )
    results_file.save(
        "decisions",
        {
            "scores": args.scores, "ties": TIES, "sd": SD,
            "judge_failures": args.judge_failures, "stuck": args.stuck,
            "mix": MIX, "seed": args.seed, **out,
        },
    )  # fmt: skip


if __name__ == "__main__":
    main()
