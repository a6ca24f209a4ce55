"""The loop: re-sample and judge, train, put the checkpoint behind a canary, compare, decide.

One iteration (`run_once`):

    orphans (no canary):          a candidate recorded by an earlier iteration that
                                  stopped before deciding it: the newest whose parent
                                  is still live goes on to its held-out check, the
                                  others are retired
    if the alias has a canary:    the referee retries pairs left unscored, a paired
                                  round (logged prompts on live and canary, judged
                                  together), then the verdict: promote, roll back, or
                                  keep collecting. A promotion is the loop's only where
                                  `trust.release_mode` is automatic (a referee other
                                  than the coach, or users' feedback checking the
                                  coach); otherwise the canary is *ready for review*
                                  (`reviews`): no more pairs, guards still watched, a
                                  person promotes or rolls back
    judge pass                    turn and trajectory groups, scored (skipped during a
                                  comparison once the next run has its groups; none from
                                  the held-out slice)
    no canary, enough new groups: train (child process, held-out scenarios excluded)
                                  -> candidate -> compared with live on the held-out
                                  slice (`holdout`) -> canary, or stopped there

Every stage reads its state from DuckDB (groups not trained on, the latest
deployment, pairs already judged), so an iteration killed anywhere, even mid-train,
is picked up by the next one without duplicates. `onjob serve` runs it every
`loop.interval_s` (`PeriodicLoop`); `onjob loop [--once]` runs it on a database no
server holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx

from ..collector import Collector
from ..judge import JudgeError, rewards, run_pass, sampling
from ..proxy import Router
from ..trainer import snapshot
from . import canary, deployments, holdout, ledger, reviews, training, trust
from .judging import engine_client
from .operator import Operator
from .settings import DeploySettings

log = logging.getLogger("onjob.loop")


@dataclass
class LoopState:
    """What the loop is doing now and the wall time it has spent per stage (the admin
    status and the demo's progress show it)."""

    stage: str = "idle"
    paused: bool = False
    since: float = field(default_factory=time.time)
    iterations: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    budget: dict[str, dict] = field(default_factory=dict)  # stage -> its daily budget, if set

    @contextlib.contextmanager
    def doing(self, stage: str):
        self.stage, self.since = stage, time.time()
        try:
            yield
        finally:
            self.seconds[stage] += time.time() - self.since
            self.stage, self.since = "idle", time.time()

    def as_dict(self) -> dict:
        return {
            "stage": self.stage,
            "paused": self.paused,
            "since": self.since,
            "iterations": self.iterations,
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
            "budget": self.budget,
        }


async def run_once(
    db: Collector,
    engine: httpx.AsyncClient,
    operator: Operator,
    settings: DeploySettings,
    echo,
    state: LoopState | None = None,
) -> None:
    state = state or LoopState()
    state.iterations += 1
    loop, alias = settings.loop, settings.loop.alias
    routing = (await db.query(deployments.current)).get(alias)
    if loop.train and not (routing and routing["canary"]):
        with state.doing("holdout"):
            await _orphans(db, engine, operator, settings, routing, echo)
        routing = (await db.query(deployments.current)).get(alias)
    if loop.train and routing and routing["canary"]:
        # The open comparison before the judge pass (which can take minutes on a CPU):
        # the decision comes as soon as the pairs allow.
        with state.doing("compare"):
            await _canary_round(db, engine, operator, settings, routing, echo)
        routing = (await db.query(deployments.current)).get(alias)
    live = routing["live"] if routing else settings.proxy.aliases.get(alias)
    comparing = loop.train and routing is not None and routing["canary"] is not None
    held = await db.query(lambda st: holdout.held_out(st, loop.holdout_share))

    def trainable(st) -> int:
        return snapshot.trainable(
            st,
            settings.trainer,
            live=live,
            held_out=held,
            untrained_keys=settings.proxy.untrained_keys,
        )

    if comparing:
        # While a comparison needs the engine, sample no more than the next run will use.
        ready = await db.query(trainable)
        if ready >= loop.min_new_groups:
            echo(f"judge pass skipped while comparing: {ready} groups wait for the next run")
            return
    with state.doing("judge"):
        # Held-out scenarios are never trained on: re-sampling them would spend for nothing.
        report = await run_pass(
            db,
            engine,
            settings.judge,
            echo=echo,
            skip_scenarios=held,
            untrained_keys=settings.proxy.untrained_keys,
            engine_logprobs=settings.proxy.engine_logprobs,
        )
    echo(f"judge pass: {report.summary()}")
    if report.budget is not None:
        state.budget["judge"] = report.budget.as_dict()
    if not loop.train or comparing:
        return
    budget = await training.budget(db, settings)
    if budget is not None:
        state.budget["train"] = budget.as_dict()
        if budget.spent_out:
            echo(f"train: {budget.status()}; the groups wait")
            return
    ready = await db.query(trainable)
    if ready < loop.min_new_groups:
        echo(f"train: {ready} new trainable groups, waiting for {loop.min_new_groups}")
        return
    # Each candidate spends a share of alpha: a daily budget and a back-off after failures.
    if why := await db.query(lambda st: ledger.waits(st, alias, loop)):
        echo(f"train: {why}")
        return
    with state.doing("train"):
        manifest = await training.train(
            db,
            settings,
            parent=live,
            held_out=held,
            engine_sampler=await training.sampler(engine),
            started_by="loop",
            echo=echo,
        )
    if manifest is None:
        return
    with state.doing("holdout"):
        await _release(
            db,
            engine,
            operator,
            settings,
            live=live,
            candidate=manifest["name"],
            metrics=manifest["metrics"],
            trained_on=len(manifest["groups"]),
            held=held,
            echo=echo,
        )


async def _release(
    db,
    engine,
    operator,
    settings: DeploySettings,
    *,
    live,
    candidate,
    metrics,
    trained_on,
    held,
    echo,
) -> None:
    """A recorded candidate's way to its canary: the held-out check against live, then
    behind a canary, or retired with the reason."""
    alias = settings.loop.alias
    checked = await holdout.compare(
        db, engine, operator, settings, live=live, candidate=candidate, held=held
    )
    echo(f"held-out check of {candidate} against {live or 'base'}: {checked.reason}")
    evidence = {**metrics, "holdout": checked.evidence}
    if not checked.passed:
        await db.query(lambda st: ledger.settle(st, alias, candidate, "stopped"))
        await db.query(
            lambda st: deployments.reject(
                st,
                alias,
                candidate,
                default_live=settings.proxy.aliases.get(alias),
                reason=f"stopped before canary: {checked.reason}",
                actor="loop",
                evidence=evidence,
            )
        )
        await operator.unload(candidate)
        return
    row = await operator.set_canary(
        alias,
        candidate,
        settings.loop.canary_fraction,
        reason=f"trained on {trained_on} groups; held-out: {checked.reason}",
        actor="loop",
        evidence=evidence,
    )
    echo(f"canary: {row['canary']} serves {row['fraction']:.0%} of {alias}")


# Candidates the loop trained (a train run) that nothing routes to and nothing decided:
# the iteration that recorded them stopped (crash, kill, pause) before `set_canary`.
ORPHANS = """
SELECT c.name, c.parent, t.metrics, len(t.groups_used) AS trained_on
FROM checkpoints c JOIN train_runs t ON t.id = c.train_run
WHERE c.status = 'candidate' AND json_extract_string(t.config, '$.started_by') = 'loop'
ORDER BY c.created DESC, c.name
"""


async def _orphans(db, engine, operator, settings: DeploySettings, routing, echo) -> None:
    """Decide or retire the orphaned candidates (the alias has no canary): the newest
    whose parent is still live resumes at its held-out check; any other was trained
    from a live that has since changed, or is superseded by a newer one, and is
    retired with the reason, in the `deployments` log like any decision."""
    alias = settings.loop.alias
    default = settings.proxy.aliases.get(alias)
    live = routing["live"] if routing else default
    orphans = await db.query(lambda st: st.query(ORPHANS))
    chosen = orphans[0] if orphans and orphans[0]["parent"] == live else None
    for i, row in enumerate(orphans):
        if row is chosen:
            continue
        name = row["name"]
        why = (
            "a newer candidate supersedes it"
            if i
            else f"its parent {row['parent'] or 'base'} is no longer live"
        )
        await db.query(
            lambda st, name=name, why=why: deployments.reject(
                st,
                alias,
                name,
                default_live=default,
                reason=f"orphaned candidate {name} retired: recorded but never decided, and {why}",
                actor="loop",
            )
        )
        await operator.unload(name)
        echo(f"orphaned candidate {name} retired: {why}")
    if chosen is None:
        return
    echo(f"orphaned candidate {chosen['name']}: recorded but never decided; deciding it now")
    held = await db.query(lambda st: holdout.held_out(st, settings.loop.holdout_share))
    metrics = chosen["metrics"]
    metrics = json.loads(metrics) if isinstance(metrics, str) else (metrics or {})
    await _release(
        db,
        engine,
        operator,
        settings,
        live=live,
        candidate=chosen["name"],
        metrics=metrics,
        trained_on=chosen["trained_on"],
        held=held,
        echo=echo,
    )


async def _canary_round(db, engine, operator, settings: DeploySettings, routing, echo) -> None:
    alias, live, candidate = routing["model_alias"], routing["live"], routing["canary"]
    s = canary.referee(settings.judge, settings.loop.gate)
    review = await db.query(lambda st: reviews.of(st, alias, routing))
    if review is None:
        if not s.scorers:
            echo(
                f"canary {candidate}: no scorer to compare with (set loop.gate, judge.model or "
                "[judge.rewards]); promote or roll back by hand"
            )
            return
        fns = rewards.load(s.rewards)
        test = canary.test_id(alias, routing)
        await canary.rejudge(db, s, fns, test, echo=lambda _: None)
        base = await sampling.base_model(engine)
        prompts = await db.query(
            lambda st: canary.canary_prompts(
                st, alias, routing, settings.loop.pairs_per_round, settings.proxy.untrained_keys
            )
        )
        models = {"a": (live or base, live), "b": (candidate, candidate)}
        await canary.paired_round(
            db, engine, s, fns, prompts, models, test=test, echo=lambda _: None
        )
    judges = canary.judges(settings)
    await db.query(lambda st: ledger.enter(st, alias, candidate))  # a canary set by hand too
    verdict = await db.query(lambda st: canary.verdict(st, alias, routing, settings.loop, judges))
    verdict.evidence["referee"] = s.scorers
    mode = await db.query(lambda st: trust.release_mode(st, settings))
    verdict.evidence["release_mode"] = mode.as_dict()
    against = f"canary {candidate} against {live or 'base'}"
    # Under review, only a rollback (a guard tripped since) or a promotion that has become
    # the loop's own ends the wait: users' feedback now checks the coach. A referee set
    # since does not: the pairs were judged by the coach, not by it.
    promotes = verdict.decision == "promote" and mode.mode == "users"
    if review is not None and verdict.decision != "rollback" and not promotes:
        echo(f"{against}: ready for review since {review['ts']}: {review['reason']}")
        return
    if verdict.decision == "promote" and not mode.automatic:
        reason = f"{verdict.reason}; judged by its coach alone, so a person decides"
        await db.query(
            lambda st: reviews.mark(st, alias, routing, reason=reason, evidence=verdict.evidence)
        )
        echo(f"{against}: ready for review: {reason} ({mode.reason})")
        return
    echo(f"{against}: {verdict.decision}: {verdict.reason}")
    if verdict.decision == "wait":
        return
    act = operator.promote if verdict.decision == "promote" else operator.rollback
    try:
        row = await act(
            alias, reason=verdict.reason, actor="loop", evidence=verdict.evidence, expected=routing
        )
    except deployments.RoutingChanged as exc:
        echo(f"canary {candidate}: {exc}")
        return
    outcome = "promoted" if verdict.decision == "promote" else "rolled_back"
    await db.query(lambda st: ledger.settle(st, alias, candidate, outcome))
    for warning in row["warnings"]:
        echo(f"warning: {warning}")


class PeriodicLoop:
    """`onjob serve`'s background loop: an iteration every `loop.interval_s`, one at a time;
    one that fails is logged and the next tries again."""

    def __init__(self, collector: Collector, operator: Operator, settings: DeploySettings):
        self.collector = collector
        self.operator = operator
        self.settings = settings
        self.state = LoopState()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self.settings.loop.interval_s > 0:
            self._task = asyncio.create_task(self._run(), name="onjob-loop")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def pause(self) -> None:
        """No more iterations until `resume`; one in flight is cancelled (a training child
        killed), which the next iteration picks up from the tables as after a crash."""
        self.state.paused = True
        await self.stop()
        self.state.stage = "idle"
        await self.operator.resync()  # a routing change the cancel cut short, applied

    async def resume(self) -> None:
        self.state.paused = False
        if self._task is None:
            await self.start()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.loop.interval_s)
            try:
                await run_once(
                    self.collector,
                    self.operator.engine,
                    self.operator,
                    self.settings,
                    log.info,
                    self.state,
                )
            except (JudgeError, deployments.DeployError, RuntimeError) as exc:
                log.error("loop iteration stopped: %s", exc)
            except Exception:
                log.exception("loop iteration failed; the next one tries again")


async def run(settings: DeploySettings, *, once: bool, echo) -> None:
    """`onjob loop`: iterations on a database no server holds."""
    db = Collector(settings.collector)
    await db.start()
    try:
        async with engine_client(settings) as engine:
            router = Router(settings.proxy.aliases, upstream=None)
            operator = Operator(db, router, engine, settings.proxy.aliases)
            await operator.restore()
            while True:
                await run_once(db, engine, operator, settings, echo)
                if once or settings.loop.interval_s <= 0:
                    return
                await asyncio.sleep(settings.loop.interval_s)
    finally:
        await db.close()
