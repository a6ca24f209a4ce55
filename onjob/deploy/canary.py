"""Comparing two checkpoints fairly, and deciding a canary.

A *paired round*: logged prompts, each answered by both checkpoints, the answers of
one prompt judged together in one `ab` group (so judge drift and position bias
cancel out). Every group names the test it is evidence for (`test_id`): a canary's
verdict counts only its own pairs, never an `onjob compare` run's.

The prompts (`canary_prompts`) are ones the canary cannot have trained on and that
its own answers did not shape: production turns logged after the canary started,
on live-arm conversations, outside every conversation in the training snapshots of
the canary's lineage, one turn per conversation (turns of one conversation are not
independent evidence).

The *verdict* (`verdict`): guards on real traffic first, per conversation since the
canary started (error rate and latency against live's; they must have enough
conversations on both arms before any promotion, and trip a rollback only when an
interval valid at every look says the canary is worse), then the paired test
(`stats.Rule`: an e-process on the paired score differences, the held-out pairs its
first observations, at the candidate's share of `loop.alpha` (`ledger`); a pair the
canary could not answer or the judge could not score is its loss; too many unjudged
pairs block promotion; undecided after `max_pairs` keeps live).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import defaultdict
from dataclasses import dataclass

import httpx

from ..collector import Collector, rebuilt
from ..judge import JudgeSettings, SamplingFailed, sampling, tables
from ..judge.passes import PassReport, score_group
from . import ledger, shape, stats, trust
from .settings import DeploySettings, GateSettings, LoopSettings


async def paired_round(
    db: Collector,
    engine: httpx.AsyncClient,
    s: JudgeSettings,
    fns: dict,
    prefixes: list[dict],
    models: dict[str, tuple[str, str | None]],
    *,
    test: str,
    echo=print,
) -> list[str]:
    """For each logged prompt, arm `a` and arm `b` (engine model id, checkpoint) answer it
    and the answers are judged together; returns the `ab` group ids. A prompt an arm could
    not answer is recorded as a failed pair with the arm that failed."""
    gate = asyncio.Semaphore(s.concurrency)
    report, rng = PassReport(), random.Random()

    async def draw(model: str, prefix: dict):
        try:
            return await sampling.sample(engine, sampling.request_for(prefix, model, s))
        except SamplingFailed as exc:
            return exc

    async def one(prefix: dict) -> str:
        async with gate:
            arms = list(models)
            answers = [await draw(models[arm][0], prefix) for arm in arms]
            failed = [arm for arm, x in zip(arms, answers, strict=True) if isinstance(x, Exception)]
            if failed:
                arm = failed[0] if len(failed) == 1 else "both"
                reason = "; ".join(
                    f"{a}: {x}" for a, x in zip(arms, answers, strict=True) if a in failed
                )
                echo(f"  a pair could not be sampled ({reason})")
                checkpoints = [models[a][1] for a in arms]
                return await db.query(
                    lambda st: tables.add_failed_ab_group(
                        st, prefix, checkpoints, test=test, arm=arm, reason=reason
                    )
                )
            drawn = {arm: (models[arm][1], x) for arm, x in zip(arms, answers, strict=True)}
            group_id = await db.query(lambda st: tables.add_ab_group(st, prefix, drawn, test=test))
            await score_group(db, s, fns, {"id": group_id, "kind": "ab"}, report, echo, rng)
            return group_id

    return list(await asyncio.gather(*(one(p) for p in prefixes)))


def ab_outcomes(
    store, where: str, params: list, *, missing_is_loss: bool = True
) -> tuple[dict[str, list[float]], list[dict]]:
    """Every pair of a test, counted. Per scenario, the paired difference of each `ab`
    pair (b's mean score - a's, in [-1, 1]; b is the candidate), and the pairs without a
    judged comparison.

    Every pair counts against the candidate unless live alone is at fault: a pair the
    judge could not score (it failed or raised, its scores are missing or not finite, or
    it is still unscored: the referee's budget spent, the loop stopped mid-round) is the
    candidate's loss, d = -1, as is a pair b could not
    answer (alone or with a). Dropping them instead would let a candidate whose losses
    are the ones the judge fails on look better than it is. Only a pair that a alone
    could not answer is left out.

    The second list names each pair without a judged comparison but those b alone could
    not answer (the candidate's own failure, an ordinary loss): `counted: "loss"` (among
    the outcomes, as -1) or `counted: "excluded"` (a failed alone; not among them), with
    `why`: `unjudged` (no usable score), `unsampled` (both arms, or a, could not answer).
    `missing_is_loss=False` (`onjob compare`, a description rather than a decision)
    counts only a pair b alone could not answer, as b's loss."""
    rows = store.query(
        f"""
        SELECT g.id, g.status, g.reason, g.failed_arm, g.scenario_id, m.origin, s.score
        FROM groups g LEFT JOIN members m ON m.group_id = g.id
        LEFT JOIN scores s ON s.member_id = m.id AND s.source = 'combined'
        WHERE g.kind = 'ab' AND {where}
        """,
        params,
    )
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(r["id"], {k: r[k] for k in ("status", "reason", "failed_arm")})
        g["scenario"] = r["scenario_id"]
        if r["origin"] is not None:
            g.setdefault(r["origin"], []).append(r["score"])
    by_scenario: dict[str, list[float]] = defaultdict(list)
    missing = []
    for group_id, g in sorted(groups.items()):
        a, b = g.get("a") or [], g.get("b") or []
        usable = all(isinstance(x, int | float) and math.isfinite(x) for x in (*a, *b))
        if g["status"] == "scored" and a and b and usable:
            by_scenario[g["scenario"]].append(stats.difference(a, b))
            continue
        arm = g["failed_arm"]
        loses = arm != "a" if missing_is_loss else arm == "b"
        counted = "loss" if loses else "excluded"
        if counted == "loss":
            by_scenario[g["scenario"]].append(-1.0)
        if arm == "b":
            continue
        why = "unsampled" if arm else "unjudged"
        reason = g["reason"] or ("not scored yet" if g["status"] == "sampled" else "no score")
        missing.append(
            {"group": group_id, "reason": reason, "arm": arm, "why": why, "counted": counted}
        )
    return by_scenario, missing


def unjudged(missing: list[dict]) -> int:
    """How many of `ab_outcomes`' second list are losses for want of a judgement."""
    return sum(m["why"] == "unjudged" for m in missing)


async def rejudge(db: Collector, s: JudgeSettings, fns: dict, test: str, echo=print) -> int:
    """The referee's retry: the test's pairs sampled but never scored (its budget was
    spent, the loop stopped mid-round), judged now by the referee `s`. The judge pass
    never scores `ab` groups (`tables.groups_to_score`), so nothing else will. Returns
    how many it tried."""
    pending = await db.query(
        lambda st: st.query(
            "SELECT id, kind FROM groups WHERE kind = 'ab' AND test = ? AND status = 'sampled' "
            "ORDER BY created",
            [test],
        )
    )
    report, rng = PassReport(), random.Random()
    for group in pending:
        await score_group(db, s, fns, group, report, echo, rng)
    return len(pending)


def test_id(alias: str, routing: dict) -> str:
    """The name of the test a canary's pairs belong to: its alias, live, canary and start."""
    since = routing["ts"].isoformat()
    return f"canary:{alias}:{routing['live'] or ''}:{routing['canary']}:{since}"


# Conversations in the training snapshot of a checkpoint or any of its ancestors: the
# lineage's train runs, their groups, and every conversation those groups' members are in.
TRAINED_CONVERSATIONS = """
WITH RECURSIVE chain(name) AS (
    SELECT unnest(?::VARCHAR[])
    UNION
    SELECT c.parent FROM checkpoints c JOIN chain ON c.name = chain.name
    WHERE c.parent IS NOT NULL
), trained AS (
    SELECT unnest(t.groups_used) AS group_id
    FROM checkpoints c JOIN chain ON c.name = chain.name JOIN train_runs t ON t.id = c.train_run
)
SELECT DISTINCT m.trajectory_id FROM members m JOIN trained ON trained.group_id = m.group_id
WHERE m.trajectory_id IS NOT NULL
"""


def canary_prompts(
    store, alias: str, routing: dict, n: int, untrained_keys: list[str] = ()
) -> list[dict]:
    """Up to `n` prompts for the canary's next round: production turns of the alias logged
    on the live arm since the canary started, in no conversation of its lineage's training
    snapshots, from conversations this test has not drawn from yet, of no API key in
    `untrained_keys` (never re-sampled nor judged), the latest turn of each (the newest
    conversations first)."""
    checkpoints = [c for c in (routing["live"], routing["canary"]) if c]
    ids = f"""
        SELECT e.id, e.ts FROM exchanges e
        WHERE e.status < 400 AND e.source = 'production' AND e.model_alias = ?
          AND e.arm = 'live' AND e.ts >= ?
          AND NOT coalesce(list_contains(?::VARCHAR[], e.api_key_id), false)
          AND e.trajectory_id NOT IN ({TRAINED_CONVERSATIONS})
          AND e.trajectory_id NOT IN (
              SELECT p.trajectory_id FROM groups g JOIN exchanges p ON p.id = g.prefix_exchange
              WHERE g.kind = 'ab' AND g.test = ?)
        QUALIFY row_number() OVER (PARTITION BY e.trajectory_id ORDER BY e.ts DESC) = 1
        ORDER BY e.ts DESC LIMIT ?
    """
    return store.query(
        f"SELECT * FROM {rebuilt(ids)} ORDER BY ts DESC",
        [alias, routing["ts"], list(untrained_keys), checkpoints, test_id(alias, routing), n],
    )


@dataclass
class Verdict:
    decision: stats.Decision
    reason: str
    evidence: dict


def rule_of(settings: LoopSettings) -> stats.Rule:
    return stats.Rule(
        margin=settings.margin,
        delta=settings.delta,
        beta=settings.beta,
        min_pairs=settings.min_pairs,
        max_pairs=settings.max_pairs,
        max_unjudged_share=settings.max_unjudged_share,
    )


def holdout_test_id(candidate: str) -> str:
    """The test a candidate's held-out pairs belong to: its test's first observations."""
    return f"holdout:{candidate}"


def weigh(store, alias: str, candidate: str, tests: list[str], settings: LoopSettings):
    """The candidate's test on the pairs of `tests` (its held-out pairs, then its canary's):
    the rule, the evidence so far, its level in the alias's stream, the unjudged pairs."""
    outcomes, missing = ab_outcomes(store, "list_contains(?::VARCHAR[], g.test)", [tests])
    rule = rule_of(settings)
    # The pairs without a judgement are among `outcomes` already, as -1 (every pair
    # counts): counted here, not added a second time.
    paired = rule.weigh([d for ds in outcomes.values() for d in ds])
    paired.unjudged = sum(m["counted"] == "loss" for m in missing)
    return rule, paired, ledger.level(store, alias, candidate, settings.alpha), missing


def referee(judge: JudgeSettings, gate: GateSettings) -> JudgeSettings:
    """Who judges the pairs: the gate's scorers when `loop.gate` names any, else the
    training reward's (the judge's model and reward functions)."""
    if not gate.configured:
        return judge
    return judge.model_copy(
        update={
            "model": gate.model,
            "rubric": gate.rubric or judge.rubric,
            "rubrics": {} if gate.rubric else judge.rubrics,
            "rewards": gate.rewards,
        }
    )


def judges(settings: DeploySettings) -> list[str]:
    """The score sources a checkpoint's promotion rests on: the coach's (what it trained
    on) and the referee's (what the pairs are judged by)."""
    referee_ = referee(settings.judge, settings.loop.gate)
    return sorted(set(settings.judge.scorers) | set(referee_.scorers))


def verdict(
    store, alias: str, routing: dict, settings: LoopSettings, judges: list[str] = ()
) -> Verdict:
    """What the evidence gathered so far says about `routing`'s canary (a `deployments`
    row: live, canary, since); the evidence names the routing it is about. Guards on
    errors, latency, the answers' shape (`shape`), the canary's drift from the base model
    and the `judges`' agreement with users (`trust`) come before the paired test."""
    live, canary = routing["live"], routing["canary"]
    test = test_id(alias, routing)
    guards = _guards(store, alias, routing["ts"], settings)
    hacking = {
        "traffic": shape.guards(
            shape.real_traffic(store, alias, routing["ts"]), settings, "real traffic"
        ),
        "pairs": shape.guards(shape.paired_samples(store, test), settings, "paired samples"),
        "kl": trust.kl_guard(store, canary, settings),
        "judges": trust.agreement_guard(store, list(judges), settings),
    }
    tests = [holdout_test_id(canary), test]
    rule, paired, level, unjudged = weigh(store, alias, canary, tests, settings)
    evidence = {
        "test": test,
        "routing": {"live": live, "canary": canary, "since": routing["ts"].isoformat()},
        "paired": paired.tally.as_dict(),
        "unjudged_pairs": len(unjudged),
        "e_process": rule.evidence(paired, level.alpha, level.k),
        "guards": guards,
        "shape": hacking,
    }
    checks = (guards, *hacking.values())
    tripped = next((g["tripped"] for g in checks if g["tripped"]), None)
    if tripped:
        return Verdict("rollback", tripped, evidence)
    decision, why = rule.decide(paired, level.alpha)
    reason = f"canary {canary} {why}" if decision != "wait" else why
    holding = next((g["holding"] for g in checks if g.get("holding")), None)
    if decision == "promote" and holding:
        return Verdict("wait", f"canary {canary} won the pairs, but {holding}", evidence)
    return Verdict(decision, reason, evidence)


def _guards(store, alias: str, since, settings: LoopSettings) -> dict:
    """Errors and latency per conversation on each arm since the canary began. A guard
    *trips* (roll back) when an interval valid at every look (`stats.anytime_interval`,
    at `alpha`) puts the canary beyond its bound; it *holds* a promotion while either arm
    has served fewer than `min_guard_conversations` conversations or the point estimate is
    beyond the bound. Errors are the engine's and onjob's (a canary whose adapter fails
    counts), not the client's (400, 401, 413) or a client hanging up (499).

    Errors: the share of conversations with a failed request, canary's against live's plus
    `max_error_increase`. Latency: the share of canary conversations slower than
    `max_latency_ratio` times live's median conversation; over one half means the canary's
    median is beyond the ratio."""
    rows = store.query(
        """
        SELECT arm, trajectory_id,
               bool_or(status >= 400 AND status NOT IN (400, 401, 413, 499)) AS failed,
               median(latency_ms) FILTER (WHERE status < 400) AS latency_ms
        FROM exchanges
        WHERE model_alias = ? AND ts >= ? AND source = 'production' AND arm IN ('live', 'canary')
        GROUP BY arm, trajectory_id
        """,
        [alias, since],
    )
    arms: dict[str, list[dict]] = {"live": [], "canary": []}
    for r in rows:
        arms[r["arm"]].append(r)
    out: dict = {}
    for arm, convs in arms.items():
        times = sorted(c["latency_ms"] for c in convs if c["latency_ms"] is not None)
        out[arm] = {
            "conversations": len(convs),
            "failed": sum(bool(c["failed"]) for c in convs),
            "p50_ms": times[len(times) // 2] if times else None,
        }
    out["tripped"], out["holding"] = None, None
    live, canary = out["live"], out["canary"]
    need = settings.min_guard_conversations
    a = settings.alpha / 2  # two guards
    errors = stats.increase(
        (canary["failed"], canary["conversations"]),
        (live["failed"], live["conversations"]),
        settings.max_error_increase,
        a,
    )
    if errors:
        c_rate = canary["failed"] / canary["conversations"]
        l_rate = live["failed"] / live["conversations"]
        said = f"canary conversations failed {c_rate:.1%} against live {l_rate:.1%}"
        if errors == "trip":
            out["tripped"] = f"error guard: {said} (more than +{settings.max_error_increase:.0%})"
        else:
            out["holding"] = f"the error guard holds: {said}"
    if not out["tripped"] and live["p50_ms"]:
        bound = settings.max_latency_ratio * live["p50_ms"]
        timed = [c for c in arms["canary"] if c["latency_ms"] is not None]
        slow = sum(c["latency_ms"] > bound for c in timed)
        said = (
            f"{slow} of {len(timed)} canary conversations slower than "
            f"{settings.max_latency_ratio:g} x live's median ({live['p50_ms']:.0f} ms)"
        )
        latency = stats.majority(slow, len(timed), a)
        if latency == "trip":
            out["tripped"] = f"latency guard: {said}"
        elif latency == "hold" and not out["holding"]:
            out["holding"] = f"the latency guard holds: {said}"
    if not out["holding"] and min(live["conversations"], canary["conversations"]) < need:
        out["holding"] = (
            f"the guards need {need} conversations per arm (live {live['conversations']}, "
            f"canary {canary['conversations']})"
        )
    return out
