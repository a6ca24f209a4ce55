"""One judge pass: re-sample turn groups, gather trajectory groups, score what is unscored.

`run_pass()` is what `onjob judge --once` runs and what `onjob serve` runs every
`loop.interval_s`. It works through a `Collector` (every DuckDB read and write on the
collector's database thread) and an `httpx.AsyncClient` for the engine, passed in.

With `judge.max_usd_per_day`, the day's spend (the `judgements` rows since 00:00 UTC)
is read before every RULER call; once it reaches the limit no call is made: a group
that needs one stays `sampled`, whole (its reward functions wait with it: a group
scored without its judge would be `scored` for good, with a reward the weights never
meant), and is scored after 00:00 UTC. A judgement the cache holds costs nothing and
is still used. A pass that starts over budget makes no new groups either: nobody could
score them today, and the logged turns stay where they are. Calls already in flight
(at most `judge.concurrency`) can pass the limit by their own cost.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from .. import logprobs
from ..collector import Collector, budgets
from ..collector.scope import EVERY_KEY, KeyScope
from ..logprobs import TRAINED
from . import rewards, ruler, sampling, signal, tables, tenants
from .admission import Admission
from .errors import RewardFnFailed, SamplingFailed
from .rollouts import from_row
from .settings import JudgeSettings
from .settled import settled_scenarios

log = logging.getLogger("onjob.judge")


@dataclass(frozen=True)
class KeyBudget:
    """A daily budget for RULER calls on the groups of some API keys (a tenant's share of
    the judge, `loop.tenant_budgets`): checked before each call, as the server's is."""

    whose: str  # for people: "tenant acme"
    keys: tuple[str, ...]
    usd_per_day: float

    def today(self, store) -> budgets.Budget:
        return budgets.judge(store, self.usd_per_day, keys=self.keys, whose=self.whose)


@dataclass
class PassReport:
    turn_groups: int = 0
    trajectory_groups: int = 0
    sampling_failed: int = 0
    over_budget: int = 0
    sampled_tokens: int = 0
    scored: int = 0
    failed: int = 0
    waiting: int = 0  # no scorer could score them yet (feedback-only, not all members have it)
    waiting_for_budget: int = 0  # RULER's daily budget is spent: scored after 00:00 UTC
    budget: budgets.Budget | None = None  # the judge's daily budget, when it has one
    silent: int = 0  # scenarios not re-sampled: their groups carry no signal (signal.py)
    no_scorer: bool = False  # no judge, no reward function: no turn re-sampled
    judge_calls: int = 0
    cache_hits: int = 0
    judge_tokens: int = 0
    judge_cost_usd: float = 0.0
    judge_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        judge = ""
        if self.judge_calls or self.cache_hits:
            mean_ms = sum(self.judge_ms) / len(self.judge_ms) if self.judge_ms else 0.0
            judge = (
                f"; RULER: {self.judge_calls} calls ({mean_ms / 1000:.1f} s and "
                f"{self.judge_tokens / max(self.judge_calls, 1):.0f} tokens per group, "
                f"${self.judge_cost_usd:.4f}), {self.cache_hits} cache hits"
            )
        budget = ""
        if self.budget is not None:
            budget = f"; {self.budget.status()}"
        if self.waiting_for_budget:
            server = self.budget is not None and self.budget.spent_out
            whose = "it" if server else "their tenant's judge budget"
            budget += f" ({self.waiting_for_budget} groups wait for {whose})"
        if self.no_scorer:
            budget += "; no scorer, so no turn re-sampled (users' feedback scores conversations)"
        return (
            f"{self.turn_groups} turn groups ({self.sampled_tokens} tokens sampled, "
            f"{self.sampling_failed} failed, {self.over_budget} over budget), "
            f"{self.trajectory_groups} trajectory groups; scored {self.scored}, "
            f"failed {self.failed}, waiting {self.waiting}{judge}{budget}; {self.seconds:.1f} s"
        )


