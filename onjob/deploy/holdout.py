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
    """The held-out scenario ids. Each scenario's place is decided once, the first time
    this is called after it appears (in the order scenarios were first seen), and stored
    in `holdout_slice`: held out when its `share` is below `fraction` and some scenario
    seen before it is trained on (one scenario cannot be both trained on and held out).
    A decision never changes afterwards, whatever later scenarios or `fraction` do: a
    scenario trained on never becomes held out, and one held out is never trained on."""
    with store.transaction():
        new = store.query(
            "SELECT s.id FROM scenarios s ANTI JOIN holdout_slice h ON h.scenario_id = s.id "
            "ORDER BY s.first_seen NULLS LAST, s.id"
        )
        trained = store.query("SELECT count(*) AS n FROM holdout_slice WHERE NOT held")[0]["n"]
        decided = []
        for row in new:
            place = share(row["id"])
            held = place < fraction and trained > 0
            trained += not held
            decided.append([row["id"], held, place])
        if decided:
            store.con.executemany(
                "INSERT INTO holdout_slice (scenario_id, held, share, decided) "
                "VALUES (?, ?, ?, now())",
                decided,
            )
    rows = store.query("SELECT scenario_id FROM holdout_slice WHERE held ORDER BY scenario_id")
    return [r["scenario_id"] for r in rows]


def prompts(
    store,
    alias: str,
    scenarios: list[str],
    n: int,
    untrained_keys: list[str] = (),
    lineage: list[str] | tuple = (),
    test: str = "",
) -> list[dict]:
    """Up to `n` answered production turns of the held-out scenarios, of no API key in
    `untrained_keys`, the newest turn of each of the newest conversations, in no
    conversation the `lineage` (checkpoints: live and the candidate, with their
    ancestors) trained on: as for a canary's prompts, an answer a checkpoint was trained
    towards is not evidence about it. Conversations the `test` already drew from are
    skipped: a check resumed after a crash adds pairs, it does not repeat them."""
    if not scenarios:
        return []
    ids = f"""
        SELECT e.id, e.ts FROM exchanges e
        WHERE e.status < 400 AND e.source = 'production' AND e.model_alias = ?
          AND list_contains(?::VARCHAR[], e.scenario_id)
          AND NOT coalesce(list_contains(?::VARCHAR[], e.api_key_id), false)
          AND e.trajectory_id NOT IN ({canary.TRAINED_CONVERSATIONS})
          AND e.trajectory_id NOT IN (
              SELECT p.trajectory_id FROM groups g JOIN exchanges p ON p.id = g.prefix_exchange
              WHERE g.kind = 'ab' AND g.test = ?)
        QUALIFY row_number() OVER (PARTITION BY e.trajectory_id ORDER BY e.ts DESC) = 1
        ORDER BY e.ts DESC LIMIT ?
    """
    lineage = [c for c in lineage if c]
    return store.query(
        f"SELECT * FROM {rebuilt(ids)} ORDER BY ts DESC",
        [alias, scenarios, list(untrained_keys), lineage, test, n],
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
    test = test_id(candidate)
    done = await db.query(
        lambda st: st.query(
            "SELECT count(*) AS n FROM groups WHERE kind = 'ab' AND test = ?", [test]
        )
    )
    wanted = max(0, loop.holdout_pairs - done[0]["n"])
    chosen = await db.query(
        lambda st: prompts(st, loop.alias, held, wanted, untrained, [live, candidate], test)
    )
    if s.scorers:
        await canary.rejudge(db, s, rewards.load(s.rewards), test, echo=lambda _: None)
    if chosen and s.scorers:
        await operator.load(candidate)
        base = await sampling.base_model(engine)
        models = {"a": (live or base, live), "b": (candidate, candidate)}
        fns = rewards.load(s.rewards)
        await canary.paired_round(
            db, engine, s, fns, chosen, models, test=test, echo=lambda _: None
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
