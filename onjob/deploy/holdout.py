"""The held-out slice: scenarios no checkpoint trains on, where a candidate's test takes
its first look before it may become a canary.

A fixed share of scenarios (`loop.holdout_share`, by a hash of the scenario id, so the
slice is the same on every run and every host) never enters a training snapshot. After
a run, the candidate and live answer up to `loop.holdout_pairs` logged prompts of that
slice (one per conversation, the newest), judged together by the referee
(`canary.referee`: `loop.gate`, else the training reward). Those pairs are the first
observations of the candidate's one test (`stats.Rule`, continued by its canary's pairs):
the candidate is stopped before serving anyone when they already show it is not better
than live by `margin + delta` (a pair it could not answer, or the judge could not score,
is its loss; a candidate that much better is stopped with chance at most `beta`), when
a shape guard on its answers trips or holds (`shape.guards`: length, empty, cut,
malformed), or when it moved too far from the base model or its judges disagree with
users (`trust`). With no held-out traffic yet, the comparison is skipped and says so;
the `trust` guards still apply.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import httpx

from ..collector import Collector, rebuilt
from ..judge import rewards, sampling
from . import canary, ledger, shape, trust
from .operator import Operator
from .settings import DeploySettings, LoopSettings


def share(scenario_id: str) -> float:
    """Where a scenario falls in [0, 1): below `loop.holdout_share`, it is held out."""
    digest = hashlib.blake2b(f"holdout\x00{scenario_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def held_out(store, fraction: float) -> list[str]:
    """The held-out scenario ids among those seen so far; none while that would be every
    scenario (one scenario cannot be both trained on and held out)."""
    ids = [r["id"] for r in store.query("SELECT id FROM scenarios")]
    held = [i for i in ids if share(i) < fraction]
    return held if len(held) < len(ids) else []


def prompts(
    store, alias: str, scenarios: list[str], n: int, untrained_keys: list[str] = ()
) -> list[dict]:
    """Up to `n` answered production turns of the held-out scenarios, of no API key in
    `untrained_keys`, the newest turn of each of the newest conversations."""
    if not scenarios:
        return []
    ids = """
        SELECT e.id, e.ts FROM exchanges e
        WHERE e.status < 400 AND e.source = 'production' AND e.model_alias = ?
          AND list_contains(?::VARCHAR[], e.scenario_id)
          AND NOT coalesce(list_contains(?::VARCHAR[], e.api_key_id), false)
        QUALIFY row_number() OVER (PARTITION BY e.trajectory_id ORDER BY e.ts DESC) = 1
        ORDER BY e.ts DESC LIMIT ?
    """
    return store.query(
        f"SELECT * FROM {rebuilt(ids)} ORDER BY ts DESC",
        [alias, scenarios, list(untrained_keys), n],
    )


@dataclass(frozen=True)
class Check:
    passed: bool
    reason: str
    evidence: dict


def test_id(candidate: str) -> str:
    return canary.holdout_test_id(candidate)


async def compare(
    db: Collector,
    engine: httpx.AsyncClient,
    operator: Operator,
    settings: DeploySettings,
    *,
    live: str | None,
    candidate: str,
    held: list[str],
) -> Check:
    """The candidate (loaded into the engine) against live on the held-out slice, judged
    by the referee; the result (`check`)."""
    s = canary.referee(settings.judge, settings.loop.gate)
    loop = settings.loop
    # Its index in the alias's stream, fixed now: its share of alpha (`ledger`).
    await db.query(lambda st: ledger.enter(st, loop.alias, candidate))
    untrained = settings.proxy.untrained_keys
    chosen = await db.query(lambda st: prompts(st, loop.alias, held, loop.holdout_pairs, untrained))
    if chosen and s.scorers:
        await operator.load(candidate)
        base = await sampling.base_model(engine)
        models = {"a": (live or base, live), "b": (candidate, candidate)}
        fns = rewards.load(s.rewards)
        await canary.paired_round(
            db, engine, s, fns, chosen, models, test=test_id(candidate), echo=lambda _: None
        )
    judges = canary.judges(settings)
    return await db.query(lambda st: check(st, candidate, loop, judges))


def check(store, candidate: str, settings: LoopSettings, judges: list[str] = ()) -> Check:
    """The held-out comparison's result, from the pairs of `test_id(candidate)`, and the
    guards on the candidate itself (`trust`: its KL to the base model, the `judges`'
    agreement with users), which stop it even without held-out traffic."""
    test = test_id(candidate)
    rule, paired, level, unjudged = canary.weigh(store, settings.alias, candidate, [test], settings)
    tally = paired.tally
    guards = shape.guards(shape.paired_samples(store, test), settings, "held-out pairs")
    evidence = {"test": test, "paired": tally.as_dict(), "unjudged_pairs": len(unjudged)}
    evidence["e_process"] = rule.evidence(paired, level.alpha, level.k)
    evidence["shape"] = guards
    evidence["kl"] = trust.kl_guard(store, candidate, settings)
    evidence["judges"] = trust.agreement_guard(store, list(judges), settings)
    for guard in (evidence["kl"], evidence["judges"]):
        if guard["tripped"]:
            return Check(False, f"{candidate}: {guard['tripped']}", evidence)
    if paired.pairs == 0:
        return Check(True, "no held-out pairs yet: not checked", evidence)
    # The test's first looks: stopped when the e-process already rules out "better by
    # margin + delta" (a candidate that good is stopped here or later with chance <= beta
    # in all); held-out pairs never promote, the canary's guards have not looked yet.
    decision, why = rule.first_look(paired, level.alpha)
    if decision == "rollback":
        return Check(False, f"{candidate} on the held-out slice: {why}", evidence)
    if problem := guards["tripped"] or guards["holding"]:
        return Check(False, f"{candidate}: {problem}", evidence)
    return Check(True, f"held-out slice: {why}", evidence)