async def run_pass(
    db: Collector,
    engine: httpx.AsyncClient,
    settings: JudgeSettings,
    *,
    echo: Callable[[str], None] = log.info,
    rng: random.Random | None = None,
    skip_scenarios: list[str] = (),
    untrained_keys: list[str] = (),
    key_budgets: Sequence[KeyBudget] = (),
    engine_logprobs: str = TRAINED,
    scope: KeyScope = EVERY_KEY,
) -> PassReport:
    """Sample new groups (none from `skip_scenarios`: the loop's held-out slice, which no
    training run uses; none of the API keys in `untrained_keys`, whose traffic is never
    judged, nor of keys whose `key_budgets` share is spent today) and score every group
    still unscored (but those of several keys or of an untrained one: failed; those that
    need a RULER call their share cannot pay for today: left for a later pass). With no
    judge and no reward function, no turn is re-sampled: nothing could score it.
    `engine_logprobs`: the engine's logprob definition when its model list does not
    state one (vLLM's). `scope`: the keys of the lineage whose pass this is (a worker
    holds one lineage at a time on a lake); its untrained keys' groups are still
    scored, as failed."""
    started = time.perf_counter()
    fns = rewards.load(settings.rewards)  # a reward function that does not import stops here
    report = PassReport()
    await db.flush()
    report.budget = await judge_budget(db, settings)
    if report.budget is not None and report.budget.spent_out:
        echo(f"{report.budget.status()}: no new groups, and those that need RULER wait")
    else:
        kept_out = list(untrained_keys)
        for share in key_budgets if settings.model else ():
            spent = await db.query(share.today)
            if spent.spent_out:
                echo(f"{spent.status()}: no new groups of {', '.join(share.keys)}")
                kept_out += share.keys
        skip = list(skip_scenarios)
        silent = await db.query(signal.silent_scenarios)
        if silent:
            report.silent = len(silent)
            echo(
                f"{len(silent)} scenarios not re-sampled: their last {signal.SILENT_GROUPS} "
                "groups gave every member the same score (no signal to learn from); tried "
                f"again {signal.SILENT_S // 60} minutes after"
            )
            skip += silent
        # Without a judge or a reward function a re-sampled answer is never scored
        # (feedback scores the answers users saw): the engine is left to them.
        report.no_scorer = settings.scorer() is None
        if not report.no_scorer:
            await _sample_turn_groups(
                db, engine, settings, report, echo, skip, kept_out, engine_logprobs, scope
            )
        if settings.scenario_groups:
            await _gather_trajectory_groups(db, settings, report, echo, skip, kept_out, scope)
    await _score_groups(
        db,
        settings,
        fns,
        report,
        echo,
        rng or random.Random(),
        frozenset(untrained_keys),
        tuple(key_budgets),
        scope,
    )
    report.budget = await judge_budget(db, settings)
    report.seconds = time.perf_counter() - started
    return report


async def judge_budget(db: Collector, s: JudgeSettings) -> budgets.Budget | None:
    """RULER's budget today (None: no RULER judge, or no limit)."""
    if s.model is None or s.max_usd_per_day is None:
        return None
    return await db.query(lambda store: budgets.judge(store, s.max_usd_per_day))


async def _sample_turn_groups(
    db,
    engine,
    s: JudgeSettings,
    report: PassReport,
    echo,
    skip: list[str],
    untrained: list[str],
    declared: str,
    scope: KeyScope,
) -> None:
    def chosen(store):
        later = settled_scenarios(store, s.settled_after)
        return tables.turn_candidates(store, s, skip, untrained, later, scope)

    candidates = await db.query(chosen)
    if not candidates:
        return
    try:
        card = await sampling.base_card(engine)
    except SamplingFailed as exc:
        echo(f"cannot re-sample: {exc}; the turns wait for the next pass")
        return
    base, said = card.id, card.logprobs
    stated = said is not None  # the engine's word, else as declared for it
    definition = said if stated else declared
    budget, planned = s.max_sample_tokens, []
    for row in candidates:
        body = sampling.request_for(row, row.checkpoint or base, s)
        cost = sampling.token_estimate(body, row)
        if cost > budget:
            report.over_budget += 1
            continue
        budget -= cost
        planned.append((row, body))
    echo(
        f"re-sampling {len(planned)} logged turns, {s.group_size} alternatives each "
        f"({s.concurrency} at a time)"
    )
    gate, admission = asyncio.Semaphore(s.concurrency), Admission(engine, echo)

    async def one(row: dict, body: dict) -> None:
        async with gate, admission.admitted():
            try:
                sample = await sampling.sample(
                    engine,
                    body,
                    definition=logprobs.recorded(definition, stated=stated, request=body),
                )
            except SamplingFailed as exc:
                report.sampling_failed += 1
                if not exc.permanent:
                    echo(f"  {row.id}: {exc} (retried next pass)")
                    return
                reason = str(exc)
                group_id = await db.query(lambda st: tables.add_turn_group(st, row, None, reason))
                echo(f"  {row.id}: {reason} (group {group_id} failed)")
                return
        group_id = await db.query(lambda st: tables.add_turn_group(st, row, sample))
        report.turn_groups += 1
        report.sampled_tokens += (sample.usage or {}).get("total_tokens") or 0
        echo(
            f"  turn group {group_id}: {sample.n} alternatives to {row.id} "
            f"in {sample.latency_ms / 1000:.1f} s"
        )

    await asyncio.gather(*(one(row, body) for row, body in planned))


