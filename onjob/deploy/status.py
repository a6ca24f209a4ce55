"""`GET /admin/status` and its parts, as the records the admin API sends and the client,
the dashboard and `onjob status` read: the routing per lineage, the engines, the log's
counters, the deployments, the loop's state, the reward per checkpoint, each judge's
agreement with users, the release mode and reviews, and the settings fitted to the
traffic."""

from __future__ import annotations

from typing import Any

import msgspec

from ..collector.budgets import BudgetState
from ..collector.writer import CollectorStats
from ..judge.agreement import Agreement
from ..judge.signal import Signal
from ..proxy.routing import Arms
from .act.reviews import ReleaseStatus
from .decide import fair, fit
from .progress import CheckpointReward
from .records import Routing


class LineState(msgspec.Struct, frozen=True, kw_only=True):
    """One lineage in the loop's last iteration: its arms and its groups."""

    live: str | None
    canary: str | None
    ready_groups: int  # scored groups it could train on
    wanted_groups: int  # what starts a run (`fit.min_groups`)
    waiting: str = ""  # what a run waits for, in words
    signal: Signal | None = None  # whether its scored groups carry anything to learn from
    deciding: str = ""  # its canary's last verdict, in words: what the decision waits for
    worker: str | None = None  # on a lake, another worker that holds it now (None: this one)


class LoopView(msgspec.Struct, frozen=True, kw_only=True):
    """The loop's state as the admin status, the dashboard and `onjob status` show it."""

    stage: str
    paused: bool
    since: float  # Unix time the stage began
    iterations: int
    seconds: dict[str, float]  # wall time per stage
    budget: dict[str, BudgetState]  # stage -> its daily budget, when one is set
    tenant_budgets: dict[str, fair.ShareState]
    fitted: fit.Fitted | None
    lineages: dict[str, LineState]
    last_trained: str | None
    scorer: str | None = None  # what scores re-sampled answers (None: nothing does)
    last_iteration: float | None = None  # Unix time the last iteration ended
    interval_s: float = 0.0  # between iterations (0: the loop is off)

    def line(self, now: float) -> str:
        """The loop in one line, as `onjob status` and the dashboard show it."""
        if self.interval_s <= 0:
            return "off in this server (loop.interval_s = 0)"
        doing = (
            "between iterations"
            if self.stage == "idle"
            else f"{self.stage} for {now - self.since:.0f} s"
        )
        last = (
            f"the last ended {now - self.last_iteration:.0f} s ago"
            if self.last_iteration
            else "none ended yet"
        )
        return (
            f"{'paused' if self.paused else 'running'}, {doing}; {self.iterations} "
            f"iteration{'' if self.iterations == 1 else 's'}, {last}, one every "
            f"{self.interval_s:g} s; scorer: "
            f"{self.scorer or 'none'}"
        )


class ServerStatus(msgspec.Struct, kw_only=True):
    """`GET /admin/status`: the routing per lineage and what the server is doing. The
    engines' health and the reward per checkpoint stay JSON objects (`pool.status`,
    `progress.reward_by_checkpoint`)."""

    aliases: dict[str, Arms]  # lineage -> its arms
    base_model: str | None
    tenants: dict[str, list[str]]  # tenant -> its API key ids
    engines: list[dict[str, Any]]
    collector: CollectorStats
    deployments: list[Routing]  # newest first
    loop: LoopView
    rewards: list[CheckpointReward]  # per sampling checkpoint: its groups' mean reward
    judge_agreement: list[Agreement]
    release: ReleaseStatus
    fitted: fit.Fitted
