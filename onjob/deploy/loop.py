"""The loop: re-sample and judge, train, and hand each candidate to the release pipeline.

One iteration (`run_once`), each lineage of the alias in a job of its own, held by one
worker at a time (`act/holds.py`; on a DuckLake any server's loop or `onjob loop` is a
worker, and a lineage another holds is passed by until its job ends):

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
(`PeriodicLoop`); `onjob loop [--once]` runs it on a database no server holds, or as one
more worker on a lake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial

import httpx

from ..collector import Collector
from ..collector.budgets import BudgetState
from ..judge import JudgeError, run_pass, signal
from ..judge.signal import Signal
from ..proxy import Router
from ..proxy.tenants import Tenants
from ..trainer import snapshot
from . import release
from .act import deployments, holds, training
from .act.engine import engine_client
from .act.operator import Operator
from .decide import fair, fit, holdout, ledger
from .errors import DeployError, LineageBusy, LoopOff
from .records import Routing
from .settings import DeploySettings
from .status import LineState, LoopView

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
    budget: dict[str, BudgetState] = field(default_factory=dict)  # stage -> its daily budget
    tenant_budgets: dict[str, fair.ShareState] = field(default_factory=dict)  # tenant -> shares
    fitted: fit.Fitted | None = None  # the settings fitted to the traffic, this iteration
    lineages: dict[str, LineState] = field(default_factory=dict)  # name -> live, canary, groups
    last_trained: str | None = None  # the lineage that trained last (the trainer's turn)
    workers: dict[str, str] = field(default_factory=dict)  # lineage -> another worker on it
    scorer: str | None = None  # what scores re-sampled answers (None: nothing does)
    last_iteration: float | None = None  # Unix time the last iteration ended
    interval_s: float = 0.0  # between iterations (0: the loop is off)

    @contextlib.contextmanager
    def doing(self, stage: str):
        self.stage, self.since = stage, time.time()
        try:
            yield
        finally:
            self.seconds[stage] += time.time() - self.since
            self.stage, self.since = "idle", time.time()

    def view(self) -> LoopView:
        seconds = dict(self.seconds)
        if self.stage != "idle":  # the stage under way counts too (a test cut off by a ceiling)
            seconds[self.stage] = seconds.get(self.stage, 0.0) + time.time() - self.since
        return LoopView(
            stage=self.stage,
            paused=self.paused,
            since=self.since,
            iterations=self.iterations,
            seconds={k: round(v, 1) for k, v in seconds.items()},
            budget=dict(self.budget),
            tenant_budgets=dict(self.tenant_budgets),
            fitted=self.fitted,
            lineages=dict(self.lineages),
            last_trained=self.last_trained,
            scorer=self.scorer,
            last_iteration=self.last_iteration,
            interval_s=self.interval_s,
        )


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
    fitted = await db.query(lambda st: fit.current(st, settings))
    if state.fitted is None or _said(state.fitted) != _said(fitted):
        echo(f"fitted to the traffic: {fitted.line}")
    state.fitted = fitted
    held = await db.query(lambda st: holdout.held_out(st, fitted.holdout_share))
    # Each lineage of the alias (the shared one, then each tenant's) decides its own
    # candidates from its own keys' groups, each in a job of its own: on a lake, any
    # worker's that holds it (`act/holds.py`), the others passing it by.
    lines = [
        Line(release.Release(db, engine, operator, settings, echo, lineage=lineage))
        for lineage in Tenants.of(settings.proxy).lineages(settings.loop.alias)
    ]
    shares = await db.query(lambda st: fair.shares(st, settings))
    state.tenant_budgets = {name: share.state() for name, share in shares.items()}
    for line in lines:
        await _work(line, state, echo, partial(_decide_and_judge, line, held, state))
    if not settings.loop.train:
        return
    for line in _round_robin(lines, state.last_trained):
        if line.worker is not None or line.comparing:
            continue
        share = shares.get(line.pipeline.lineage.tenant)
        if not await _may_train(line, echo, state, share):  # as counted; says why not
            continue
        if await _work(line, state, echo, partial(_train, line, held, state, share)):
            return  # one run per iteration: the next lineage's turn comes next time


async def _work(line: Line, state: LoopState, echo, job) -> bool | None:
    """Run `job` holding the lineage's work, and return what it returns; False when
    another worker holds it (the lineage then shown as that worker's, said once when it
    changes hands)."""
    try:
        async with holds.held(line.pipeline.db, line.name):
            line.worker = None
            done = await job()
    except LineageBusy as busy:
        if state.workers.get(line.name) != busy.holder:
            echo(f"{line.name}: {busy.holder} works this lineage now; this worker passes it by")
        line.worker = state.workers[line.name] = busy.holder
        state.lineages[line.name] = line.state()
        return False
    state.workers.pop(line.name, None)
    state.lineages[line.name] = line.state()
    return done


async def _decide_and_judge(line: Line, held, state: LoopState) -> None:
    """The lineage's open decisions, then its judge pass (skipped while its canary needs
    the engine and its next run has its groups)."""
    await line.decide_open(held, state)
    state.lineages[line.name] = line.state()
    r = line.pipeline
    if line.comparing and line.due:
        r.echo(
            f"judge pass{r.lineage.of} skipped while comparing: its groups wait for the next run "
            f"({line.ready})"
        )
        return
    await _judge_pass(r.db, r.engine, r.settings, held, r.echo, state, line)
    await line.count(held)  # what the pass scored, in `onjob status` now


async def _train(line: Line, held, state: LoopState, share: fair.Share | None) -> bool:
    """A run of the lineage when it may start (read again: another worker may have acted
    since this iteration counted), its candidate to the release pipeline; whether it ran."""
    await line.refresh(held)
    if line.comparing or not await _may_train(line, line.pipeline.echo, state, share):
        return False
    state.last_trained = line.name
    await _train_and_release(line, state)
    await line.count(held)  # its groups used, its first run done
    return True


@dataclass
class Line:
    """One lineage in an iteration: its pipeline, its routing, its live checkpoint and how
    many groups a run of it would take."""

    pipeline: release.Release
    routing: Routing | None = None
    ready: int = 0
    wanted: int = 0  # the groups a run of this lineage waits for (fit.min_groups, its pace)
    oldest_s: float | None = None  # how long the oldest ready group has waited
    runs: int = 0  # the lineage's training runs so far (0: its cold start)
    signal: Signal | None = None  # whether its scored groups carry anything to learn from
    deciding: str = ""  # its canary's last verdict, in words
    worker: str | None = None  # another worker that holds it now (a lake's), or None

    @property
    def name(self) -> str:
        return self.pipeline.alias

    @property
    def live(self) -> str | None:
        return self.routing.live if self.routing else self.pipeline.default_live

    @property
    def comparing(self) -> bool:
        return self.pipeline.settings.loop.train and bool(self.routing and self.routing.canary)

    async def decide_open(self, held, state: LoopState) -> None:
        """Orphaned candidates decided, then a round of the open canary (before the judge
        pass, which can take minutes on a CPU: the decision comes as soon as the pairs
        allow); the routing and groups ready as they are after."""
        r = self.pipeline
        await self._read()
        if r.settings.loop.train and not self.comparing:
            with state.doing("offline test"):
                await release.orphans(r, self.routing)
            await self._read()
        if self.comparing:
            with state.doing("compare"):
                await release.canary_round(r, self.routing)
            await self._read()
        await self.count(held)

    async def refresh(self, held) -> None:
        """Its routing and groups as the database has them now."""
        await self._read()
        await self.count(held)

    async def _read(self) -> None:
        self.routing = (await self.pipeline.db.query(deployments.current)).get(self.name)

    async def count(self, held) -> None:
        r = self.pipeline
        ready = await r.db.query(
            lambda st: snapshot.trainable(
                st, r.settings.trainer, live=self.live, held_out=held, scope=r.lineage.scope
            )
        )
        self.ready, self.oldest_s = ready.groups, ready.oldest_s
        spread = r.settings.trainer.min_spread
        recent = await r.db.query(lambda st: fit.recent_groups(st, r.lineage.scope, spread))
        self.runs = await r.db.query(lambda st: fit.runs_of(st, r.lineage.name))
        self.wanted = fit.min_groups(r.settings, recent, runs=self.runs)
        keys, params = r.lineage.scope.sql("e.api_key_id")
        self.signal = await r.db.query(lambda st: signal.signal(st, keys, params))
        self.deciding = await r.db.query(self._deciding) if self.comparing else ""

    def _deciding(self, store) -> str:
        """Its canary's last verdict, in words: what the decision waits for."""
        canary = self.routing.canary
        said = ledger.recorded(store, self.name, self.routing)
        if said is None:
            return f"canary {canary}: its first round comes next iteration"
        reason = said.verdict.reason  # it may name the canary itself ("canary X won ...")
        return reason if reason.startswith(f"canary {canary} ") else f"canary {canary}: {reason}"

    def waiting(self) -> str:
        """What a run of it waits for, in words."""
        if self.comparing:  # a lineage with a canary trains nothing until it is decided
            return (
                f"{self.ready} new trainable groups; the next run waits for the canary's decision"
            )
        waited = f", the oldest {self.oldest_s / 60:.0f} min old" if self.oldest_s else ""
        first = "its first run (cold start)" if self.runs == 0 else "a run"
        said = f"{self.ready} new trainable groups{waited}; {first} starts at {self.wanted}"
        fitted = self.pipeline.settings.loop.min_new_groups is None
        if self.runs and fitted and self.wanted > fit.MIN_GROUPS:
            said += (
                f", or at {fit.MIN_GROUPS} once the oldest is {fit.GROUPS_WINDOW_S // 60} min old"
            )
        return said

    @property
    def due(self) -> bool:
        """Whether a run of it may start on the groups ready (`fit.due`)."""
        return fit.due(self.pipeline.settings, self.ready, self.wanted, self.oldest_s)

    def state(self) -> LineState:
        return LineState(
            live=self.live,
            canary=self.routing.canary if self.routing else None,
            ready_groups=self.ready,
            wanted_groups=self.wanted,
            waiting=self.waiting() if self.comparing or not self.due else "",
            signal=self.signal,
            deciding=self.deciding,
            worker=self.worker,
        )


