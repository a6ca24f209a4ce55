"""How `loop.alpha_split` shares the release rule's error control between tenants: each
tenant's lineage simulated for a month with `decisions.py`'s model of candidates and
scores (the project's own rule, alpha spending, back-off and training budget), side by
side under both splits.

- `tenant` (the default): each lineage's stream at `loop.alpha`. Stated: for each
  tenant, P(a candidate no better than its live is ever promoted) <= alpha; for the
  server, P(any tenant gets one) <= alpha x lineages (a union bound).
- `server`: lineage j at 6 alpha / (pi^2 j^2). Stated: P(any tenant gets one) <= alpha,
  at less power for lineages that come later.

Reported per split: the worst tenant's P(bad promotion in a month), P(any tenant's), and
good promotions per week for the first and the last lineage. `--null` makes every
candidate no better than live (the worst case for the error bound).

Targets: under `tenant`, every tenant's P(bad) <= alpha; under `server`, P(any) <= alpha.

    python -m bench.scale.tenant_alpha [--tenants 8] [--months 200] [--null] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from bench import harness
from bench.release import decisions
from onjob.deploy.decide import stats
from onjob.deploy.settings import LoopSettings


def lineage_alphas(alpha: float, tenants: int, split: str) -> list[float]:
    """Each lineage's alpha, in the order of its first candidate (`ledger.lineage_alpha`)."""
    if split == "tenant":
        return [alpha] * tenants
    return [stats.spend(alpha, j) for j in range(1, tenants + 1)]


def simulate(s: LoopSettings, split: str, tenants: int, months: int, rng, scores: str) -> dict:
    alphas = lineage_alphas(s.alpha, tenants, split)
    bad = [[False] * months for _ in range(tenants)]
    good = [[0] * months for _ in range(tenants)]
    for j, a in enumerate(alphas):
        lineage = s.model_copy(update={"alpha": a})
        for m in range(months):
            out = decisions.month("production", lineage, scores, 0.02, rng)
            bad[j][m] = any(d.decision == "promote" and d.mean <= 0 for d in out)
            good[j][m] = sum(d.decision == "promote" and d.mean > 0 for d in out)
    per_tenant = [sum(b) / months for b in bad]
    return {
        "lineage_alphas": alphas,
        "worst_tenant_bad": max(per_tenant),
        "mean_tenant_bad": statistics.mean(per_tenant),
        "any_tenant_bad": sum(any(bad[j][m] for j in range(tenants)) for m in range(months))
        / months,
        "good_per_week_first": statistics.mean(good[0]) * 7 / 30,
        "good_per_week_last": statistics.mean(good[-1]) * 7 / 30,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenants", type=int, default=8, help="lineages (tenants and shared)")
    ap.add_argument("--months", type=int, default=200, help="simulated months per lineage")
    ap.add_argument("--null", action="store_true", help="every candidate no better than live")
    ap.add_argument("--scores", choices=("graded", "sign"), default="graded")
    ap.add_argument("--seed", type=int, default=0)
    args = harness.parse(ap, timed=False)
    if args.null:
        decisions.MIX = {"no better": (1.0, 0.0)}
    s = LoopSettings()
    out = {}
    for split in ("tenant", "server"):
        started = time.monotonic()
        rng = random.Random(f"{args.seed}-{split}")
        r = out[split] = simulate(s, split, args.tenants, args.months, rng, args.scores)
        bound = s.alpha
        what = "every tenant's" if split == "tenant" else "any tenant's"
        said = r["worst_tenant_bad"] if split == "tenant" else r["any_tenant_bad"]
        met = "met" if said <= bound else "MISSED"
        print(
            f"== alpha_split {split} ({args.tenants} lineages, {args.months} months each, "
            f"alpha {s.alpha}, {time.monotonic() - started:.0f} s)\n"
            f"P(bad promotion in a month): worst tenant {r['worst_tenant_bad']:.3f}, mean "
            f"{r['mean_tenant_bad']:.3f}; any tenant {r['any_tenant_bad']:.3f} "
            f"(target: {what} <= {bound}: {met})\n"
            f"good promotions per week: first lineage {r['good_per_week_first']:.2f}, last "
            f"{r['good_per_week_last']:.2f} (its alpha {r['lineage_alphas'][-1]:.4f})"
        )
    harness.save(
        "tenant_alpha",
        {"tenants": args.tenants, "months": args.months, "null": args.null,
         "scores": args.scores, "seed": args.seed, "mix": decisions.MIX, **out},
        args.out,
    )  # fmt: skip


if __name__ == "__main__":
    main()