async def _gather_trajectory_groups(
    db,
    s: JudgeSettings,
    report: PassReport,
    echo,
    skip: list[str],
    untrained: list[str],
    scope: KeyScope,
) -> None:
    ready = await db.query(
        lambda store: tables.scenario_candidates(store, s, skip, untrained, scope)
    )
    for c in ready:
        group_id = await db.query(
            lambda st, c=c: tables.add_trajectory_group(st, c.scenario_id, c.trajectories)
        )
        report.trajectory_groups += 1
        echo(
            f"  trajectory group {group_id}: {len(c.trajectories)} conversations of {c.scenario_id}"
        )


async def _score_groups(
    db,
    s: JudgeSettings,
    fns,
    report: PassReport,
    echo,
    rng,
    untrained: frozenset[str],
    key_budgets: tuple[KeyBudget, ...] = (),
    scope: KeyScope = EVERY_KEY,
) -> None:
    # The lineage's groups, its untrained keys' too: those are refused (failed) here.
    owned = KeyScope(scope.only, tuple(k for k in scope.never if k not in untrained))
    groups = await db.query(lambda store: tables.groups_to_score(store, 1000, owned))
    if not groups:
        return
    if not s.scorers:
        echo("no scorer configured ([judge] model or [judge.rewards]): feedback alone scores")
    gate = asyncio.Semaphore(s.concurrency)

    async def one(group: tables.Pending) -> None:
        async with gate:
            await score_group(
                db, s, fns, group.id, group.kind, report, echo, rng,
                untrained=untrained, key_budgets=key_budgets,
            )  # fmt: skip

    await asyncio.gather(*(one(g) for g in groups))


async def score_group(
    db,
    s: JudgeSettings,
    fns,
    group_id: str,
    kind: str,
    report: PassReport,
    echo,
    rng,
    *,
    untrained: frozenset[str] = frozenset(),
    key_budgets: tuple[KeyBudget, ...] = (),
) -> None:
    rows = await db.query(lambda store: tables.members_of(store, group_id))
    exchanges = [r.exchange_id for r in rows]
    owners = await db.query(lambda store: tables.owners(store, exchanges))
    keys = tenants.member_keys(owners)
    refused = tenants.refusal(keys, untrained)
    if refused is not None:  # no scorer, RULER's provider least of all, sees it
        report.failed += 1
        echo(f"  group {group_id}: not scored: {refused}")
        await db.query(
            lambda store: tables.save_scores(
                store, group_id, status="failed", reason=refused, judgements=[], scores=[]
            )
        )
        return
    rollouts = [from_row(r) for r in rows]
    by_member: dict[str, dict[str, tuple[float, str | None]]] = defaultdict(dict)
    failures: list[str] = []
    judgements = []
    started = time.perf_counter()

    if s.model:
        share = next((b for b in key_budgets if keys & set(b.keys)), None)
        ruled = await _ruler(db, s, rollouts, rng, report, share)
        if ruled is None:
            report.waiting_for_budget += 1
            return
        judgement, result = ruled
        judgements.append((judgement, result))
        if judgement.status == "failed":
            failures.append(f"{judgement.judge}: {judgement.error}")
        for member_id, scored in judgement.scores.items():
            by_member[member_id][judgement.judge] = scored
    await _functions_and_feedback(fns, rollouts, rows, by_member, failures)
    if not failures and not s.scorers and len(by_member) < len(rollouts):
        report.waiting += 1
        return
    scores = [
        (member, src, value, why)
        for member, sources in by_member.items()
        for src, (value, why) in sources.items()
    ]
    if failures:
        status, reason = "failed", "; ".join(failures)
        report.failed += 1
        echo(f"  group {group_id}: not scored: {reason}")
    else:
        status, reason = "scored", None
        combined = combine(s, by_member)
        if kind != "ab" and s.truncated_reward is not None:
            combined = cap_truncated(s.truncated_reward, combined, rollouts)
        scores += [(m, "combined", v, None) for m, v in combined.items()]
        report.scored += 1
        echo(
            f"  group {group_id} ({kind}, {len(rollouts)} members): rewards "
            + " ".join(f"{combined[r.member_id]:.2f}" for r in rollouts)
            + f" in {time.perf_counter() - started:.1f} s"
        )
    await db.query(
        lambda store: tables.save_scores(
            store, group_id, status=status, reason=reason, judgements=judgements, scores=scores
        )
    )


