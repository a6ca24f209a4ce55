"""Loop settings fitted to the traffic: what a deployment leaves unset is chosen from what
the log shows, so a user's task needs no `[loop]` overrides of its own.

    holdout_share    the held-out slice should hold `holdout_pairs` scenarios soon, where
                     each decision is made at a scenario's first sight: holdout_pairs /
                     scenarios seen, between 10% and 30%. An agent that opens few
                     scenarios (the calculator: 12 in 35 minutes, of which 10% held out
                     none) holds out 30% of its first 40; one that opens hundreds, 10%.
    min_new_groups   a run starts on what about ten minutes of traffic gives the judge:
                     the trainable groups (a spread of rewards) scored in the last 10
                     minutes, at least 4, at most `trainer.max_groups`. Slow traffic
                     trains on 4; busy traffic on a run's worth, not a run per pass. The
                     count it waits for can never chase itself: a run also starts once
                     its oldest ready group has waited those ten minutes (`due`), with 4
                     or more. A lineage's first run (cold start) waits for
                     `COLD_START_GROUPS` only, whatever the window holds: a new user
                     sees a candidate within minutes. The loop asks it per lineage, of
                     the lineage's own keys' groups (`recent_groups`): a quiet tenant
                     beside a busy one trains on its own pace; `Fitted` shows the whole
                     server's.
    canary_fraction  a canary should see its `min_guard_conversations` within about five
                     minutes of the traffic's pace (conversations started in the last 10
                     minutes, halved): that share, between 10% and 50%. The guards decide
                     on the same conversations whatever the share, so a larger one puts
                     no more users at risk; it only ends the canary sooner. A busy agent
                     gives a candidate a tenth of its users; a quiet one half, or its
                     guards would wait hours (the candidate has already won its held-out
                     pairs). The release asks it per lineage, of the conversations its
                     own keys started (`recent_conversations`): a tenant's canary is
                     routed only that tenant's traffic.
    judge.settle_s   a conversation counts as finished (and joins its scenario's group)
                     once idle 4x the 95th percentile of the gaps between a conversation's
                     turns in the last hour, between 10 s and 300 s: a tool agent's turns
                     come seconds apart, a person's chat minutes; 120 s with no multi-turn
                     traffic yet.

`Fitted` is read each loop iteration (two small queries), logged when it changes, printed
when the server starts and shown by `onjob status`. A value set in `[loop]` is used as it
is, and said so.
"""

from __future__ import annotations

import msgspec

from ...collector.scope import KeyScope
from ...judge import JudgeSettings
from ...judge.settings import SETTLE_S
from ..settings import DeploySettings
from . import holdout

HOLDOUT_RANGE = (0.1, 0.3)
MIN_GROUPS = 4
COLD_START_GROUPS = 6  # a lineage's first run: a candidate within minutes of the traffic
GROUPS_WINDOW_S = 600
CANARY_RANGE = (0.1, 0.5)
CANARY_S = 300  # the canary's guards fill in about this long
SETTLE_RANGE = (10.0, 300.0)


class Traffic(msgspec.Struct, frozen=True, kw_only=True):
    """What the log shows: scenarios seen, the conversations in them, and the groups the
    judge scored and the conversations started in the last `GROUPS_WINDOW_S`."""

    scenarios: int = 0
    conversations: int = 0
    recent_groups: int = 0
    recent_conversations: int = 0
    turn_gap_p95_s: float | None = None  # None: no conversation of two turns in the hour


class Fitted(msgspec.Struct, frozen=True, kw_only=True):
    """The settings in force this iteration, each fitted or set, with the traffic they were
    fitted to and `line`, all of it in words (the log, `onjob status`)."""

    holdout_share: float
    min_new_groups: int
    canary_fraction: float
    settle_s: float
    traffic: Traffic
    fitted: tuple[str, ...]  # the names chosen here; the others are the settings'
    line: str = ""

    @classmethod
    def of(cls, **values) -> Fitted:
        f = cls(**values)
        return msgspec.structs.replace(f, line=_line(f))