def _round_robin(lines: list[Line], last: str | None) -> list[Line]:
    """`lines` in turn, starting after the one that trained last: every lineage with
    groups ready gets the trainer in its turn, however busy the others are."""
    names = [line.name for line in lines]
    start = names.index(last) + 1 if last in names else 0
    return lines[start:] + lines[:start]


async def _judge_pass(db, engine, settings: DeploySettings, held, echo, state, line) -> None:
    """The lineage's judge pass: its keys' turns re-sampled and its groups scored."""
    with state.doing("judge"):
        # Held-out scenarios are never trained on: re-sampling them would spend for nothing.
        report = await run_pass(
            db,
            engine,
            fit.judge_settings(settings, state.fitted),
            echo=echo,
            skip_scenarios=held,
            untrained_keys=settings.proxy.untrained_keys,
            key_budgets=fair.judge_shares(settings),
            engine_logprobs=settings.proxy.engine_logprobs,
            scope=line.pipeline.lineage.scope,
        )
    echo(f"judge pass{line.pipeline.lineage.of}: {report.summary()}")
    if report.budget is not None:
        state.budget["judge"] = report.budget.state()


async def _may_train(line: Line, echo, state, share: fair.Share | None) -> bool:
    """Whether the lineage's run may start now: the trainer's daily budget and its tenant's
    share of it, enough new groups, and the lineage's candidate budget and back-off (each
    candidate spends a share of its alpha)."""
    r = line.pipeline
    budget = await training.budget(r.db, r.settings)
    if budget is not None:
        state.budget["train"] = budget.state()
        if budget.spent_out:
            echo(f"train: {budget.status()}; the groups wait")
            return False
    if share is not None and share.train is not None and share.train.spent_out:
        echo(f"train {line.name}: {share.train.status()}; its groups wait")
        return False
    if not line.due:
        echo(f"train {line.name}: {line.waiting()}")
        if line.signal is not None and line.signal.none:
            echo(f"train {line.name}: {line.signal.line}")
        return False
    if why := await r.db.query(lambda st: ledger.waits(st, line.name, r.settings.loop)):
        echo(f"train {line.name}: {why}")
        return False
    return True


