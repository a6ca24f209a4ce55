"""The loop: re-sample and judge, train, and hand each candidate to the release pipeline.

One iteration (`run_once`):

    orphans (no canary)      candidates an earlier iteration recorded and never decided
                             (`release.orphans`)
    a canary                 one round of it (`release.canary_round`): pairs while its
                             test is open, then promote, ready for review, roll back or wait
    judge pass               turn and trajectory groups, scored (skipped during a canary
                             once the next run has its groups; none from the held-out slice)
    no canary, enough new    train (child process, held-out scenarios excluded) -> the
    groups                   candidate's offline test -> its canary, or stopped there
                             (`release.trained`)

Every stage reads its state from DuckDB (groups not trained on, the latest deployment,
pairs already judged), so an iteration killed anywhere, even mid-train, is picked up by
the next one without duplicates. `onjob serve` runs it every `loop.interval_s`
(`PeriodicLoop`); `onjob loop [--once]` runs it on a database no server holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx

from ..collector import Collector
from ..judge import JudgeError, run_pass
from ..proxy import Router
from ..trainer import snapshot
from . import deployments, fit, holdout, ledger, release, training
from .errors import DeployError
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
    fitted: fit.Fitted | None = None  # the settings fitted to the traffic, this iteration

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
            "fitted": self.fitted.as_dict() if self.fitted else None,
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
    fitted = await db.query(lambda st: fit.current(st, settings))
    if state.fitted is None or _said(state.fitted) != _said(fitted):
        echo(f"fitted to the traffic: {fitted.line()}")
    state.fitted = fitted
    routing = (await db.query(deployments.current)).get(alias)
    pipeline = release.Release(db, engine, operator, settings, echo)
    if loop.train and not (routing and routing.canary):
        with state.doing("offline test"):
            await release.orphans(pipeline, routing)
        routing = (await db.query(deployments.current)).get(alias)
    if loop.train and routing and routing.canary:
        # The open comparison before the judge pass (which can take minutes on a CPU):
        # the decision comes as soon as the pairs allow.
        with state.doing("compare"):
            await release.canary_round(pipeline, routing)
        routing = (await db.query(deployments.current)).get(alias)
    live = routing.live if routing else settings.proxy.aliases.get(alias)
    comparing = loop.train and routing is not None and routing.canary is not None
    held = await db.query(lambda st: holdout.held_out(st, fitted.holdout_share))

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
        if ready >= fitted.min_new_groups:
            echo(f"judge pass skipped while comparing: {ready} groups wait for the next run")
            return
    await _judge_pass(db, engine, settings, held, echo, state)
    if loop.train and not comparing and await _may_train(db, settings, trainable, echo, state):
        await _train_and_release(pipeline, live, held, state)


async def _judge_pass(db, engine, settings: DeploySettings, held, echo, state) -> None:
    with state.doing("judge"):
        # Held-out scenarios are never trained on: re-sampling them would spend for nothing.
        report = await run_pass(
            db,
            engine,
            fit.judge_settings(settings, state.fitted),
            echo=echo,
            skip_scenarios=held,
            untrained_keys=settings.proxy.untrained_keys,
            engine_logprobs=settings.proxy.engine_logprobs,
        )
    echo(f"judge pass: {report.summary()}")
    if report.budget is not None:
        state.budget["judge"] = report.budget.as_dict()


async def _may_train(db, settings: DeploySettings, trainable, echo, state) -> bool:
    """Whether a run may start now: the trainer's daily budget, enough new groups, and the
    alias's candidate budget and back-off (each candidate spends a share of alpha)."""
    loop = settings.loop
    budget = await training.budget(db, settings)
    if budget is not None:
        state.budget["train"] = budget.as_dict()
        if budget.spent_out:
            echo(f"train: {budget.status()}; the groups wait")
            return False
    ready, wanted = await db.query(trainable), state.fitted.min_new_groups
    if ready < wanted:
        echo(f"train: {ready} new trainable groups, waiting for {wanted}")
        return False
    if why := await db.query(lambda st: ledger.waits(st, loop.alias, loop)):
        echo(f"train: {why}")
        return False
    return True


def _said(f: fit.Fitted) -> tuple:
    """What a change of is logged: the values, not the traffic they came from."""
    return f.holdout_share, f.min_new_groups, f.canary_fraction, f.settle_s


async def _train_and_release(pipeline: release.Release, live, held, state) -> None:
    with state.doing("train"):
        manifest = await training.train(
            pipeline.db,
            pipeline.settings,
            parent=live,
            held_out=held,
            engine_sampler=await training.sampler(pipeline.engine),
            started_by="loop",
            engine=pipeline.engine,
            echo=pipeline.echo,
        )
    if manifest is None:
        return
    with state.doing("offline test"):
        await release.trained(
            pipeline, live=live, candidate=manifest.name, trained_on=len(manifest.groups)
        )


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
            self.state.fitted = await self.collector.query(
                lambda st: fit.current(st, self.settings)
            )
            log.info("fitted to the traffic: %s", self.state.fitted.line())
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
            except (JudgeError, DeployError) as exc:
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
