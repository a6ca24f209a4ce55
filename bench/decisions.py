"""How often the canary's decision rule is wrong: paired A/B runs simulated with known true
win rates, decided by the real rule (`onjob.deploy.stats.Rule`, the settings' defaults and
the demo's), with pairs drawn two ways:

- `loop`: the way the loop draws them now: one turn per conversation, so pairs are
  independent even when conversations differ (each conversation has its own win rate
  around the true one);
- `clustered`: the way it drew them before: the newest turns, several from one
  conversation (1 + Poisson(2) turns each), so neighbouring pairs share a conversation's
  win rate. Not the loop's draw any more: it shows what clustering costs.

For each true win rate (wins / (wins + losses); ties on top), it reports the promotion
rate, the rollback rate, the median pairs to a decision, and the exact promotion rate
for independent pairs (`stats.promotion_chance`). The rule before this change (SPRT of
0.5 - delta against 0.5 + delta) runs beside it for comparison. Target: promotion rate
<= alpha at every true win rate <= 0.5.

    python bench/decisions.py [--runs 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import results_file

from examples.arithmetic.demo import Options, loop_settings
from onjob.deploy import stats
from onjob.deploy.canary import rule_of
from onjob.deploy.settings import LoopSettings

RATES = [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7]
TIES = 0.2  # the share of pairs judged equal
SPREAD = 4.0  # Beta concentration of conversations' own win rates around the true one


class OldRule:
    """The rule before this change, kept here only to measure it: SPRT of 0.5 - delta
    against 0.5 + delta with Wald's thresholds."""

    def __init__(self, s: LoopSettings) -> None:
        self.s = s
        self.upper = math.log((1 - s.beta) / s.alpha)
        self.lower = math.log(s.beta / (1 - s.alpha))

    def decide(self, t: stats.WinRate, unjudged: int = 0) -> tuple[str, str]:
        if t.pairs < self.s.min_pairs:
            return "wait", ""
        p1, p0 = 0.5 + self.s.sprt_delta, 0.5 - self.s.sprt_delta
        llr = t.wins * math.log(p1 / p0) + t.losses * math.log((1 - p1) / (1 - p0))
        if llr >= self.upper:
            return "promote", ""
        if llr <= self.lower:
            return "rollback", ""
        if t.pairs >= self.s.max_pairs:
            return "rollback", ""
        return "wait", ""


def outcome(rng: random.Random, p_win: float) -> float:
    if rng.random() < TIES:
        return 0.5
    return 1.0 if rng.random() < p_win else 0.0


def conversation_rate(rng: random.Random, p: float) -> float:
    return rng.betavariate(p * SPREAD, (1 - p) * SPREAD)


def one_run(rule, s: LoopSettings, p: float, draw: str, rng: random.Random) -> tuple[str, int]:
    wins = ties = losses = 0
    left, rate = 0, p  # turns left in the current conversation, and its win rate
    while True:
        for _ in range(s.pairs_per_round):
            if draw == "clustered":
                if left == 0:
                    left, rate = 1 + _poisson(rng, 2.0), conversation_rate(rng, p)
                left -= 1
            else:
                rate = conversation_rate(rng, p)
            o = outcome(rng, rate)
            wins, ties, losses = wins + (o == 1.0), ties + (o == 0.5), losses + (o == 0.0)
        n = wins + ties + losses
        decision, _ = rule.decide(stats.WinRate(n, wins, ties, losses))
        if decision != "wait":
            return decision, n


def _poisson(rng: random.Random, lam: float) -> int:
    k, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p < limit:
            return k
        k += 1


def measure(name: str, s: LoopSettings, runs: int, seed: int) -> dict:
    rules = {"now": rule_of(s), "before": OldRule(s)}
    rows = []
    for p in RATES:
        row = {"true_win_rate": p}
        exact = stats.promotion_chance(rules["now"], (1 - TIES) * p, TIES)
        row["exact_independent"] = round(exact, 4)
        for label, rule in rules.items():
            for draw in ("loop", "clustered"):
                rng = random.Random(f"{seed}-{name}-{label}-{draw}-{p}")
                results = [one_run(rule, s, p, draw, rng) for _ in range(runs)]
                promoted = sum(d == "promote" for d, _ in results) / runs
                row[f"{label}_{draw}"] = {
                    "promoted": round(promoted, 4),
                    "rolled_back": round(1 - promoted, 4),
                    "median_pairs": statistics.median(n for _, n in results),
                }
        rows.append(row)
    worst = max(r["now_loop"]["promoted"] for r in rows if r["true_win_rate"] <= 0.5)
    power = next(r for r in rows if abs(r["true_win_rate"] - 0.5 - s.sprt_delta) < 1e-9)
    return {
        "settings": {
            k: getattr(s, k)
            for k in ("sprt_delta", "alpha", "beta", "min_pairs", "max_pairs", "pairs_per_round")
        },
        "rates": rows,
        "worst_promotion_at_or_below_half": worst,
        "target_met": worst <= s.alpha,
        "power_at_half_plus_delta": power["now_loop"]["promoted"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2000, help="simulated A/B runs per cell")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    settings = {"production": LoopSettings(), "demo": loop_settings(Options())}
    out = {}
    for name, s in settings.items():
        print(f"== {name}: {out_settings(s)}", flush=True)
        out[name] = measure(name, s, args.runs, args.seed)
        print(f"{'true p':>7} {'exact':>6} {'loop':>6} {'clust.':>6} {'before':>6} "
              f"{'bef.cl':>6} {'pairs':>6}")  # fmt: skip
        for r in out[name]["rates"]:
            print(
                f"{r['true_win_rate']:>7.2f} {r['exact_independent']:>6.3f} "
                f"{r['now_loop']['promoted']:>6.3f} {r['now_clustered']['promoted']:>6.3f} "
                f"{r['before_loop']['promoted']:>6.3f} {r['before_clustered']['promoted']:>6.3f} "
                f"{r['now_loop']['median_pairs']:>6}"
            )
        met = "met" if out[name]["target_met"] else "MISSED"
        print(
            f"promotion at true win rate <= 0.5: at most "
            f"{out[name]['worst_promotion_at_or_below_half']:.3f} (alpha {s.alpha}: {met}); "
            f"power at {0.5 + s.sprt_delta:.2f}: {out[name]['power_at_half_plus_delta']:.3f}"
        )
    results_file.save("decisions", {"runs": args.runs, "ties": TIES, "spread": SPREAD, **out})


def out_settings(s: LoopSettings) -> str:
    return (
        f"delta {s.sprt_delta}, alpha {s.alpha}, beta {s.beta}, pairs {s.min_pairs}.."
        f"{s.max_pairs}, {s.pairs_per_round} per round"
    )


if __name__ == "__main__":
    main()
