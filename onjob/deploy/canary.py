"""Comparing two checkpoints fairly, and deciding a canary.

A *paired round*: logged prompts, each answered by both checkpoints, the answers of
one prompt judged together in one `ab` group (so judge drift and position bias
cancel out). The *verdict* on a canary: guards first (its error rate and median
latency against live's, on real traffic since it started), then Wald's SPRT on
the paired wins (at least `min_pairs`; undecided after `max_pairs` means roll
back and keep live).
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from dataclasses import dataclass

import httpx

from ..collector import Collector
from ..judge import JudgeSettings, SamplingFailed, sampling, tables
from ..judge.passes import PassReport, score_group
from . import stats
from .settings import LoopSettings


async def paired_round(
    db: Collector,
    engine: httpx.AsyncClient,
    s: JudgeSettings,
    fns: dict,
    prefixes: list[dict],
    models: dict[str, tuple[str, str | None]],
    echo=print,
) -> list[str]:
    """For each logged prompt, arm `a` and arm `b` (engine model id, checkpoint) answer it
    and the answers are judged together; returns the `ab` group ids."""
    gate = asyncio.Semaphore(s.concurrency)
    report, rng = PassReport(), random.Random()

    async def one(prefix: dict) -> str | None:
        async with gate:
            drawn = {}
            try:
                for arm, (model, checkpoint) in models.items():
                    body = sampling.request_for(prefix, model, s)
                    drawn[arm] = (checkpoint, await sampling.sample(engine, body))
            except SamplingFailed as exc:
                echo(f"  skipped a prompt: {exc}")
                return None
            group_id = await db.query(lambda st: tables.add_ab_group(st, prefix, drawn))
            await score_group(db, s, fns, {"id": group_id, "kind": "ab"}, report, echo, rng)
            return group_id

    return [g for g in await asyncio.gather(*(one(p) for p in prefixes)) if g]


def ab_outcomes(store, where: str, params: list) -> tuple[dict[str, list[float]], list[dict]]:
    """Per scenario, the outcome of each scored `ab` group (1: b won, 0.5 tie, 0: a won);
    and the groups that could not be judged."""
    rows = store.query(
        f"""
        SELECT g.id, g.status, g.reason, g.scenario_id, m.origin, s.score
        FROM groups g JOIN members m ON m.group_id = g.id
        LEFT JOIN scores s ON s.member_id = m.id AND s.source = 'combined'
        WHERE g.kind = 'ab' AND {where}
        """,
        params,
    )
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(
            r["id"], {"status": r["status"], "reason": r["reason"], "scenario": r["scenario_id"]}
        )
        g.setdefault(r["origin"], []).append(r["score"])
    by_scenario: dict[str, list[float]] = defaultdict(list)
    failed = []
    for group_id, g in groups.items():
        if g["status"] == "scored":
            by_scenario[g["scenario"]].append(stats.outcome(g["a"], g["b"]))
        elif g["status"] == "failed":
            failed.append({"group": group_id, "reason": g["reason"]})
    return by_scenario, failed


def _pair(live: str | None, canary: str) -> list[str]:
    return [live or "", canary]


def canary_prompts(store, alias: str, live: str | None, canary: str, n: int) -> list[dict]:
    """Recent answered production turns of the alias not yet compared for this pair."""
    return store.query(
        """
        SELECT e.* FROM exchanges e
        WHERE e.status < 400 AND e.source = 'production' AND e.model_alias = ?
          AND NOT EXISTS (
              SELECT 1 FROM groups g WHERE g.prefix_exchange = e.id AND g.kind = 'ab'
                AND list_transform(g.checkpoints, lambda x: coalesce(x, '')) = ?)
        ORDER BY e.ts DESC LIMIT ?
        """,
        [alias, _pair(live, canary), n],
    )


@dataclass
class Verdict:
    decision: str  # promote | rollback | wait
    reason: str
    evidence: dict


def verdict(store, alias: str, routing: dict, rule: LoopSettings) -> Verdict:
    live, canary, since = routing["live"], routing["canary"], routing["ts"]
    guard = _guards(store, alias, since, rule)
    outcomes, failed = ab_outcomes(
        store,
        "list_transform(g.checkpoints, lambda x: coalesce(x, '')) = ? AND g.created >= ?",
        [_pair(live, canary), since],
    )
    tally = stats.tally([o for outs in outcomes.values() for o in outs])
    sprt = stats.Sprt(rule.sprt_delta, rule.alpha, rule.beta)
    evidence = {
        "paired": tally.as_dict(),
        "unjudged_pairs": len(failed),
        "sprt": {
            "llr": sprt.llr(tally.wins, tally.losses),
            "promote_at": sprt.upper,
            "rollback_at": sprt.lower,
            "delta": rule.sprt_delta,
            "alpha": rule.alpha,
            "beta": rule.beta,
        },
        "guards": guard,
    }
    if guard["tripped"]:
        return Verdict("rollback", guard["tripped"], evidence)
    low, high = tally.interval()
    summary = (
        f"{tally.wins} wins, {tally.ties} ties, {tally.losses} losses in {tally.pairs} pairs "
        f"(win rate {tally.rate:.2f} [{low:.2f}, {high:.2f}])"
    )
    if tally.pairs < rule.min_pairs:
        return Verdict("wait", f"{summary}: fewer than {rule.min_pairs} pairs", evidence)
    decision = sprt.decide(tally.wins, tally.losses)
    if decision == "promote":
        return Verdict("promote", f"canary {canary} won: {summary}", evidence)
    if decision == "rollback":
        return Verdict("rollback", f"canary {canary} lost: {summary}", evidence)
    if tally.pairs >= rule.max_pairs:
        return Verdict(
            "rollback", f"no decision after {tally.pairs} pairs: keep live ({summary})", evidence
        )
    return Verdict("wait", f"{summary}: the test has not decided", evidence)


def _guards(store, alias: str, since, rule: LoopSettings) -> dict:
    """Error rate and median latency per arm on the alias's traffic since the canary began.
    Errors are the engine's and onjob's (a canary whose adapter fails counts), not the
    client's (400, 401, 413) or a client hanging up (499)."""
    rows = store.query(
        """
        SELECT arm, count(*) AS requests,
               count(*) FILTER (WHERE status >= 400 AND status NOT IN (400, 401, 413, 499))
                   AS errors,
               median(latency_ms) FILTER (WHERE status < 400) AS p50_ms
        FROM exchanges
        WHERE model_alias = ? AND ts >= ? AND source = 'production' AND arm IN ('live', 'canary')
        GROUP BY arm
        """,
        [alias, since],
    )
    arms = {r["arm"]: r for r in rows}
    out = {a: arms.get(a) for a in ("live", "canary")}
    out["tripped"] = None
    live, canary = arms.get("live"), arms.get("canary")
    if (
        not live
        or not canary
        or min(live["requests"], canary["requests"]) < rule.min_guard_requests
    ):
        return out
    live_rate = live["errors"] / live["requests"]
    canary_rate = canary["errors"] / canary["requests"]
    if canary_rate > live_rate + rule.max_error_increase:
        out["tripped"] = (
            f"error guard: canary errors {canary_rate:.1%} against live {live_rate:.1%}"
        )
    elif (
        live["p50_ms"]
        and canary["p50_ms"]
        and (canary["p50_ms"] > rule.max_latency_ratio * live["p50_ms"])
    ):
        out["tripped"] = (
            f"latency guard: canary median {canary['p50_ms']:.0f} ms against live "
            f"{live['p50_ms']:.0f} ms"
        )
    return out