def _line(f: Fitted) -> str:
    def said(name: str, value, note: str = "") -> str:
        how = "fitted" if name in f.fitted else "set"
        return f"{name} {value} ({how}{note})"

    # A fitted count's cold start, which `onjob status` shows a new lineage waiting for.
    first = f"; a first run: {COLD_START_GROUPS}" if "min_new_groups" in f.fitted else ""
    t = f.traffic
    return (
        f"{said('holdout_share', f'{f.holdout_share:.0%}')}, "
        f"{said('min_new_groups', f.min_new_groups, first)}, "
        f"{said('canary_fraction', f'{f.canary_fraction:.0%}')}, "
        f"{said('settle_s', f'{f.settle_s:.0f}')}; from {t.scenarios} "
        f"scenarios, {t.conversations} conversations, {t.recent_groups} groups with a "
        f"spread of rewards scored "
        f"and {t.recent_conversations} conversations started in the last "
        f"{GROUPS_WINDOW_S // 60} minutes"
    )


# The groups a run can learn from: their combined rewards spread more than the parameter.
_SPREAD = """(SELECT group_id FROM scores WHERE source = 'combined'
               GROUP BY group_id HAVING max(score) - min(score) > ?)"""


def observe(store, min_spread: float = 0.0) -> Traffic:
    """The traffic; its recent groups are those a run can learn from (their rewards spread
    more than `min_spread`), as each lineage counts its own (`recent_groups`): the line
    `onjob status` prints then agrees with the count a lineage's run waits for."""
    row = store.rows(
        Traffic,
        f"""
        SELECT (SELECT count(*) FROM scenarios) AS scenarios,
               (SELECT coalesce(sum(count), 0) FROM scenarios) AS conversations,
               (SELECT count(*) FROM groups WHERE status = 'scored'
                  AND kind IN ('turn', 'trajectory')
                  AND created > now() - INTERVAL {GROUPS_WINDOW_S} SECOND
                  AND id IN {_SPREAD}) AS recent_groups,
               (SELECT count(*) FROM trajectories WHERE source = 'production'
                  AND first_ts > now() - INTERVAL {GROUPS_WINDOW_S} SECOND)
                  AS recent_conversations,
               (SELECT quantile_cont(gap, 0.95) FROM (
                    SELECT epoch(ts - lag(ts) OVER (PARTITION BY trajectory_id
                                                    ORDER BY turn, ts)) AS gap
                    FROM exchanges WHERE source = 'production'
                      AND ts > now() - INTERVAL 1 HOUR)) AS turn_gap_p95_s
        """,
        [min_spread],
    )[0]
    gap = row.turn_gap_p95_s
    return Traffic(
        scenarios=int(row.scenarios),
        conversations=int(row.conversations),
        recent_groups=int(row.recent_groups),
        recent_conversations=int(row.recent_conversations),
        turn_gap_p95_s=None if gap is None else float(gap),
    )


def fit(settings: DeploySettings, traffic: Traffic) -> Fitted:
    loop, fitted = settings.loop, []
    share = loop.holdout_share
    if share is None:
        low, high = HOLDOUT_RANGE
        share = min(high, max(low, loop.holdout_pairs / max(traffic.scenarios, 1)))
        fitted.append("holdout_share")
    groups = min_groups(settings, traffic.recent_groups)
    if loop.min_new_groups is None:
        fitted.append("min_new_groups")
    canary = canary_fraction(settings, traffic.recent_conversations)
    if loop.canary_fraction is None:
        fitted.append("canary_fraction")
    settle = settings.judge.settle_s
    if settle is None:
        low, high = SETTLE_RANGE
        gap = traffic.turn_gap_p95_s
        settle = SETTLE_S if gap is None else min(high, max(low, 4 * gap))
        fitted.append("settle_s")
    return Fitted.of(
        holdout_share=round(share, 3),
        min_new_groups=groups,
        canary_fraction=round(canary, 3),
        settle_s=round(settle, 1),
        traffic=traffic,
        fitted=tuple(fitted),
    )


