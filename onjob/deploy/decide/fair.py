"""Fair use of the one trainer and the one judge between tenants: each tenant's daily
share (`loop.tenant_budgets`), read from the rows as the server's budgets are
(`collector.budgets`: a UTC day, a restart resets nothing).

The trainer takes the lineages with groups ready in turn (`loop.py`); a tenant whose
training share is spent is passed over until 00:00 UTC, and its groups wait, whole. A
tenant whose judge share is spent gets no new groups, and its groups that need a RULER
call wait (a cached judgement is free and still used), while the other tenants' go on;
the share is checked before each call (`judge.passes.KeyBudget`), so calls in flight
(at most `judge.concurrency`) can pass it by their own cost. The paired comparisons of
a release decision are not charged to a share: they decide, they do not train.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from ...collector import Store, budgets
from ...collector.scope import lineage_name
from ...judge import KeyBudget
from ...proxy.tenants import Tenants
from ..settings import DeploySettings


@dataclass(frozen=True)
class Share:
    """One tenant's budgets today (None: no share of its own for that stage)."""

    tenant: str
    keys: tuple[str, ...]
    train: budgets.Budget | None
    judge: budgets.Budget | None

    def state(self) -> ShareState:
        return ShareState(
            keys=list(self.keys),
            train=self.train.state() if self.train else None,
            judge=self.judge.state() if self.judge else None,
        )


class ShareState(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's share as the admin status, the dashboard and `onjob status` show it."""

    keys: list[str]
    train: budgets.BudgetState | None
    judge: budgets.BudgetState | None


def shares(store: Store, settings: DeploySettings) -> Mapping[str, Share]:
    """Each tenant with a budget of its own, and what it has spent of it today. A judge
    share counts only with a RULER judge: reward functions and feedback cost nothing."""
    tenants = Tenants.of(settings.proxy)
    judged = {b.whose: b for b in judge_shares(settings)} if settings.judge.model else {}
    out = {}
    for name, budget in settings.loop.tenant_budgets.items():
        keys, whose = tenants.keys[name], _whose(name)
        lineages = tuple(lineage_name(alias, name) for alias in settings.proxy.aliases)
        train = None
        if budget.train_minutes_per_day is not None:
            limit = budget.train_minutes_per_day
            train = budgets.train(store, limit, lineages=lineages, whose=whose)
        judge = judged[whose].today(store) if whose in judged else None
        out[name] = Share(name, keys, train, judge)
    return out


def judge_shares(settings: DeploySettings) -> list[KeyBudget]:
    """Each tenant's judge share as the judge pass checks it, before each RULER call."""
    tenants = Tenants.of(settings.proxy)
    return [
        KeyBudget(_whose(name), tenants.keys[name], budget.judge_usd_per_day)
        for name, budget in settings.loop.tenant_budgets.items()
        if budget.judge_usd_per_day is not None
    ]


def _whose(tenant: str) -> str:
    return f"tenant {tenant}"
