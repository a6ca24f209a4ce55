"""The one verdict on a candidate, for both stages of its release: what the evidence so
far (the guards, the held-out slice, the paired test at its share of alpha) says, before it
serves anyone or as a canary. A pure function of the store and the settings: `release`
acts on it, the dashboard shows it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from ...proxy.tenants import Lineage, Tenants
from ..records import Routing
from ..settings import DeploySettings, LoopSettings
from . import answers, guards, pairs, prompts
from .evidence import Checks, Evidence, Forecast, RoutingSeen, Tally, Verdict


def lineage_of(settings: DeploySettings, name: str | None = None) -> Lineage:
    """The lineage named `name` (`alias` or `alias@tenant`; default: `loop.alias`)."""
    return Tenants.of(settings.proxy).named(name or settings.loop.alias)


def decide(
    store,
    settings: DeploySettings,
    candidate: str,
    live: str | None,
    routing: Routing | None = None,
    *,
    rounds: int = 0,
    capped: bool = True,
    now: datetime | None = None,
    lineage: Lineage | None = None,
) -> Verdict:
    """What the evidence so far says about `candidate`: before it serves anyone (no
    `routing`), or as `routing`'s canary after `rounds` looks. A guard that trips, or the
    test ruling out "better by margin + delta", sends it away; offline, a guard that holds
    does too (its own answers are off), and a passed test sends it on to the canary; as a
    canary, a passed test promotes once no guard holds, and the caps (`capped`; not while
    a person reviews it) end an open test. `lineage`: whose candidate it is (default: the
    routing's, else `loop.alias`'s shared one)."""
    loop = settings.loop
    if lineage is None:
        lineage = lineage_of(settings, routing.model_alias if routing is not None else None)
    alias = lineage.name
    every = pairs.every_test_id(alias, candidate, live, routing)
    tests = every[1:]  # the release test's: the slice's is its own (`pairs.held_out`)
    checks = guards.on_candidate(store, candidate, every, loop, pairs.judges(settings))
    if routing is not None:
        checks = guards.on_traffic(store, lineage, routing.ts, loop) + checks
    weighed = pairs.weigh(store, alias, candidate, tests, loop)
    held = pairs.held_out(store, candidate, live, loop)
    rule, paired, alpha = weighed.rule, weighed.paired, weighed.level.alpha
    evidence = _evidence(weighed, held, checks, tests, live, routing)
    evidence.forecast = forecast = _forecast(store, settings, lineage, candidate, live, every,
                                             routing, paired.pairs)  # fmt: skip
    if tripped := next((g.tripped for g in checks if g.tripped), None):
        return Verdict("rollback", f"{candidate}: {tripped}", evidence)
    if held.worse:
        why = "worse than live on the held-out slice (scenarios never trained on): "
        return Verdict("rollback", f"{candidate}: {why}{held.summary()}", evidence)
    holding = next((g.holding for g in checks if g.holding), None)
    if routing is None:
        if holding:
            return Verdict("rollback", f"{candidate}: {holding}", evidence)
        # Offline the test may stop on its first pairs (a candidate this bad should not
        # serve anyone); it passes only with `min_pairs`, as a promotion would need.
        decision, why = replace(rule, min_pairs=1).decide(paired, alpha)
        if decision == "promote" and paired.pairs < rule.min_pairs:
            decision = "wait"
        if not paired.pairs:
            why = "no pairs yet (no logged prompt it may be tested on)"
        if decision == "wait":
            why += f"; {forecast.summary()}"
        return Verdict(decision, f"{'passed: ' if decision == 'promote' else ''}{why}", evidence)
    decision, why = weighed.decide()
    if decision == "wait":
        why += f"; {forecast.summary()}"
    if decision == "rollback":
        return Verdict("rollback", f"canary {candidate} {why}", evidence)
    if decision == "promote" and not holding:
        return Verdict("promote", f"canary {candidate} {why}", evidence)
    waiting = f"canary {candidate} won the pairs, but {holding}" if decision == "promote" else why
    if capped and (over := _over_cap(loop, routing, rounds, now)):
        return Verdict("rollback", f"canary {candidate} {over}: {waiting}", evidence)
    return Verdict("wait", waiting, evidence)


def _forecast(
    store,
    settings: DeploySettings,
    lineage: Lineage,
    candidate: str,
    live: str | None,
    every: list[str],
    routing: Routing | None,
    pairs_so_far: int,
) -> Forecast:
    """What the test expects to cost from here, and the strata of the day's traffic the
    pairs it still expects (all of `max_pairs` before the referee's noise is measured)
    would use up."""
    alias = lineage.name
    said = answers.forecast(store, alias, candidate, every, settings, pairs=pairs_so_far)
    expected = said.pairs_expected if said.pairs_expected is not None else said.max_pairs
    more = min(expected, said.max_pairs) - pairs_so_far
    since = prompts.window_start(store, candidate) or (routing.ts if routing else None)
    if since is not None and more > 0:
        said.short = prompts.shortfalls(
            store, lineage, since, more, chain=[live, candidate], tests=every
        )
    return said


def _over_cap(loop: LoopSettings, routing: Routing, rounds: int, now: datetime | None) -> str:
    """Why an open canary must end now ("" while it may go on)."""
    if rounds >= loop.canary_max_rounds:
        return f"undecided after {rounds} rounds (loop.canary_max_rounds)"
    elapsed = ((now or datetime.now(UTC)) - routing.ts).total_seconds()
    if elapsed >= loop.canary_max_s:
        return f"undecided after {elapsed / 3600:.1f} h (loop.canary_max_s)"
    return ""


def _evidence(
    weighed: pairs.Weighed,
    held: pairs.HeldOut,
    checks: list[guards.Guard],
    tests: list[str],
    live: str | None,
    routing: Routing | None,
) -> Evidence:
    """What the dashboard, `onjob status` and the deployments log show of a verdict."""
    found = {g.name: g.found for g in checks}
    evidence = Evidence(
        live=live,
        tests=tests,
        paired=Tally.of(weighed.paired.tally),
        unjudged_pairs=len(weighed.missing),
        e_process=weighed.evidence(),
        shape=Checks(
            pairs=found["pairs"],
            kl=found["kl"],
            judges=found["judges"],
            traffic=found.get("traffic"),
        ),
        held_out=held.evidence(),
    )
    if routing is not None:
        evidence.routing = RoutingSeen(
            live=live, canary=routing.canary, since=routing.ts.isoformat()
        )
        evidence.test = tests[-1]
        evidence.guards = found["service"]
    return evidence