def min_groups(settings: DeploySettings, recent_groups: int, *, runs: int = 1) -> int:
    """`loop.min_new_groups`, else `COLD_START_GROUPS` for a lineage's first run (`runs`
    0), else what `recent_groups` scored in the last ten minutes give, between
    `MIN_GROUPS` and `trainer.max_groups`."""
    if settings.loop.min_new_groups is not None:
        return settings.loop.min_new_groups
    most = max(MIN_GROUPS, settings.trainer.max_groups)
    if runs == 0:
        return min(most, COLD_START_GROUPS)
    return min(most, max(MIN_GROUPS, recent_groups))


def due(settings: DeploySettings, ready: int, wanted: int, oldest_s: float | None) -> bool:
    """Whether a run may start: `wanted` groups ready, or (the threshold fitted, not set)
    `MIN_GROUPS` or more of which the oldest has waited `GROUPS_WINDOW_S`: a window's worth
    of groups is what the fit asks for, so waiting longer would only chase its own count."""
    if ready >= wanted:
        return True
    fitted = settings.loop.min_new_groups is None
    return fitted and ready >= MIN_GROUPS and (oldest_s or 0.0) >= GROUPS_WINDOW_S


def recent_groups(store, scope: KeyScope, min_spread: float = 0.0) -> int:
    """The trainable turn and trajectory groups (their rewards spread more than
    `min_spread`) of `scope`'s keys scored in the last ten minutes (a group is one key's):
    a lineage's own pace, so a quiet tenant beside a busy one trains on what its own
    traffic gives, not on the busy one's threshold; groups with no spread never train,
    and counting them made a run wait for groups that could not come."""
    condition, params = scope.sql("e.api_key_id")
    return store.scalar(
        f"""
        SELECT count(DISTINCT g.id) AS n FROM groups g
        JOIN members m ON m.group_id = g.id JOIN exchanges e ON e.id = m.exchange_id
        WHERE g.status = 'scored' AND g.kind IN ('turn', 'trajectory')
          AND g.created > now() - INTERVAL {GROUPS_WINDOW_S} SECOND AND {condition}
          AND g.id IN {_SPREAD}
        """,
        [*params, min_spread],
    )


def runs_of(store, lineage: str) -> int:
    """The training runs that wrote a checkpoint for `lineage` (0: its cold start)."""
    return store.scalar(
        "SELECT count(*) AS n FROM train_runs WHERE json_extract_string(config, '$.lineage') = ?",
        [lineage],
    )


def canary_fraction(settings: DeploySettings, recent_conversations: int) -> float:
    """`loop.canary_fraction`, else the share that gives a canary its
    `min_guard_conversations` in about `CANARY_S` at the pace of `recent_conversations`
    started in the last ten minutes, between 10% and 50%."""
    if settings.loop.canary_fraction is not None:
        return settings.loop.canary_fraction
    low, high = CANARY_RANGE
    pace = recent_conversations * CANARY_S / GROUPS_WINDOW_S
    wanted = settings.loop.min_guard_conversations / max(pace, 1)
    return round(min(high, max(low, wanted)), 3)


def recent_conversations(store, scope: KeyScope) -> int:
    """The production conversations `scope`'s keys started in the last ten minutes: the
    pace a lineage's canary sees, since only its own keys are routed to it."""
    condition, params = scope.sql("e.api_key_id")
    return store.scalar(
        f"""
        SELECT count(*) AS n FROM trajectories t JOIN exchanges e ON e.id = t.first_exchange
        WHERE t.source = 'production'
          AND t.first_ts > now() - INTERVAL {GROUPS_WINDOW_S} SECOND AND {condition}
        """,
        params,
    )


def judge_settings(settings: DeploySettings, fitted: Fitted) -> JudgeSettings:
    """The judge's settings with what was fitted filled in."""
    return settings.judge.model_copy(update={"settle_s": fitted.settle_s})


def current(store, settings: DeploySettings) -> Fitted:
    return fit(settings, observe(store, settings.trainer.min_spread))


def held_out(store, settings: DeploySettings) -> list[str]:
    """The held-out scenario ids, new scenarios placed at the share fitted now."""
    return holdout.held_out(store, current(store, settings).holdout_share)