async def _functions_and_feedback(fns, rollouts, rows, by_member, failures: list[str]) -> None:
    """Beside RULER's: each reward function's score of each member (a function that fails
    is a failure of the group), and the feedback users posted on it, per metric."""
    for name, fn in fns.items():
        try:
            values = [await rewards.score(name, fn, r) for r in rollouts]
        except RewardFnFailed as exc:
            failures.append(str(exc))
            continue
        for r, value in zip(rollouts, values, strict=True):
            by_member[r.member_id][f"fn:{name}"] = (value, None)
    for row in rows:
        for posted in row.feedback or ():
            source = tables.feedback_source(posted["metric"])
            by_member[row.member_id][source] = (posted["value"], None)


async def _ruler(
    db, s: JudgeSettings, rollouts, rng, report: PassReport, share: KeyBudget | None = None
):
    """A judgement and what the cache should keep of it: from the cache when this judge has
    seen these answers under this rubric before (no call), else from the judge; None when
    a call is needed and today's budget, or the group's keys' `share` of it, is spent."""
    key = ruler.cache_key(s.model, s.rubric_for(rollouts[0].scenario), rollouts, s.ruler_orders)
    cached = await db.query(lambda store: tables.cached_result(store, key))
    if cached is not None:
        report.cache_hits += 1
        judgement = ruler.Judgement(f"ruler:{s.model}", key, status="cached")
        judgement.scores = ruler.from_cache(cached, rollouts)
        return judgement, None
    if share is not None and (await db.query(share.today)).spent_out:
        return None
    budget = await judge_budget(db, s)
    if budget is not None and budget.spent_out:
        return None
    judgement = await ruler.judge(s, rollouts, rng=rng)
    report.judge_calls += 1
    report.judge_ms.append(judgement.latency_ms)
    report.judge_tokens += judgement.prompt_tokens + judgement.completion_tokens
    report.judge_cost_usd += judgement.cost_usd or 0.0
    if judgement.status != "ok":
        return judgement, None
    return judgement, ruler.result_by_content(judgement, rollouts)


def combine(
    s: JudgeSettings, by_member: dict[str, dict[str, tuple[float, str | None]]]
) -> Mapping[str, float]:
    """Each member's reward: the weighted mean of the sources *every* member of the group
    has, each read on [0, 1].

    Only shared sources: in a turn group only the logged answer can carry feedback, and
    a reward that is mean(judge, feedback) for it but the judge alone for its rivals
    would make advantages partly measure "had feedback". A source some members lack
    stays in `scores`, out of the reward. One scale: RULER scores are in [0, 1]; a
    reward function's number and posted feedback (any float) are clipped into it, so no
    source outweighs the others by its units rather than its weight."""
    if not by_member:
        return {}
    shared = set.intersection(*(set(sources) for sources in by_member.values()))
    if not shared:
        return {}
    return {
        member: _weighted_mean(s, {k: v for k, (v, _) in sources.items() if k in shared})
        for member, sources in by_member.items()
    }


def cap_truncated(cap: float, combined: Mapping[str, float], rollouts) -> Mapping[str, float]:
    """A training group's answers cut at their token cap (`finish_reason: length`) reward at
    most `cap`. The release path stops a candidate whose answers are cut more often than
    live's (`deploy/decide/shape.py`), so a reward that pays for a rambling answer that holds
    the right words (partial credit) trains candidates the guard then refuses; DAPO's
    overlong shaping, at its simplest. Pairs (`ab` groups) keep the referee's word."""
    cut = {r.member_id for r in rollouts if r.finish_reason == "length"}
    return {m: min(v, cap) if m in cut else v for m, v in combined.items()}


def _weighted_mean(s: JudgeSettings, values: dict[str, float]) -> float:
    def weight(source: str) -> float:
        if source.startswith("ruler:"):
            return s.ruler_weight
        if source.startswith("fn:"):
            return s.rewards[source[3:]].weight
        metric = source.partition(":")[2]  # feedback:<metric>
        return s.feedback_weights.get(metric, s.feedback_weight)

    clipped = {src: min(max(v, 0.0), 1.0) for src, v in values.items()}
    total = sum(weight(src) for src in clipped)
    if total == 0:
        return sum(clipped.values()) / len(clipped)
    return sum(weight(src) * v for src, v in clipped.items()) / total
