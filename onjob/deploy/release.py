"""From trained to live: a candidate's way, top to bottom.

    trained        a train run recorded the candidate (`loop`), or a crash left one
                   undecided (`orphans`)
    offline test   it and live answer logged prompts it cannot have trained on, at the
                   engine's speed (`prompts`): the held-out slice's (its own test: is it
                   worse where nobody trained? `pairs.held_out`), then rounds of the last
                   day's traffic in its mix of kinds and hours (the release test); the
                   referee judges each pair (`pairs`); the guards on the candidate
                   (`guards`), the slice and the release test (`stats.Rule`, at its share
                   of alpha, `ledger`) stop it here, or send it on with the test passed
                   or still open
    canary         a share of real traffic, for what only it shows: errors, latency, the
                   answers' shape, users' feedback; the pairs continue the release test
                   while it is open, from live-arm prompts; capped in rounds and in wall
                   time
    decision       promoted (`trust.release_mode` automatic), ready for review (judged by
                   its coach alone: a person decides, `reviews`), or rolled back, each with
                   its reason in the `deployments` log

`decide` (`decide/verdict.py`) is the one verdict, for both stages. Every step reads its
state from DuckDB, so one killed anywhere is picked up by the next iteration without
repeating a pair.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx
import msgspec

from ..collector import Collector
from ..judge import rewards, sampling
from ..judge.tables import LoggedTurn
from ..proxy.tenants import Lineage
from .act import deployments, reviews
from .act.operator import Operator
from .decide import answers, fit, ledger, pairs, prompts, trust
from .decide.verdict import Verdict, decide, lineage_of
from .records import Routing
from .settings import DeploySettings


@dataclass
class Release:
    """What the pipeline works with: the database, the engine, the routing, the settings,
    and the lineage whose candidates it decides (default: `loop.alias`'s shared one)."""

    db: Collector
    engine: httpx.AsyncClient
    operator: Operator
    settings: DeploySettings
    echo: Callable[[str], None]
    lineage: Lineage = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.lineage is None:
            self.lineage = lineage_of(self.settings)

    @property
    def alias(self) -> str:
        """The lineage's name: its key in the routing, the ledger and the decisions."""
        return self.lineage.name

    @property
    def default_live(self) -> str | None:
        """Its live checkpoint before any decision: the alias's configured one."""
        return self.settings.proxy.aliases.get(self.lineage.alias)


async def trained(r: Release, *, live: str | None, candidate: str, trained_on: int) -> None:
    """A recorded candidate: its offline test, then its canary, or stopped with the reason."""
    verdict = await offline_test(r, live=live, candidate=candidate)
    await r.db.query(lambda st: ledger.record(st, r.alias, candidate, "offline", verdict))
    r.echo(f"offline test of {candidate} against {live or 'base'}: {verdict.reason}")
    if verdict.decision == "rollback":
        await r.db.query(lambda st: ledger.settle(st, r.alias, candidate, "stopped"))
        await r.db.query(
            lambda st: deployments.reject(
                st,
                r.alias,
                candidate,
                default_live=r.default_live,
                reason=f"stopped before canary: {verdict.reason}",
                actor="loop",
                evidence=verdict.evidence,
            )
        )
        await r.operator.unload(candidate)
        return
    recent = await r.db.query(lambda st: fit.recent_conversations(st, r.lineage.scope))
    fraction = fit.canary_fraction(r.settings, recent)  # at its own keys' pace
    row = await r.operator.set_canary(
        r.alias,
        candidate,
        fraction,
        reason=f"trained on {trained_on} groups; offline test: {verdict.reason}",
        actor="loop",
        evidence=verdict.evidence,
    )
    r.echo(f"canary: {row.canary} serves {row.fraction:.0%} of {r.alias}")


async def offline_test(r: Release, *, live: str | None, candidate: str) -> Verdict:
    """The candidate against live before it serves anyone: the held-out slice's pairs (its
    own test), then rounds of the release test's prompts (`prompts.fresh`), back to back
    until the test decides or a round runs short. With no referee, nothing is sampled:
    the guards alone speak."""
    loop, s = r.settings.loop, pairs.referee(r.settings.judge, r.settings.loop.gate)
    await r.db.query(lambda st: ledger.enter(st, r.alias, candidate))  # fixes its alpha_k
    drawn_by = pairs.every_test_id(r.alias, candidate, live)
    slice_test, tests = drawn_by[0], drawn_by[1:]
    if s.scorers:
        fns = rewards.load(s.rewards)
        await pairs.rejudge(r.db, s, fns, drawn_by, loop.rejudge_attempts)
        await r.operator.load(candidate)
        arms = await _arms(r, live, candidate)
        chain = [live, candidate]

        def held_prompts(st):
            scenarios = fit.held_out(st, r.settings)
            n = max(0, loop.holdout_pairs - prompts.pairs_made(st, [slice_test]))
            return prompts.held_out(st, r.lineage, scenarios, n, chain=chain, tests=drawn_by)

        chosen = await r.db.query(held_prompts)
        sized = await _sized(r, s, candidate, drawn_by)
        # Progress, round by round: on a CPU a round of pairs takes minutes.
        said = f"offline test of {candidate} against {live or 'base'}"
        r.echo(f"{said}: {len(chosen)} pairs on held-out prompts")
        await pairs.paired_round(
            r.db, r.engine, sized, fns, chosen, arms, test=slice_test, echo=r.echo
        )
        since = await r.db.query(lambda st: prompts.window_start(st, candidate))
        first = True
        while since is not None:
            # A pair the referee failed on is judged again before the test reads past it.
            await pairs.rejudge(r.db, s, fns, drawn_by, loop.rejudge_attempts)
            verdict = await r.db.query(
                lambda st: decide(st, r.settings, candidate, live, lineage=r.lineage)
            )
            if verdict.decision != "wait":
                return verdict
            r.echo(f"{said}: {verdict.reason}")
            if first and verdict.evidence.forecast is not None:
                # Said before the release test draws its first prompt.
                for short in verdict.evidence.forecast.short:
                    r.echo(f"  the test of {candidate} {short}")
            first = False
            chosen = await _fresh_round(r, since, chain, drawn_by)
            if not chosen:
                break  # on to the canary, its test open: its pairs go on from live's traffic
            sized = await _sized(r, s, candidate, drawn_by)
            r.echo(f"{said}: {len(chosen)} more pairs on live traffic it was not trained on")
            await pairs.paired_round(
                r.db, r.engine, sized, fns, chosen, arms, test=tests[0], echo=r.echo
            )
    return await r.db.query(lambda st: decide(st, r.settings, candidate, live, lineage=r.lineage))


async def canary_round(r: Release, routing: Routing) -> None:
    """One look at the alias's canary: more pairs while its test is open, then the verdict
    acted on (promote, ready for review, roll back, or wait)."""
    live, candidate = routing.live, routing.canary
    s = pairs.referee(r.settings.judge, r.settings.loop.gate)
    review = await r.db.query(lambda st: reviews.of(st, r.alias, routing))
    rounds = await r.db.query(lambda st: ledger.count_round(st, r.alias, candidate, routing.ts))
    if review is None:
        if not s.scorers:
            r.echo(
                f"canary {candidate}: no scorer to compare with (set loop.gate, judge.model or "
                "[judge.rewards]); promote or roll back by hand"
            )
            return
        await _more_pairs(r, routing, s)
    verdict = await r.db.query(
        lambda st: decide(
            st,
            r.settings,
            candidate,
            live,
            routing,
            rounds=rounds,
            capped=review is None,
            lineage=r.lineage,
        )
    )
    mode = await r.db.query(lambda st: trust.release_mode(st, r.settings, candidate))
    verdict.evidence.referee, verdict.evidence.release_mode = s.scorers, mode
    await r.db.query(lambda st: ledger.record(st, r.alias, candidate, "canary", verdict))
    against = f"canary {candidate} against {live or 'base'}"
    # Under review, only a rollback (a guard tripped since) or a promotion that has become
    # the loop's own ends the wait: users' feedback now checks the coach. A referee set
    # since does not: the pairs were judged by the coach, not by it.
    promotes = verdict.decision == "promote" and mode.mode == "users"
    if review is not None and verdict.decision != "rollback" and not promotes:
        r.echo(f"{against}: ready for review since {review.ts}: {review.reason}")
        return
    if verdict.decision == "promote" and not mode.automatic:
        reason = f"{verdict.reason}; judged by its coach alone, so a person decides"
        await r.db.query(
            lambda st: reviews.mark(st, r.alias, routing, reason=reason, evidence=verdict.evidence)
        )
        r.echo(f"{against}: ready for review: {reason} ({mode.reason})")
        return
    r.echo(f"{against}: {verdict.decision}: {verdict.reason}")
    if verdict.decision == "wait":
        return
    act = r.operator.promote if verdict.decision == "promote" else r.operator.rollback
    try:
        row = await act(
            r.alias,
            reason=verdict.reason,
            actor="loop",
            evidence=verdict.evidence,
            expected=routing,
        )
    except deployments.RoutingChanged as exc:
        r.echo(f"canary {candidate}: {exc}")
        return
    outcome = "promoted" if verdict.decision == "promote" else "rolled_back"
    await r.db.query(lambda st: ledger.settle(st, r.alias, candidate, outcome))
    for warning in row.warnings:
        r.echo(f"warning: {warning}")


async def orphans(r: Release, routing: Routing | None) -> None:
    """Decide or retire the candidates the loop recorded and never decided (the iteration
    that trained them stopped before their canary): the newest whose parent is still live
    resumes at its offline test; any other was trained from a live that has since changed,
    or is superseded by a newer one, and is retired with the reason."""
    live = routing.live if routing else r.default_live
    found = await r.db.query(lambda st: st.rows(Orphan, ORPHANS, [r.settings.loop.alias, r.alias]))
    chosen = found[0] if found and found[0].parent == live else None
    for i, row in enumerate(found):
        if row is chosen:
            continue
        name = row.name
        why = (
            "a newer candidate supersedes it"
            if i
            else f"its parent {row.parent or 'base'} is no longer live"
        )
        reason = f"orphaned candidate {name} retired: recorded but never decided, and {why}"
        await r.db.query(lambda st, name=name, reason=reason: _retire(st, r, name, reason))
        await r.operator.unload(name)
        r.echo(f"orphaned candidate {name} retired: {why}")
    if chosen is not None:
        r.echo(f"orphaned candidate {chosen.name}: recorded but never decided; deciding it now")
        await trained(r, live=live, candidate=chosen.name, trained_on=chosen.trained_on)


# Candidates the loop trained (a train run) for one lineage that nothing routes to and
# nothing decided. A run recorded before lineages is the loop alias's shared lineage's.
class Orphan(msgspec.Struct, frozen=True, kw_only=True):
    """A candidate the loop recorded and never decided (`ORPHANS`): its parent, and how
    many groups its run trained on."""

    name: str
    parent: str | None
    trained_on: int | None


ORPHANS = """
SELECT c.name, c.parent, len(t.groups_used) AS trained_on
FROM checkpoints c JOIN train_runs t ON t.id = c.train_run
WHERE c.status = 'candidate' AND json_extract_string(t.config, '$.started_by') = 'loop'
  AND coalesce(json_extract_string(t.config, '$.lineage'), ?) = ?
ORDER BY c.created DESC, c.name
"""


def _retire(store, r: Release, name: str, reason: str) -> None:
    if ledger.entered(store, r.alias, name):  # tested, so its outcome counts (back-off)
        ledger.settle(store, r.alias, name, "stopped")
    deployments.reject(
        store,
        r.alias,
        name,
        default_live=r.default_live,
        reason=reason,
        actor="loop",
    )


async def _more_pairs(r: Release, routing: Routing, s) -> None:
    """The canary's round of pairs, while its test is open: live-arm prompts of the last
    day it cannot have trained on (since the canary started, for an adapter added by
    hand: nothing says what it saw)."""
    live, candidate = routing.live, routing.canary
    drawn_by = pairs.every_test_id(r.alias, candidate, live, routing)
    tests = drawn_by[1:]
    loop = r.settings.loop

    def still_open(st) -> bool:
        return pairs.weigh(st, r.alias, candidate, tests, loop).decide()[0] == "wait"

    fns = rewards.load(s.rewards)
    await pairs.rejudge(r.db, s, fns, drawn_by, loop.rejudge_attempts)
    if not await r.db.query(still_open):
        return
    since = await r.db.query(lambda st: prompts.window_start(st, candidate)) or routing.ts
    chosen = await _fresh_round(r, since, [live, candidate], drawn_by)
    arms = await _arms(r, live, candidate)
    sized = await _sized(r, s, candidate, drawn_by)
    await pairs.paired_round(r.db, r.engine, sized, fns, chosen, arms, test=tests[-1])


async def _sized(r: Release, s, candidate: str, tests: list[str]):
    """The referee's settings for the candidate's next pairs: each arm answering as many
    times as the referee's noise so far asks (`answers.sizing`; `loop.gate.samples` when
    set), both arms on one seed."""
    k = await r.db.query(
        lambda st: answers.sizing(st, r.alias, candidate, tests, r.settings).answers
    )
    return s.model_copy(update={"group_size": k})


async def _fresh_round(r: Release, since, chain: list, tests: list[str]) -> list[LoggedTurn]:
    """A round's prompts of the lineage's keys logged on the live arm after `since`, none
    the test drew yet, in the mix of a day's traffic (`prompts.fresh`)."""
    draw = await r.db.query(
        lambda st: prompts.fresh(
            st, r.lineage, since, r.settings.loop.pairs_per_round, chain=chain, tests=tests
        )
    )
    if draw.short is not None:
        r.echo(f"  the test waits for more {draw.short}: none left to draw")
    return draw.prompts


async def _arms(
    r: Release, live: str | None, candidate: str
) -> Mapping[str, tuple[str, str | None]]:
    """Each arm of the test by its name (`a` live, `b` the candidate): the engine's model
    id it samples and the checkpoint it stands for (None: the base model)."""
    base = await sampling.base_model(r.engine)
    return {"a": (live or base, live), "b": (candidate, candidate)}
