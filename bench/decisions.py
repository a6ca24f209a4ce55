"""How often the release rule is wrong over a month of candidates, how many good ones it
promotes, and how long it takes: the loop simulated with the project's own rule objects
(`pairs.rule_of`: the e-process `stats.Rule`; `stats.spend`: candidate k's share of
alpha; `ledger.backoff_s` and `loop.max_candidates_per_day`: the back-off and the
training budget), under production's settings and the demo's.

The model of scores (`--scores`):

- `graded` (the default): a referee's graded scores (RULER, a reward in [0, 1]). Each
  pair's difference d = canary - live is a tie (d = 0, both scored alike) with chance
  `TIES`, else 2 Beta - 1 with standard deviation `SD`, centred so that E[d] is the
  candidate's true difference;
- `sign`: +-1 pairs (a 0/1 score such as exact success), the same ties; a candidate
  "+0.1" wins 60% of its decided pairs (ten points of win rate: E[d] = 0.2 x (1 - ties)).

On top, a share `--unjudged` (2%) of pairs the judge could not score: d = -1, the candidate's
loss (the rule counts them so; their true mean is what a candidate is judged by).

A month: the loop trains a candidate (`TRAIN_S`), tests it on `holdout_pairs` held-out
pairs, then on canary rounds of `pairs_per_round` pairs, one round per `interval_s` (the
loop's cadence before the offline test, which now samples at the engine's speed: the
`--pairs-per-s` column), until the rule decides; then the next one as the budget and the
back-off allow. Candidates are drawn from `MIX`: no better (E[d] = 0), worse (-0.1) and
better (+0.1); a promoted one becomes live, so the next are drawn against it the same way.
The guards (errors, latency, shape, KL, agreement) are not simulated: they only stop more.

Reported per settings: P(any bad promotion in the month) (bad: E[d] <= 0), good promotions
per week, candidates per month, and per kind of candidate the pairs to a decision and the
wall time: at the loop's old cadence, and at the engine's speed (`--pairs-per-s`: what
sampling pairs as fast as the engine answers would give). Then one +0.1 candidate at the
first look (k = 1): promoted share and median pairs; and the hedging candidate of issue
33 (the right answer among others: live right 30% of the time) judged by a referee that
pays for exact answers, and by its coach (half credit for a hedge).

Targets: P(any bad promotion) <= alpha over the month; a +0.1 candidate promoted >= 80%
with a median <= 100 pairs; the hedger never promoted by the referee.

    python bench/decisions.py [--months 200] [--scores graded|sign] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import results_file

from examples.arithmetic.demo import Options, loop_settings
from onjob.deploy import ledger, stats
from onjob.deploy.pairs import rule_of
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
MONTH = 30 * DAY
# Stated, not measured here: a training run's wall time, and pairs per second when pairs
# are sampled at the engine's speed (2 answers and a judgement each).
TRAIN_S = {"production": 600.0, "demo": 300.0}
PAIRS_PER_S = {"production": 2.0, "demo": 0.5}


@dataclass
class Decided:
    kind: str
    mean: float
    k: int
    decision: str  # promote | rollback | stopped
    pairs: int
    rounds: int


def draw(rng: random.Random, mean: float, scores: str, unjudged: float) -> float:
    """One pair's difference for a candidate `mean` better than live: its true E[d] on
    judged pairs (graded), or its win rate on decided pairs less 0.5 (sign)."""
    if rng.random() < unjudged:
        return float("nan")  # unjudged: the rule counts it as -1
    if rng.random() < TIES:
        return 0.0
    if scores == "sign":  # `mean`: points of win rate over 0.5 on the decided pairs
        return 1.0 if rng.random() < 0.5 + mean else -1.0
    m = mean / (1 - TIES)  # the mean of the pairs that are not ties
    mid = (1 + m) / 2
    c = mid * (1 - mid) / (SD * SD / 4) - 1
    return 2 * rng.betavariate(mid * c, (1 - mid) * c) - 1


def test_one(
    rule: stats.Rule, s: LoopSettings, alpha: float, sample, k: int, kind: str, mean: float
) -> Decided:
    """One candidate through the loop's test: held-out pairs (the first look), then canary
    rounds until the rule decides."""
    paired = rule.start()

    def add(n: int) -> None:
        for _ in range(n):
            d = sample()
            if d != d:  # nan: unjudged
                paired.add_unjudged()
            else:
                paired.add(d)

    add(s.holdout_pairs)
    if rule.first_look(paired, alpha)[0] == "rollback":
        return Decided(kind, mean, k, "stopped", paired.pairs, 0)
    rounds = 0
    while True:
        add(s.pairs_per_round)
        rounds += 1
        decision, _ = rule.decide(paired, alpha)
        if decision != "wait":
            return Decided(kind, mean, k, decision, paired.pairs, rounds)


def month(
    name: str, s: LoopSettings, scores: str, unjudged: float, rng: random.Random, k: int = 0
) -> list[Decided]:
    """Every candidate of one simulated month, in order; `k` candidates came before."""
    rule = rule_of(s)
    t, failures, out = 0.0, 0, []
    today, today_count = 0, 0
    kinds = list(MIX)
    weights = [MIX[c][0] for c in kinds]
    while True:
        t += ledger.backoff_s(s, failures)
        if s.max_candidates_per_day is not None:
            if int(t // DAY) != today:
                today, today_count = int(t // DAY), 0
            if today_count >= s.max_candidates_per_day:
                t = (today + 1) * DAY
                today, today_count = today + 1, 0
        t += TRAIN_S[name]
        if t >= MONTH:
            return out
        k, today_count = k + 1, today_count + 1
        kind = rng.choices(kinds, weights)[0]
        mean = MIX[kind][1]
        d = test_one(
            rule,
            s,
            stats.spend(s.alpha, k),
            lambda m=mean: draw(rng, m, scores, unjudged),
            k,
            kind,
            mean,
        )
        out.append(d)
        t += d.rounds * s.interval_s + s.holdout_pairs / PAIRS_PER_S[name]
        failures = 0 if d.decision == "promote" else failures + 1


def measure(
    name: str, s: LoopSettings, scores: str, unjudged: float, months: int, seed: int
) -> dict:
    rng = random.Random(f"{seed}-{name}-{scores}")
    runs = [month(name, s, scores, unjudged, rng) for _ in range(months)]
    bad = sum(any(d.decision == "promote" and d.mean <= 0 for d in r) for r in runs) / months
    good = [sum(d.decision == "promote" and d.mean > 0 for d in r) for r in runs]
    per_kind = {}
    for kind in MIX:
        ds = [d for r in runs for d in r if d.kind == kind]
        if not ds:
            continue
        pairs = [d.pairs for d in ds]
        per_kind[kind] = {
            "candidates": len(ds),
            "promoted": round(sum(d.decision == "promote" for d in ds) / len(ds), 4),
            "stopped_on_held_out": round(sum(d.decision == "stopped" for d in ds) / len(ds), 4),
            "median_pairs": statistics.median(pairs),
            "median_wall_s_at_loop_cadence": statistics.median(d.rounds * s.interval_s for d in ds),
            "median_wall_s_at_engine_speed": statistics.median(pairs) / PAIRS_PER_S[name],
        }
    # Months later: the stream's k goes on (a sixth month starts after five months'
    # candidates), so each candidate's share of alpha is smaller.
    later_k = round(5 * statistics.mean(len(r) for r in runs))
    later = [month(name, s, scores, unjudged, rng, later_k) for _ in range(max(1, months // 4))]
    first = {u: first_candidate(s, scores, u, rng) for u in sorted({0.0, unjudged})}
    return {
        "settings": {
            k: getattr(s, k)
            for k in (
                "margin",
                "delta",
                "alpha",
                "beta",
                "min_pairs",
                "max_pairs",
                "pairs_per_round",
                "holdout_pairs",
                "interval_s",
                "backoff_s",
                "max_candidates_per_day",
            )
        },
        "train_s": TRAIN_S[name],
        "pairs_per_s": PAIRS_PER_S[name],
        "months": months,
        "any_bad_promotion_in_a_month": bad,
        "target_met": bad <= s.alpha,
        "good_promotions_per_week": round(statistics.mean(good) * 7 / 30, 3),
        "candidates_per_month": round(statistics.mean(len(r) for r in runs), 1),
        "by_kind": per_kind,
        "sixth_month": {
            "first_k": later_k + 1,
            "any_bad_promotion": sum(
                any(d.decision == "promote" and d.mean <= 0 for d in r) for r in later
            )
            / len(later),
            "good_promotions_per_week": round(
                statistics.mean(
                    sum(d.decision == "promote" and d.mean > 0 for d in r) for r in later
                )
                * 7
                / 30,
                3,
            ),
            "months": len(later),
        },
        "first_candidate": first,
    }


def first_candidate(s: LoopSettings, scores: str, unjudged: float, rng: random.Random) -> dict:
    """One candidate at k = 1: a +0.1 one (power), and the hedger of issue 33."""
    rule, reps = rule_of(s), 1000
    alpha = stats.spend(s.alpha, 1)
    better = [
        test_one(rule, s, alpha, lambda: draw(rng, 0.1, scores, unjudged), 1, "better", 0.1)
        for _ in range(reps)
    ]
    promoted = [d for d in better if d.decision == "promote"]

    def hedger(coach: bool) -> float:
        # Live is right 30% of the time; the hedger always names the right answer among
        # others. The referee (exact): hedger 0, live 1 or 0. The coach: hedger 0.5.
        def pair() -> float:
            live = 1.0 if rng.random() < 0.3 else 0.0
            return (0.5 if coach else 0.0) - live

        runs = [test_one(rule, s, alpha, pair, 1, "hedger", -0.3) for _ in range(reps)]
        return sum(d.decision == "promote" for d in runs) / reps

    return {
        "better_0.1_promoted": len(promoted) / reps,
        "better_0.1_median_pairs": statistics.median(d.pairs for d in better),
        "better_0.1_promoted_within_100_pairs": sum(d.pairs <= 100 for d in promoted) / reps,
        "hedger_promoted_judged_by_referee": hedger(coach=False),
        "hedger_promoted_judged_by_coach": hedger(coach=True),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--months", type=int, default=200, help="simulated months per settings")
    ap.add_argument("--scores", choices=("graded", "sign"), default="graded")
    ap.add_argument(
        "--unjudged", type=float, default=0.02, help="share of pairs the judge cannot score"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    settings = {"production": LoopSettings(), "demo": loop_settings(Options())}
    out = {}
    for name, s in settings.items():
        started = time.monotonic()
        r = out[name] = measure(name, s, args.scores, args.unjudged, args.months, args.seed)
        met = "met" if r["target_met"] else "MISSED"
        f = r["first_candidate"]
        print(
            f"== {name} ({args.scores} scores; alpha {s.alpha}, delta {s.delta}, "
            f"{args.months} months, {time.monotonic() - started:.0f} s)\n"
            f"P(any bad promotion in a month) {r['any_bad_promotion_in_a_month']:.3f} "
            f"(target <= {s.alpha}: {met}); good promotions per week "
            f"{r['good_promotions_per_week']:.2f}; {r['candidates_per_month']:.0f} "
            f"candidates per month"
        )
        print(f"{'kind':>10} {'n':>6} {'promoted':>8} {'stopped':>8} {'pairs':>6} "
              f"{'wall now':>9} {'at engine':>9}")  # fmt: skip
        for kind, row in r["by_kind"].items():
            print(
                f"{kind:>10} {row['candidates']:>6} {row['promoted']:>8.3f} "
                f"{row['stopped_on_held_out']:>8.3f} {row['median_pairs']:>6} "
                f"{row['median_wall_s_at_loop_cadence'] / 60:>7.1f} m "
                f"{row['median_wall_s_at_engine_speed']:>7.0f} s"
            )
        later = r["sixth_month"]
        print(
            f"a sixth month (candidates from k = {later['first_k']}): P(any bad promotion) "
            f"{later['any_bad_promotion']:.3f}, good promotions per week "
            f"{later['good_promotions_per_week']:.2f} ({later['months']} months)"
        )
        for u, f in r["first_candidate"].items():
            within = f["better_0.1_promoted_within_100_pairs"]
            referee, coach = (
                f["hedger_promoted_judged_by_referee"],
                f["hedger_promoted_judged_by_coach"],
            )
            print(
                f"first candidate (alpha {stats.spend(s.alpha, 1):.4f}, {u:.0%} unjudged): "
                f"+0.1 promoted {f['better_0.1_promoted']:.3f}, median "
                f"{f['better_0.1_median_pairs']} pairs ({within:.3f} promoted within 100); "
                f"hedger promoted {referee:.3f} judged by the referee, {coach:.3f} by its coach"
            )
    results_file.save(
        "decisions",
        {
            "scores": args.scores, "ties": TIES, "sd": SD, "unjudged": args.unjudged,
            "mix": MIX, "seed": args.seed, **out,
        },
    )  # fmt: skip


if __name__ == "__main__":
    main()
