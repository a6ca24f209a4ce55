"""The paired evidence: logged prompts answered by two checkpoints and judged together.

A *paired round*: each prompt answered by arm `a` (live) and arm `b` (the candidate), the
two answers judged together in one `ab` group (so judge drift and position bias cancel
out) by the *referee* (`referee`: `loop.gate`, else the coach, the training reward).
Every group names the test it is evidence for (`test_ids`, which name live too): a
candidate's release test counts only its own pairs, never an `onjob compare` run's nor the
held-out slice's. `weigh` turns the release test's pairs into the e-process's state
(`stats.Rule`), `held_out` the slice's own test's: every pair counts, in order; one the
judge could not score is judged again (`rejudge`) before it counts as a loss.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

import httpx
import msgspec

from ...collector import Collector
from ...judge import JudgeSettings, SamplingFailed, sampling, tables
from ...judge.admission import Admission
from ...judge.passes import PassReport, score_group
from ...judge.tables import LoggedTurn
from ..records import Routing
from ..settings import DeploySettings, GateSettings, LoopSettings
from . import ledger, stats
from .evidence import HeldOutState, Tally, TestState


class Missing(msgspec.Struct, frozen=True, kw_only=True):
    """A pair without a judged comparison, and how its test counts it (`ab_outcomes`)."""

    group: str
    reason: str
    arm: Literal["a", "both"] | None  # the arm that could not answer, if one could not
    why: Literal["unjudged", "unsampled"]
    counted: Literal["loss", "excluded", "pending", "aside"]
    attempts: int = 0  # a pending pair's judgements so far
    behind: int = 0  # a pending pair: how many later pairs wait for it


async def paired_round(
    db: Collector,
    engine: httpx.AsyncClient,
    s: JudgeSettings,
    fns: dict,
    prefixes: list[LoggedTurn],
    models: dict[str, tuple[str, str | None]],
    *,
    test: str,
    echo=lambda _: None,
) -> list[str]:
    """For each logged prompt, arm `a` and arm `b` (engine model id, checkpoint) answer it
    and the answers are judged together; returns the `ab` group ids. A prompt an arm could
    not answer is recorded as a failed pair with the arm that failed."""
    gate, admission = asyncio.Semaphore(s.concurrency), Admission(engine, echo)
    report, rng = PassReport(), random.Random()

    async def draw(model: str, prefix: LoggedTurn):
        # Both arms on one seed (common random numbers): where the two checkpoints'
        # distributions agree they draw alike, so the pair's difference is theirs, not
        # the sampler's luck. Each arm's answers are still a fair sample of it.
        body = sampling.request_for(prefix, model, s) | {
            "seed": pair_seed(test, prefix.id or prefix.trajectory_id)
        }
        try:
            return await sampling.sample(engine, body)
        except SamplingFailed as exc:
            return exc

    async def one(prefix: LoggedTurn) -> str:
        async with gate, admission.admitted(len(models)):
            arms = list(models)
            # Both arms at once: the engine decodes them in one batch (adapters mixed). A
            # prefill cannot be shared between them: a LoRA on the attention projections
            # changes every layer's keys and values for the prompt too.
            answers = await asyncio.gather(*(draw(models[arm][0], prefix) for arm in arms))
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
            await score_group(db, s, fns, group_id, "ab", report, echo, rng)
            return group_id

    return list(await asyncio.gather(*(one(p) for p in prefixes)))


def pair_seed(test: str, prompt: str) -> int:
    """The seed both arms of a pair sample with: fixed by the test and the prompt (its
    exchange's id, or a file's request's conversation), so a resumed round draws the same
    answers."""
    name = f"{test}\x00{prompt}"
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "big") >> 1


def ab_outcomes(
    store, where: str, params: list, *, missing_is_loss: bool = True, attempts: int | None = None
) -> tuple[dict[str, list[float]], list[Missing]]:
    """Every pair of a test, counted. Per scenario, the paired difference of each `ab`
    pair (b's mean score - a's, in [-1, 1]; b is the candidate), and the pairs without a
    judged comparison.

    A pair the judge has not scored yet, or failed on fewer than `attempts` times, is
    *pending*: `rejudge` judges it again, and the outcomes stop at it (the test reads its
    pairs in the order they were made and never past a hole, so judging it later cannot
    reorder the evidence, and a judge that fails now and then costs nothing). One still
    unjudged after `attempts` is *set aside* (`counted: "aside"`: not among the
    outcomes, its prompt replaced by the next draws) when the referee failed on its own
    side: its RULER call failed whole, every answer of both arms unread alike (`_aside`;
    `stats.Rule` says why the test keeps its guarantee, and stops it when too many are).
    One a reward function failed on (it may have raised on the candidate's answer), or
    scored but unusable (not finite), is the candidate's loss, d = -1, as is a pair b
    could not answer (alone or with a): dropping them instead would let a candidate
    whose losses are the ones the judge fails on look better than it is. Only a pair
    that a alone could not answer is left out. `attempts=None`: no pair is pending nor
    set aside (each unjudged one counts as it stands).

    The second list names each pair without a judged comparison but those b alone could
    not answer (the candidate's own failure, an ordinary loss): `counted: "loss"` (among
    the outcomes, as -1), `"excluded"` (a failed alone; not among them) or `"pending"`
    (with `behind`: how many later pairs wait for it) or `"aside"` (the referee's own
    failure: not among them), with `why`: `unjudged` (no usable score), `unsampled`
    (both arms, or a, could not answer). `missing_is_loss=False`
    (`onjob compare`, a description rather than a decision) counts only a pair b alone
    could not answer, as b's loss."""
    judged, missing = _judged(store, where, params, missing_is_loss, attempts)
    by_scenario: dict[str, list[float]] = defaultdict(list)
    for scenario, d in judged:
        by_scenario[scenario].append(d)
    return by_scenario, missing


class _Scored(msgspec.Struct, frozen=True, kw_only=True):
    """One `ab` group's row per member's score (`_judged`): the member's columns are None
    for a group without members, the score's for a member without scores."""

    id: str
    status: str
    reason: str | None
    failed_arm: str | None
    attempts: int | None
    scenario_id: str | None
    origin: str | None
    member: str | None
    source: str | None
    score: float | None
    conversation: str | None  # the conversation its prompt came from
    call_failed: bool  # a judgement call of the group failed whole


def _judged(
    store,
    where: str,
    params: list,
    missing_is_loss: bool,
    attempts: int | None = None,
    *,
    units: bool = False,
) -> tuple[list[tuple[str, float]], list[Missing]]:
    """`ab_outcomes`' pairs as (scenario, difference), in the order they were made (group
    ids sort by creation) up to the first pending one, and the pairs without a judged
    comparison. `units`: a release test's reading, where the turns a draw took from one
    conversation (`prompts._unit`) are one pair, their mean difference, in the order of
    its first turn's, and pending while any of them is."""
    rows = store.rows(
        _Scored,
        f"""
        SELECT g.id, g.status, g.reason, g.failed_arm, g.attempts, g.scenario_id, m.origin,
               m.id AS member, s.source, s.score, p.trajectory_id AS conversation,
               EXISTS (SELECT 1 FROM judgements j WHERE j.group_id = g.id
                       AND j.status = 'failed') AS call_failed
        FROM groups g LEFT JOIN members m ON m.group_id = g.id
        LEFT JOIN scores s ON s.member_id = m.id
        LEFT JOIN exchanges p ON p.id = g.prefix_exchange
        WHERE g.kind = 'ab' AND {where}
        ORDER BY g.id, m.position
        """,
        params,
    )
    groups: dict[str, dict] = {}
    functions: set[str] = set()  # the reward functions that scored the test's pairs
    for r in rows:
        g = groups.setdefault(
            r.id,
            {
                "status": r.status,
                "reason": r.reason,
                "failed_arm": r.failed_arm,
                "attempts": r.attempts,
                "call_failed": r.call_failed,
                "sources": {},
            },
        )
        g["scenario"] = r.scenario_id
        g["unit"] = (r.conversation or r.id) if units else r.id
        if r.origin is None:
            continue
        sources = g["sources"].setdefault(r.member, set())
        if r.source is not None:
            sources.add(r.source)
            if r.source.startswith("fn:"):
                functions.add(r.source)
        if r.source == "combined":
            g.setdefault(r.origin, []).append(r.score)
    by_unit: dict[str, list[tuple[str, dict]]] = {}  # in the order of each unit's first
    for group_id, g in sorted(groups.items()):  # ids sort by creation: the pairs' order
        by_unit.setdefault(g["unit"], []).append((group_id, g))
    judged: list[tuple[str, float]] = []
    missing: list[Missing] = []
    left = len(groups)  # the groups in this unit and the ones after it
    for unit in by_unit.values():
        read = [_outcome(group_id, g, missing_is_loss, attempts, functions) for group_id, g in unit]
        waits = next((m for _, m in read if m is not None and m.counted == "pending"), None)
        if waits is not None:
            missing.append(msgspec.structs.replace(waits, behind=left - 1))
            break
        left -= len(unit)
        ds = [d for d, _ in read if d is not None]
        missing.extend(m for _, m in read if m is not None)
        if ds:
            judged.append((unit[0][1]["scenario"], sum(ds) / len(ds)))
    return judged, missing


def _outcome(
    group_id: str, g: dict, missing_is_loss: bool, attempts: int | None, functions: set[str]
) -> tuple[float | None, Missing | None]:
    """One `ab` group as its test counts it: its difference (None: not among the
    outcomes) and, for one without a judged comparison, how it is counted."""
    a, b = g.get("a") or [], g.get("b") or []
    usable = all(isinstance(x, int | float) and math.isfinite(x) for x in (*a, *b))
    if g["status"] == "scored" and a and b and usable:
        return stats.difference(a, b), None
    arm = g["failed_arm"]
    reason = g["reason"] or ("not scored yet" if g["status"] == "sampled" else "no score")
    if _pending(g, missing_is_loss, attempts):
        return None, Missing(group=group_id, reason=reason, arm=None, why="unjudged",
                             counted="pending", attempts=g["attempts"] or 0)  # fmt: skip
    if missing_is_loss and attempts is not None and arm is None and _aside(g, functions):
        return None, Missing(group=group_id, reason=reason, arm=None, why="unjudged",
                             counted="aside", attempts=g["attempts"] or 0)  # fmt: skip
    loses = arm != "a" if missing_is_loss else arm == "b"
    counted = "loss" if loses else "excluded"
    d = -1.0 if counted == "loss" else None
    if arm == "b":
        return d, None
    why = "unsampled" if arm else "unjudged"
    return d, Missing(group=group_id, reason=reason, arm=arm, why=why, counted=counted)


def _aside(group: dict, functions: set[str]) -> bool:
    """Whether a pair the referee never scored failed on the referee's side alone: a
    RULER call failed whole (it reads every answer at once; a provider's errors, its
    budget, an answer it could not read) while every reward function that scores the
    test's pairs scored each of its answers. A reward function runs answer by answer
    and fails the group when it raises on any one: that may be the candidate's answer,
    so such a pair stays the candidate's loss, as does one scored but unusable."""
    if group["status"] == "scored" or not group["call_failed"]:
        return False
    return all(functions <= sources for sources in group["sources"].values())


def _pending(group: dict, missing_is_loss: bool, attempts: int | None) -> bool:
    """A pair both arms answered that the judge may still score: not scored yet, or
    failed fewer than `attempts` times (a pair scored but unusable stays as it is)."""
    if not missing_is_loss or attempts is None or group["failed_arm"] is not None:
        return False
    return group["status"] in ("sampled", "failed") and (group["attempts"] or 0) < attempts


def unjudged(missing: list[Missing]) -> int:
    """How many of `ab_outcomes`' second list are losses for want of a judgement."""
    return sum(m.why == "unjudged" and m.counted == "loss" for m in missing)


async def rejudge(
    db: Collector, s: JudgeSettings, fns: dict, tests: list[str], attempts: int
) -> int:
    """The referee's retry: the pairs of `tests` not scored yet (its budget was spent, the
    loop stopped mid-round) or that it failed on fewer than `attempts` times, judged again
    now by the referee `s` (RULER shows the answers in a fresh random order each time).
    The judge pass never scores `ab` groups (`tables.groups_to_score`), so nothing else
    will. Returns how many it tried."""
    pending = await db.query(
        lambda st: st.column(
            "SELECT id FROM groups WHERE kind = 'ab' AND failed_arm IS NULL "
            "AND (status = 'sampled' OR status = 'failed') AND coalesce(attempts, 0) < ? "
            "AND list_contains(?::VARCHAR[], test) ORDER BY created, id",
            [attempts, list(tests)],
        )
    )
    report, rng = PassReport(), random.Random()
    for group_id in pending:
        await score_group(db, s, fns, group_id, "ab", report, lambda _: None, rng)
    return len(pending)


HOLDOUT = "holdout:"  # how the held-out slice's test ids start


def holdout_test_id(candidate: str, live: str | None) -> str:
    """The held-out slice's own test of a candidate against `live` (`held_out`)."""
    return f"{HOLDOUT}{live or ''}:{candidate}"


def offline_test_id(candidate: str, live: str | None) -> str:
    """The release test's pairs on prompts of the traffic the candidate cannot have
    trained on, sampled at the engine's speed before it serves anyone."""
    return f"offline:{live or ''}:{candidate}"


def canary_test_id(alias: str, routing: Routing) -> str:
    """The release test's pairs of a canary: its alias, live, canary and start."""
    since = routing.ts.isoformat()
    return f"canary:{alias}:{routing.live or ''}:{routing.canary}:{since}"


def test_ids(
    alias: str, candidate: str, live: str | None, routing: Routing | None = None
) -> list[str]:
    """Every test whose pairs are the candidate's one release test against `live`, in the
    order they are drawn: the offline pairs, then its canary's. Each names live: a
    candidate tested again against another live starts again."""
    out = [offline_test_id(candidate, live)]
    if routing is not None and routing.canary == candidate:
        out.append(canary_test_id(alias, routing))
    return out


def every_test_id(
    alias: str, candidate: str, live: str | None, routing: Routing | None = None
) -> list[str]:
    """The held-out slice's test and the release test's: every pair made for the
    candidate against `live` (no conversation serves two of them; each is judged again)."""
    return [holdout_test_id(candidate, live), *test_ids(alias, candidate, live, routing)]


def rule_of(settings: LoopSettings) -> stats.Rule:
    return stats.Rule(
        margin=settings.margin,
        delta=settings.delta,
        beta=settings.beta,
        min_pairs=settings.min_pairs,
        max_pairs=settings.max_pairs,
        max_unjudged_share=settings.max_unjudged_share,
    )


@dataclass(frozen=True)
class Weighed:
    """A candidate's test as it stands: the rule, the evidence so far (`paired`), its level
    in its lineage's stream, and the pairs without a judged comparison."""

    rule: stats.Rule
    paired: stats.Paired
    level: ledger.Level
    missing: list[Missing]

    def decide(self) -> tuple[stats.Decision, str]:
        return self.rule.decide(self.paired, self.level.alpha)

    def evidence(self) -> TestState:
        """The test's part of what the dashboard and the deployments log show."""
        level = self.level
        return TestState.of(
            self.rule,
            self.paired,
            level.alpha,
            level.k,
            rank=level.rank,
            period=level.period,
            carried=level.carried,
        )


def weigh(store, alias: str, candidate: str, tests: list[str], settings: LoopSettings) -> Weighed:
    """The candidate's release test on the pairs of `tests` (its offline pairs, then its
    canary's)."""
    judged, missing = _of_tests(store, tests, settings)
    rule = rule_of(settings)
    # In the order the pairs were made (the plug-in bet reads them so); the pairs without
    # a judgement are among them already, as -1: counted here, not added a second time.
    paired = rule.weigh([d for _, d in judged])
    _count_missing(paired, missing)
    return Weighed(rule, paired, ledger.level(store, alias, candidate, settings), missing)


@dataclass(frozen=True)
class HeldOut:
    """The held-out slice's own test: are the candidate's answers worse than live's on the
    scenarios no checkpoint trains on? Its pairs are made before the candidate serves
    anyone and are not the release test's (which samples the traffic it would serve):
    they ask whether what it learnt carried over, not whether it is better. `paired`'s
    `futile` e-value tests "no worse than live" (E[d] >= 0); at 1 / beta the candidate is
    stopped (one no worse is stopped by it with chance at most beta, however often it is
    looked at)."""

    paired: stats.Paired
    beta: float

    @property
    def worse(self) -> bool:
        return self.paired.futile.log_e >= math.log(1 / self.beta)

    def summary(self) -> str:
        p, t = self.paired, self.paired.tally
        out = f"{t.wins} wins, {t.ties} ties, {t.losses} losses in {p.pairs} held-out pairs"
        if p.unjudged:
            out += f" ({p.unjudged} unjudged, counted as losses)"
        if p.pairs:
            out += (
                f", mean difference {p.mean:+.3f}; e-value {math.exp(p.futile.log_e):.3g} of "
                f"{1 / self.beta:.3g} to stop"
            )
        return out

    def evidence(self) -> HeldOutState:
        """The slice's part of what the dashboard and the deployments log show."""
        p = self.paired
        return HeldOutState(
            **msgspec.structs.asdict(Tally.of(p.tally)),
            unjudged=p.unjudged,
            pending=p.pending,
            mean_difference=p.mean if p.pairs else None,
            worse_e_value=math.exp(p.futile.log_e),
            stop_at=1 / self.beta,
            worse=self.worse,
        )


def held_out(store, candidate: str, live: str | None, settings: LoopSettings) -> HeldOut:
    """The held-out slice's test of `candidate` against `live` as it stands."""
    judged, missing = _of_tests(store, [holdout_test_id(candidate, live)], settings)
    paired = stats.Paired(margin=-settings.delta, delta=settings.delta)  # futile: E[d] >= 0
    for _, d in judged:
        paired.add(d)
    _count_missing(paired, missing)
    return HeldOut(paired, settings.beta)


def _count_missing(paired: stats.Paired, missing: list[Missing]) -> None:
    paired.unjudged = sum(m.counted == "loss" for m in missing)
    paired.pending = sum(1 + m.behind for m in missing if m.counted == "pending")
    paired.aside = sum(m.counted == "aside" for m in missing)


def _of_tests(store, tests: list[str], settings: LoopSettings):
    """The pairs of a candidate's `tests` as its verdict reads them: in order, up to the
    first still to be judged again."""
    where = "list_contains(?::VARCHAR[], g.test)"
    return _judged(store, where, [tests], True, settings.rejudge_attempts, units=True)


def path(store, tests: list[str], settings: LoopSettings) -> list[dict]:
    """The test's e-values after each pair, the pairs in the order they were made, as the
    verdict reads them (the path ends where `weigh` is): what the dashboard draws against
    the two thresholds. Each point: pairs so far, the e-value to promote, the one to roll
    back."""
    judged, _ = _of_tests(store, tests, settings)
    paired, out = rule_of(settings).start(), []
    for _, d in judged:
        paired.add(d)
        out.append(
            {
                "pairs": paired.pairs,
                "e_value": math.exp(paired.better.log_e),
                "futility_e_value": math.exp(paired.futile.log_e),
            }
        )
    return out


def referee(judge: JudgeSettings, gate: GateSettings) -> JudgeSettings:
    """Who judges the pairs: the gate's scorers when `loop.gate` names any, else the
    training reward's (the judge's model and reward functions); each arm answering
    `gate.samples` times, read `gate.orders` times by a RULER judge."""
    paired = {"group_size": gate.samples or judge.group_size, "ruler_orders": gate.orders}
    if not gate.configured:
        return judge.model_copy(update=paired)
    return judge.model_copy(
        update={
            "model": gate.model,
            "rubric": gate.rubric or judge.rubric,
            "rubrics": {} if gate.rubric else judge.rubrics,
            "rewards": gate.rewards,
            **paired,
        }
    )


def judges(settings: DeploySettings) -> list[str]:
    """The score sources a checkpoint's promotion rests on: the coach's (what it trained
    on) and the referee's (what the pairs are judged by)."""
    referee_ = referee(settings.judge, settings.loop.gate)
    return sorted(set(settings.judge.scorers) | set(referee_.scorers))
