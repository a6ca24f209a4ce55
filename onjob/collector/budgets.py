"""Daily budgets, read from the tables: the judge's dollars and the trainer's minutes.

A day is a UTC calendar day: what a stage spent is the sum over the rows it wrote
since 00:00 UTC (`judgements.cost_usd`, `train_runs.duration_s`), so a restart, a
second process or a crash mid-day never resets the count, and a spent budget comes
back at the next 00:00 UTC without anyone acting. The stage that finds its budget
spent pauses and leaves its work where it is: nothing is dropped, only postponed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

import msgspec

from .store import Store

Stage = Literal["judge", "train"]


@dataclass(frozen=True)
class Budget:
    """What one stage may spend per UTC day, and what it has spent today."""

    stage: Stage
    unit: Literal["usd", "minutes"]
    spent: float
    limit: float
    resumes_at: datetime  # the next 00:00 UTC, when `spent` starts again from 0
    whose: str | None = None  # one tenant's share ("tenant acme"); None: the server's

    @property
    def spent_out(self) -> bool:
        return self.spent >= self.limit

    def _spent_of_limit(self) -> str:
        if self.unit == "usd":
            return f"${round(self.spent, 4):g} of ${round(self.limit, 4):g}"
        return f"{self.spent:.1f} of {self.limit:.1f} minutes"

    def status(self) -> str:
        """One line for people: `judge budget spent: $0.28 of $0.25 today; resumes
        2025-01-02 00:00 UTC`, or `judge budget: $0.14 of $0.25 spent today (UTC)`."""
        name = f"{self.stage} budget" + (f" of {self.whose}" if self.whose else "")
        if self.spent_out:
            return (
                f"{name} spent: {self._spent_of_limit()} today; "
                f"resumes {self.resumes_at:%Y-%m-%d %H:%M} UTC"
            )
        return f"{name}: {self._spent_of_limit()} spent today (UTC)"

    def state(self) -> BudgetState:
        return BudgetState(
            unit=self.unit,
            spent=round(self.spent, 6),
            limit=self.limit,
            paused=self.spent_out,
            resumes_at=self.resumes_at,
            status=self.status(),
        )


class BudgetState(msgspec.Struct, frozen=True, kw_only=True):
    """A budget as the admin status, the dashboard and `onjob status` show it."""

    unit: Literal["usd", "minutes"]
    spent: float
    limit: float
    paused: bool  # spent: the stage waits until `resumes_at`
    resumes_at: datetime
    status: str  # `Budget.status`, in words


def day_of(now: datetime | None = None) -> tuple[datetime, datetime]:
    """The UTC calendar day `now` (default: this instant) falls in: [00:00, next 00:00)."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=1)


def judge(
    store: Store,
    limit_usd: float,
    now: datetime | None = None,
    *,
    keys: tuple[str, ...] | None = None,
    whose: str | None = None,
) -> Budget:
    """The judge's spend today: litellm's cost of every judge call recorded since 00:00 UTC
    (cache hits and calls litellm could not price record none). `keys`: only the calls on
    groups of these API keys' traffic (a group is one key's), `whose` their tenant."""
    start, end = day_of(now)
    mine = (
        ""
        if keys is None
        else " AND group_id IN (SELECT m.group_id FROM members m JOIN exchanges e "
        "ON e.id = m.exchange_id WHERE list_contains(?, e.api_key_id))"
    )
    [row] = store.dicts(
        "SELECT coalesce(sum(cost_usd), 0) AS spent FROM judgements "
        "WHERE created >= ? AND created < ?" + mine,
        [start, end] + ([] if keys is None else [list(keys)]),
    )
    return Budget("judge", "usd", float(row["spent"]), limit_usd, end, whose)


def train(
    store: Store,
    limit_minutes: float,
    now: datetime | None = None,
    *,
    lineages: tuple[str, ...] | None = None,
    whose: str | None = None,
) -> Budget:
    """The trainer's minutes today: the duration of every run recorded since 00:00 UTC (a
    run counts on the day it finished; a failed run records no row and counts nothing).
    `lineages`: only the runs trained for these (a tenant's), `whose` their tenant."""
    start, end = day_of(now)
    mine = "" if lineages is None else " AND list_contains(?, config->>'lineage')"
    [row] = store.dicts(
        "SELECT coalesce(sum(duration_s), 0) / 60 AS spent FROM train_runs "
        "WHERE created >= ? AND created < ?" + mine,
        [start, end] + ([] if lineages is None else [list(lineages)]),
    )
    return Budget("train", "minutes", float(row["spent"]), limit_minutes, end, whose)