def _said(f: fit.Fitted) -> tuple:
    """What a change of is logged: the values, not the traffic they came from."""
    return f.holdout_share, f.min_new_groups, f.canary_fraction, f.settle_s


async def _train_and_release(line: Line, state) -> None:
    r = line.pipeline
    with state.doing("train"):
        manifest = await training.train(
            r.db,
            r.settings,
            parent=line.live,
            engine_sampler=await training.sampler(r.engine),
            started_by="loop",
            engine=r.engine,
            echo=r.echo,
            lineage=r.lineage,
        )
    if manifest is None:
        return
    with state.doing("offline test"):
        await release.trained(
            r, live=line.live, candidate=manifest.name, trained_on=len(manifest.groups)
        )


OFF = "The loop is off in this server (loop.interval_s = 0)."


class PeriodicLoop:
    """`onjob serve`'s background loop: an iteration every `loop.interval_s`, one at a time;
    one that fails is logged and the next tries again."""

    def __init__(self, collector: Collector, operator: Operator, settings: DeploySettings):
        self.collector = collector
        self.operator = operator
        self.settings = settings
        self.state = LoopState(
            scorer=settings.judge.scorer(), interval_s=max(settings.loop.interval_s, 0.0)
        )
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self.settings.loop.interval_s > 0:
            self.state.fitted = await self.collector.query(
                lambda st: fit.current(st, self.settings)
            )
            log.info("fitted to the traffic: %s", self.state.fitted.line)
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

    async def switch(self, running: bool) -> LoopView:
        """Resume (`running`) or pause, for the admin API and the dashboard's button; the
        loop's state after. Refused with `LoopOff` where the loop is off (interval 0). On a
        lake this server's worker pauses; the other servers' go on."""
        if self.settings.loop.interval_s <= 0:
            raise LoopOff(OFF)
        await (self.resume() if running else self.pause())
        return self.state.view()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.loop.interval_s)
            # A bucket's standby: the loader's database is the one to learn from. (On a
            # lake every server's loop works, each lineage on one at a time.)
            if self.collector.standby and not self.collector.in_lake:
                self.state.stage = "standby"
                continue
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
            self.state.last_iteration = time.time()


async def run(settings: DeploySettings, *, once: bool, echo) -> None:
    """`onjob loop`: iterations on a database no server holds."""
    db = Collector(settings.collector)
    await db.start()
    try:
        async with engine_client(settings) as engine:
            router = Router(settings.proxy.aliases, None, Tenants.of(settings.proxy))
            operator = Operator(db, router, engine, settings.proxy.aliases)
            await operator.restore()
            while True:
                await run_once(db, engine, operator, settings, echo)
                if once or settings.loop.interval_s <= 0:
                    return
                await asyncio.sleep(settings.loop.interval_s)
    finally:
        await db.close()
