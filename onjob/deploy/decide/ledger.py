"""Each lineage's stream of release candidates, in the `candidates` table (`alias` holds
the lineage's name: the alias, or `alias@tenant`): the index k of each candidate, the
level its test runs at, and how it ended.

The level (`level`): `loop.alpha` is spent per period of `loop.alpha_period_days` (a year
by default), counted from the lineage's first candidate. The j-th candidate of a period is
tested at `stats.spend(alpha, j, planned)`, `planned` being the most candidates the
training budget lets into a period (`loop.max_candidates_per_day` a day): the shares of a
period sum to at most alpha. A candidate the test promoted passes its level on to the
next one of its period (the online fallback procedure, Tian & Ramdas 2021): a union bound
over the period's hypotheses still holds, so the chance that any candidate no better than
live is promoted within a period is at most alpha, however the candidates depend on each
other. That holds only if no k is handed out twice, so k lives in DuckDB, not in memory:
a restart continues the count.

The same rows ration training: `waits` says why the next run must wait, a daily budget of
new candidates (`loop.max_candidates_per_day`) or a back-off after candidates in a row
that were not promoted (`loop.backoff_s`, doubled each time, up to a day), so a loop
that keeps failing spends its alpha, and the engine's time, slowly.

And each candidate's last verdict (`record`, `recorded`): what the loop decided at its
offline test or its canary's last look, with the evidence, for the dashboard to show.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

import msgspec

from ..records import Routing
from ..settings import LoopSettings
from . import stats
from .evidence import Recorded, Stage, Verdict

Outcome = Literal["promoted", "rolled_back", "stopped"]
MAX_BACKOFF_S = 86400.0


@dataclass(frozen=True)
class Level:
    """A candidate's place in its lineage's stream and the level its test runs at."""

    k: int  # its index in the lineage's stream, for ever
    alpha: float  # its level: its share of its period's alpha, plus `carried`
    rank: int = 1  # its place in its period (the j of its share)
    period: int = 0  # its period of loop.alpha_period_days, from the lineage's first
    carried: float = 0.0  # the level the promoted candidate before it passed on


class _Entry(msgspec.Struct, frozen=True, kw_only=True):
    """A candidate's row in its lineage's stream, as `level` counts it (or where `enter`
    would put one not tested yet: no checkpoint, no outcome)."""

    k: int
    entered: datetime
    outcome: str | None = None
    checkpoint: str | None = None


def level(
    store, alias: str, checkpoint: str, loop: LoopSettings, now: datetime | None = None
) -> Level:
    """The candidate's level: from its row, or, before it has one, from where `enter`
    would put it now (read only: the dashboard asks too). `alias` is the lineage's name;
    with `loop.alpha_split` "server" its stream has only its lineage's share of alpha
    (`lineage_alpha`)."""
    rows = store.rows(
        _Entry,
        "SELECT checkpoint, k, entered, outcome FROM candidates WHERE alias = ? ORDER BY k",
        [alias],
    )
    mine = next((r for r in rows if r.checkpoint == checkpoint), None)
    if mine is None:
        mine = _Entry(k=_next(store, alias), entered=now or datetime.now(UTC))
        rows = [*rows, mine]
    span = timedelta(days=loop.alpha_period_days)
    start = rows[0].entered
    period = (mine.entered - start) // span
    stream = [r for r in rows if (r.entered - start) // span == period and r.k <= mine.k]
    alpha = lineage_alpha(store, alias, loop.alpha, loop.alpha_split)
    planned = planned_candidates(loop)
    share = carried = 0.0
    for j in range(1, len(stream) + 1):
        carried = share if j > 1 and stream[j - 2].outcome == "promoted" else 0.0
        share = stats.spend(alpha, j, planned) + carried
    return Level(mine.k, share, len(stream), period, carried)


def planned_candidates(loop: LoopSettings) -> int | None:
    """The most candidates the training budget lets into one period (its UTC days, a
    part-day at each end included); None when the budget is unbounded."""
    if loop.max_candidates_per_day is None:
        return None
    return loop.max_candidates_per_day * (math.ceil(loop.alpha_period_days) + 1)


def lineage_alpha(store, alias: str, alpha: float, split: str) -> float:
    """The lineage's alpha (`loop.alpha_split`): all of `alpha` for each lineage
    ("tenant"), or lineage j's share 6 alpha / (pi^2 j^2), j its place in the order the
    lineages' first candidates were tested ("server"; one not tested yet comes next).
    The order lives in the `candidates` rows, so a restart, or a tenant added later, never
    hands one place to two lineages."""
    if split != "server":
        return alpha
    names = store.column(
        "SELECT alias FROM candidates GROUP BY alias ORDER BY min(entered), min(k), alias"
    )
    j = names.index(alias) + 1 if alias in names else len(names) + 1
    return stats.spend(alpha, j)


def enter(store, alias: str, checkpoint: str, now: datetime | None = None) -> int:
    """The candidate's index in the alias's stream, given the first time it is tested and
    the same ever after."""
    known = store.scalar(
        "SELECT k FROM candidates WHERE alias = ? AND checkpoint = ?", [alias, checkpoint]
    )
    if known is not None:
        return known
    k = _next(store, alias)
    store.execute(
        "INSERT INTO candidates (alias, checkpoint, k, entered) VALUES (?, ?, ?, ?)",
        [alias, checkpoint, k, now or datetime.now(UTC)],
    )
    return k


def entered(store, alias: str, checkpoint: str) -> bool:
    """Whether the candidate was ever tested (has its index)."""
    found = store.scalar(
        "SELECT 1 FROM candidates WHERE alias = ? AND checkpoint = ?", [alias, checkpoint]
    )
    return found is not None


def settle(
    store, alias: str, checkpoint: str, outcome: Outcome, now: datetime | None = None
) -> None:
    """How the candidate's test ended (entered first, if it never was)."""
    enter(store, alias, checkpoint, now)
    store.execute(
        "UPDATE candidates SET outcome = ?, decided = ? WHERE alias = ? AND checkpoint = ?",
        [outcome, now or datetime.now(UTC), alias, checkpoint],
    )


def record(store, alias: str, checkpoint: str, stage: Stage, verdict: Verdict) -> None:
    """The verdict the loop just reached on the candidate (entered first, if it never was):
    the one the dashboard shows until the next."""
    enter(store, alias, checkpoint)
    store.execute(
        "UPDATE candidates SET verdict = ?, verdict_stage = ?, verdict_at = now() "
        "WHERE alias = ? AND checkpoint = ?",
        [verdict.encode(), stage, alias, checkpoint],
    )


class _Looked(msgspec.Struct, frozen=True, kw_only=True):
    """A candidate's last verdict, as stored: `Verdict.encode`'s JSON, its stage and when."""

    verdict: str
    verdict_stage: str
    verdict_at: datetime


def recorded(store, alias: str, routing: Routing) -> Recorded | None:
    """The last verdict on `routing`'s canary as that routing's canary (None before the
    loop's first look at it: a verdict on an earlier routing of the same checkpoint, or
    its offline test's, is not about this one)."""
    rows = store.rows(
        _Looked,
        "SELECT verdict, verdict_stage, verdict_at FROM candidates "
        "WHERE alias = ? AND checkpoint = ? AND verdict_stage = 'canary'",
        [alias, routing.canary],
    )
    if not rows:
        return None
    verdict = Verdict.decode(rows[0].verdict)
    seen = verdict.evidence.routing
    if seen is None or seen.since != routing.ts.isoformat():
        return None
    return Recorded(stage="canary", verdict=verdict, at=rows[0].verdict_at)


def count_round(store, alias: str, checkpoint: str, routing_ts: datetime) -> int:
    """One more look at the canary of the routing made at `routing_ts`; how many so far
    (a new routing of the same checkpoint starts again from 1)."""
    enter(store, alias, checkpoint)
    with store.transaction() as con:  # no RETURNING: a lake's UPDATE has none
        con.execute(
            "UPDATE candidates SET rounds = CASE WHEN rounds_of = ? THEN coalesce(rounds, 0) "
            "+ 1 ELSE 1 END, rounds_of = ? WHERE alias = ? AND checkpoint = ?",
            [routing_ts, routing_ts, alias, checkpoint],
        )
        (rounds,) = con.execute(
            "SELECT rounds FROM candidates WHERE alias = ? AND checkpoint = ?", [alias, checkpoint]
        ).fetchone()
    return rounds


def backoff_s(settings: LoopSettings, failures: int) -> float:
    """How long the next training run waits after `failures` candidates in a row were not
    promoted: none after a promotion, then `backoff_s`, doubled for each more, up to a day."""
    if failures <= 0 or settings.backoff_s <= 0:
        return 0.0
    return min(MAX_BACKOFF_S, settings.backoff_s * 2 ** min(failures - 1, 32))


class _Settled(msgspec.Struct, frozen=True, kw_only=True):
    """How a candidate ended, and when."""

    outcome: str
    decided: datetime


def waits(store, alias: str, settings: LoopSettings, now: datetime | None = None) -> str | None:
    """Why the alias's next training run must wait (None: it need not)."""
    now = now or datetime.now(UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    limit = settings.max_candidates_per_day
    if limit is not None:
        today = store.scalar(
            "SELECT count(*) AS n FROM candidates WHERE alias = ? AND entered >= ?", [alias, day]
        )
        if today >= limit:
            resumes = (day + timedelta(days=1)).strftime("%Y-%m-%d %H:%M UTC")
            return f"training budget: {today} candidates today (at most {limit}); resumes {resumes}"
    settled = store.rows(
        _Settled,
        "SELECT outcome, decided FROM candidates WHERE alias = ? AND outcome IS NOT NULL "
        "ORDER BY k DESC LIMIT 40",
        [alias],
    )
    failures = next((i for i, r in enumerate(settled) if r.outcome == "promoted"), len(settled))
    wait = backoff_s(settings, failures)
    if wait and now < settled[0].decided + timedelta(seconds=wait):
        until = (settled[0].decided + timedelta(seconds=wait)).astimezone(UTC)
        return (
            f"back-off: {failures} candidate(s) in a row not promoted; the next run after "
            f"{until:%Y-%m-%d %H:%M:%S} UTC"
        )
    return None


def _next(store, alias: str) -> int:
    return (store.scalar("SELECT max(k) AS k FROM candidates WHERE alias = ?", [alias]) or 0) + 1
