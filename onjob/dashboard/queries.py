"""What the dashboard shows, as DuckDB queries: aggregates over a time window and pages of
rows, never whole tables, so a page stays fast with millions of exchanges."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Literal

import msgspec

from ..collector import Store
from ..judge.rollouts import json_value

PAGE = 50


class Traffic(msgspec.Struct, frozen=True):
    """One alias and arm over the window (`traffic`)."""

    alias: str
    arm: str
    requests: int
    errors: int
    p50_ms: float | None  # None: no answer without an error in the window
    p95_ms: float | None
    p99_ms: float | None
    prompt_tokens: int
    completion_tokens: int


class ScenarioRow(msgspec.Struct, frozen=True):
    """A scenario with its groups' mean combined score (`scenarios`)."""

    id: str
    key: str
    count: int
    first_seen: dt.datetime | None
    groups: int
    mean_score: float | None  # None: no group of it scored yet


class GroupRow(msgspec.Struct, frozen=True):
    """A group as the groups page lists it (`groups`)."""

    id: str
    kind: str
    status: str
    reason: str | None
    created: dt.datetime | None
    scenario_id: str | None
    checkpoints: list[str | None] | None
    members: int
    mean_score: float | None


class ExchangeRow(msgspec.Struct, frozen=True):
    """One logged exchange as the request explorer lists it (`exchanges`)."""

    id: str
    ts: dt.datetime
    trajectory_id: str | None
    turn: int | None
    scenario_id: str | None
    model_alias: str | None
    api_key_id: str | None
    arm: str | None
    checkpoint: str | None
    status: int
    error: str | None  # why it failed, as the proxy logged it (None: answered)
    latency_ms: float | None
    asked: str | None  # the request's last message, as text (a turn stores what it adds)
    feedback: int  # feedback posted on it


class Explore(msgspec.Struct, frozen=True, kw_only=True):
    """The request explorer's filters, each as its query parameter; unset: any."""

    api_key: str | None = None
    status: Literal["ok", "error"] | None = None
    arm: str | None = None
    scenario: str | None = None
    trajectory: str | None = None
    q: str | None = None  # text the request's new messages or the answer contain
    minutes: int | None = None  # only the last N minutes

    def params(self) -> Mapping[str, str]:
        """The filters set, for the pager's links."""
        return {k: str(v) for k, v in msgspec.structs.asdict(self).items() if v not in (None, "")}


class FeedbackRow(msgspec.Struct, frozen=True):
    """A feedback row with the conversation it is about (`feedback`)."""

    id: str
    ts: dt.datetime
    metric: str | None
    value: float
    comment: str | None
    api_key_id: str | None
    exchange_id: str | None
    trajectory_id: str | None


class CheckpointRow(msgspec.Struct, frozen=True):
    """A checkpoint with its training run and what it served (`checkpoints`)."""

    name: str
    status: str
    parent: str | None
    created: dt.datetime | None
    lineage: str | None  # the lineage its run trained (`alias` or `alias@tenant`)
    groups: int | None  # groups it was trained on
    duration_s: float | None
    kl_to_base: float | None
    served: int  # production exchanges it answered
    errors: int


def traffic(store: Store, minutes: int) -> list[Traffic]:
    """Per alias and arm over the last `minutes`: requests, errors, latency percentiles,
    tokens (production traffic only)."""
    return store.rows(
        Traffic,
        """
        SELECT coalesce(model_alias, '') AS alias, coalesce(arm, '') AS arm,
               count(*) AS requests,
               count(*) FILTER (WHERE status >= 400) AS errors,
               quantile_cont(latency_ms, 0.5) FILTER (WHERE status < 400) AS p50_ms,
               quantile_cont(latency_ms, 0.95) FILTER (WHERE status < 400) AS p95_ms,
               quantile_cont(latency_ms, 0.99) FILTER (WHERE status < 400) AS p99_ms,
               coalesce(sum(CAST(usage->>'$.prompt_tokens' AS BIGINT)), 0) AS prompt_tokens,
               coalesce(sum(CAST(usage->>'$.completion_tokens' AS BIGINT)), 0)
                   AS completion_tokens
        FROM exchanges
        WHERE source = 'production' AND ts >= now() - to_minutes(CAST(? AS BIGINT))
        GROUP BY ALL ORDER BY alias, arm
        """,
        [minutes],
    )


class Minute(msgspec.Struct, frozen=True):
    """One bucket of one alias on the overview's chart (`per_minute`): requests and errors
    per minute in it."""

    minute: dt.datetime
    alias: str
    requests: float
    errors: float


def per_minute(store: Store, minutes: int) -> list[Minute]:
    """Requests and errors per minute and alias over the last `minutes`, every bucket of
    the window given (a quiet one as 0, so the chart shows the gap), in at most ~240
    buckets: one minute each up to four hours, wider beyond (still per minute)."""
    width = max(1, -(-minutes // 240))
    return store.rows(
        Minute,
        """
        WITH counts AS (
            SELECT time_bucket(to_minutes(CAST($width AS BIGINT)), ts) AS minute,
                   coalesce(model_alias, '') AS alias,
                   count(*) AS requests, count(*) FILTER (WHERE status >= 400) AS errors
            FROM exchanges
            WHERE source = 'production' AND ts >= now() - to_minutes(CAST($minutes AS BIGINT))
            GROUP BY ALL
        ), buckets AS (
            SELECT unnest(generate_series(
                time_bucket(to_minutes(CAST($width AS BIGINT)),
                            now() - to_minutes(CAST($minutes AS BIGINT))),
                time_bucket(to_minutes(CAST($width AS BIGINT)), now()),
                to_minutes(CAST($width AS BIGINT)))) AS minute
        )
        SELECT b.minute, a.alias,
               coalesce(c.requests, 0) / $width AS requests,
               coalesce(c.errors, 0) / $width AS errors
        FROM buckets b CROSS JOIN (SELECT DISTINCT alias FROM counts) a
        LEFT JOIN counts c ON c.minute = b.minute AND c.alias = a.alias
        ORDER BY b.minute, a.alias
        """,
        {"width": width, "minutes": minutes},
    )


class Totals(msgspec.Struct, frozen=True, kw_only=True):
    """The overview's counts: production exchanges (and of them the untrainable), the
    conversations, scenarios, groups and checkpoints."""

    exchanges: int
    untrainable: int
    trajectories: int
    scenarios: int
    groups: int
    checkpoints: int


def totals(store: Store) -> Totals:
    return store.rows(
        Totals,
        """
        SELECT (SELECT count(*) FROM exchanges WHERE source = 'production') AS exchanges,
               -- answered, logged, and kept from training (`onjob.logprobs.untrainable`)
               (SELECT count(*) FROM exchanges
                WHERE source = 'production' AND untrainable IS NOT NULL) AS untrainable,
               (SELECT count(*) FROM trajectories) AS trajectories,
               (SELECT count(*) FROM scenarios) AS scenarios,
               (SELECT count(*) FROM groups) AS groups,
               (SELECT count(*) FROM checkpoints) AS checkpoints
        """,
    )[0]


def scenarios(store: Store, page: int) -> list[ScenarioRow]:
    """The busiest scenarios, with their groups' mean combined score."""
    return store.rows(
        ScenarioRow,
        """
        WITH scored AS (
            SELECT g.scenario_id, count(DISTINCT g.id) AS groups, avg(s.score) AS mean_score
            FROM groups g JOIN scores s ON s.group_id = g.id AND s.source = 'combined'
            GROUP BY ALL
        )
        SELECT sc.id, sc.key, sc.count, sc.first_seen,
               coalesce(scored.groups, 0) AS groups, scored.mean_score
        FROM scenarios sc LEFT JOIN scored ON scored.scenario_id = sc.id
        ORDER BY sc.count DESC, sc.id LIMIT ? OFFSET ?
        """,
        [PAGE, page * PAGE],
    )


def groups(store: Store, page: int, kind: str | None = None) -> list[GroupRow]:
    return store.rows(
        GroupRow,
        """
        SELECT g.id, g.kind, g.status, g.reason, g.created, g.scenario_id, g.checkpoints,
               (SELECT count(*) FROM members m WHERE m.group_id = g.id) AS members,
               (SELECT avg(score) FROM scores s
                WHERE s.group_id = g.id AND s.source = 'combined') AS mean_score
        FROM groups g
        WHERE ? IS NULL OR g.kind = ?
        ORDER BY g.created DESC, g.id LIMIT ? OFFSET ?
        """,
        [kind, kind, PAGE, page * PAGE],
    )


class MemberScore(msgspec.Struct, frozen=True):
    """One source's score of a member, with the judge's explanation (`group`)."""

    member_id: str
    source: str
    score: float
    explanation: str | None


class JudgeCall(msgspec.Struct, frozen=True):
    """One call of a judge on a group (`group`)."""

    judge: str
    status: str
    error: str | None
    attempts: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None
    latency_ms: float | None
    created: dt.datetime | None


class _Group(msgspec.Struct, frozen=True, kw_only=True):
    """A `groups` row as its page heads it (`group`)."""

    id: str
    kind: str
    status: str
    reason: str | None
    scenario_id: str | None
    created: dt.datetime | None


class _Member(msgspec.Struct, frozen=True, kw_only=True):
    """A member with its exchange's logged answer, JSON text (`group`)."""

    id: str
    position: int
    origin: str
    choice: int | None
    exchange_id: str
    trajectory_id: str | None
    checkpoint: str | None
    response: str | None


class GroupMember(msgspec.Struct, frozen=True, kw_only=True):
    """A member of a group with the answer it is judged on and its scores (`group`)."""

    id: str
    position: int
    origin: str
    choice: int | None
    exchange_id: str
    trajectory_id: str | None
    checkpoint: str | None
    message: dict  # the answer in OpenAI's message shape, as the prompt's messages are
    scores: list[MemberScore]


class GroupPage(msgspec.Struct, frozen=True, kw_only=True):
    """A group as its page shows it (`group`)."""

    id: str
    kind: str
    status: str
    reason: str | None
    scenario_id: str | None
    created: dt.datetime | None
    members: list[GroupMember]
    judgements: list[JudgeCall]
    prompt: list[dict]  # the messages a turn or pair group's members answer


def group(store: Store, group_id: str) -> GroupPage | None:
    """A group, its members (each with the answer it is judged on and its scores by
    source, with the judge's explanation) and the judge's calls."""
    found = store.rows(
        _Group,
        "SELECT id, kind, status, reason, scenario_id, created FROM groups WHERE id = ?",
        [group_id],
    )
    if not found:
        return None
    rows = store.rows(
        _Member,
        """
        SELECT m.id, m.position, m.origin, m.choice, m.exchange_id,
               coalesce(m.trajectory_id, e.trajectory_id) AS trajectory_id,
               e.checkpoint, e.response
        FROM members m JOIN exchanges e ON e.id = m.exchange_id
        WHERE m.group_id = ? ORDER BY m.position
        """,
        [group_id],
    )
    scores = store.rows(
        MemberScore,
        "SELECT member_id, source, score, explanation FROM scores WHERE group_id = ? "
        "ORDER BY source",
        [group_id],
    )
    members = []
    for r in rows:
        choices = (json_value(r.response) or {}).get("choices") or []
        message = next((c.get("message") for c in choices if c.get("index") == r.choice), {})
        members.append(
            GroupMember(
                id=r.id,
                position=r.position,
                origin=r.origin,
                choice=r.choice,
                exchange_id=r.exchange_id,
                trajectory_id=r.trajectory_id,
                checkpoint=r.checkpoint,
                message=message or {},
                scores=[s for s in scores if s.member_id == r.id],
            )
        )
    judgements = store.rows(
        JudgeCall,
        "SELECT judge, status, error, attempts, prompt_tokens, completion_tokens, cost_usd, "
        "latency_ms, created FROM judgements WHERE group_id = ? ORDER BY created",
        [group_id],
    )
    head = found[0]
    return GroupPage(
        id=head.id,
        kind=head.kind,
        status=head.status,
        reason=head.reason,
        scenario_id=head.scenario_id,
        created=head.created,
        members=members,
        judgements=judgements,
        prompt=_prompt(store, head.kind, rows),
    )


def _prompt(store: Store, kind: str, members: list[_Member]) -> list[dict]:
    """The messages a turn or pair group's members answer (one prompt, whole: a turn's
    request rebuilt from what its conversation stored); a trajectory group's members are
    whole conversations, each on its own page."""
    if kind == "trajectory" or not members:
        return []
    found = store.column(
        "SELECT request FROM exchanges_rebuilt([?], false)", [members[0].exchange_id]
    )
    request = json_value(found[0]) if found else None
    return list((request or {}).get("messages") or [])


class Turn(msgspec.Struct, kw_only=True):
    """One turn of a conversation: its exchange as served (`trajectory`)."""

    id: str
    turn: int | None
    ts: dt.datetime
    checkpoint: str | None
    served_model: str | None
    arm: str | None
    status: int
    latency_ms: float | None
    error: str | None
    tools: list[dict] | None = None  # the tools its request offered


class Posted(msgspec.Struct, frozen=True):
    """Feedback on a conversation or one of its turns (None: the whole) (`trajectory`)."""

    ts: dt.datetime
    metric: str | None
    value: float
    comment: str | None
    turn: int | None


class TurnScore(msgspec.Struct, frozen=True):
    """A score of a logged answer of the conversation, in one of its groups (`trajectory`)."""

    group_id: str
    kind: str
    turn: int | None
    source: str
    score: float
    explanation: str | None


class _Head(msgspec.Struct, frozen=True, kw_only=True):
    """A conversation's `trajectories` row, or the same made from its exchanges
    (`trajectory`)."""

    id: str
    scenario_id: str | None
    n_turns: int
    first_ts: dt.datetime | None
    last_ts: dt.datetime | None


class _Served(msgspec.Struct, frozen=True, kw_only=True):
    """An exchange of the conversation with its request rebuilt and its answer, JSON text
    (`trajectory`)."""

    id: str
    turn: int | None
    ts: dt.datetime
    checkpoint: str | None
    served_model: str | None
    arm: str | None
    status: int
    latency_ms: float | None
    error: str | None
    request: str | None
    response: str | None


class Conversation(msgspec.Struct, kw_only=True):
    """A conversation as its page shows it (`trajectory`)."""

    id: str
    scenario_id: str | None
    n_turns: int  # answered turns: 0 for a conversation whose every request failed
    first_ts: dt.datetime | None
    last_ts: dt.datetime | None
    turns: list[Turn]
    messages: list[dict]  # the longest request's messages and the last answer, as sent
    feedback: list[Posted]
    scores: list[TurnScore]


def trajectory(store: Store, trajectory_id: str) -> Conversation | None:
    """A conversation: its turns in order, and the messages of its longest request plus
    the last answer, for reading as one dialogue. A failed exchange is no turn, so a
    conversation whose every request failed (its first one refused, the engine down) has
    no `trajectories` row: it is shown from its exchanges, with their errors."""
    found = store.rows(
        _Head,
        "SELECT id, scenario_id, n_turns, first_ts, last_ts FROM trajectories WHERE id = ?",
        [trajectory_id],
    ) or store.rows(
        _Head,
        "SELECT trajectory_id AS id, any_value(scenario_id) AS scenario_id, 0 AS n_turns, "
        "min(ts) AS first_ts, max(ts) AS last_ts FROM exchanges "
        "WHERE trajectory_id = ? AND source = 'production' GROUP BY trajectory_id",
        [trajectory_id],
    )
    if not found:
        return None
    rows = store.rows(
        _Served,
        "SELECT id, turn, ts, checkpoint, served_model, arm, status, latency_ms, error, request, "
        "response FROM exchanges_rebuilt((SELECT list(id) FROM exchanges WHERE trajectory_id = ? "
        "AND source = 'production'), false) ORDER BY turn, ts",
        [trajectory_id],
    )
    messages: list[dict] = []
    turns = []
    for t in rows:
        request = json_value(t.request) or {}
        response = json_value(t.response) or {}
        asked = request.get("messages") or []
        if len(asked) >= len(messages):
            messages = list(asked)
        choices = response.get("choices") or []
        if choices and choices[0].get("message"):
            messages.append({**choices[0]["message"], "turn": t.turn})
        turns.append(
            Turn(
                id=t.id,
                turn=t.turn,
                ts=t.ts,
                checkpoint=t.checkpoint,
                served_model=t.served_model,
                arm=t.arm,
                status=t.status,
                latency_ms=t.latency_ms,
                error=t.error,
                tools=request.get("tools"),
            )
        )
    # What users said of it, and what the judges said of its logged answers.
    posted = store.rows(
        Posted,
        """
        SELECT f.ts, f.metric, f.value, f.comment, e.turn FROM feedback f
        LEFT JOIN exchanges e ON e.id = f.exchange_id
        WHERE f.trajectory_id = ? OR e.trajectory_id = ?
        ORDER BY f.ts
        """,
        [trajectory_id, trajectory_id],
    )
    scores = store.rows(
        TurnScore,
        """
        SELECT g.id AS group_id, g.kind, e.turn, s.source, s.score, s.explanation
        FROM members m JOIN groups g ON g.id = m.group_id
        JOIN exchanges e ON e.id = m.exchange_id
        JOIN scores s ON s.member_id = m.id
        WHERE m.origin <> 'sampled' AND coalesce(m.trajectory_id, e.trajectory_id) = ?
        ORDER BY e.turn, g.kind, g.id, s.source
        """,
        [trajectory_id],
    )
    head = found[0]
    return Conversation(
        id=head.id,
        scenario_id=head.scenario_id,
        n_turns=head.n_turns,
        first_ts=head.first_ts,
        last_ts=head.last_ts,
        turns=turns,
        messages=messages,
        feedback=posted,
        scores=scores,
    )


def exchanges(store: Store, f: Explore, page: int) -> list[ExchangeRow]:
    """A page of production exchanges, newest first, filtered by `f`."""
    text = f"%{f.q}%" if f.q else None
    return store.rows(
        ExchangeRow,
        """
        SELECT e.id, e.ts, e.trajectory_id, e.turn, e.scenario_id, e.model_alias,
               e.api_key_id, e.arm, e.checkpoint, e.status, e.error, e.latency_ms,
               left(coalesce(json_extract_string(e.request, '$.messages[#-1].content'),
                             json_extract_string(e.request, '$.prompt')), 200) AS asked,
               (SELECT count(*) FROM feedback fb WHERE fb.exchange_id = e.id) AS feedback
        FROM exchanges e
        WHERE e.source = 'production'
          AND ($key IS NULL OR e.api_key_id = $key)
          AND ($status IS NULL OR (e.status < 400) = ($status = 'ok'))
          AND ($arm IS NULL OR e.arm = $arm)
          AND ($scenario IS NULL OR e.scenario_id = $scenario)
          AND ($trajectory IS NULL OR e.trajectory_id = $trajectory)
          AND ($minutes IS NULL OR e.ts >= now() - to_minutes(CAST($minutes AS BIGINT)))
          AND ($text IS NULL OR CAST(e.request AS VARCHAR) ILIKE $text
               OR CAST(e.response AS VARCHAR) ILIKE $text)
        ORDER BY e.ts DESC, e.id LIMIT $limit OFFSET $offset
        """,
        {
            "key": f.api_key,
            "status": f.status,
            "arm": f.arm,
            "scenario": f.scenario,
            "trajectory": f.trajectory,
            "minutes": f.minutes,
            "text": text,
            "limit": PAGE,
            "offset": page * PAGE,
        },
    )


class MetricRow(msgspec.Struct, frozen=True):
    """One feedback metric (None: the unnamed): how much was posted, its mean, and when
    last (`feedback`)."""

    metric: str | None
    n: int
    mean: float
    last: dt.datetime


def feedback(store: Store, page: int) -> tuple[list[MetricRow], list[FeedbackRow]]:
    """Per metric (None: the unnamed), how much was posted and its mean; then a page of
    feedback rows, newest first, each with its conversation."""
    metrics = store.rows(
        MetricRow,
        "SELECT metric, count(*) AS n, avg(value) AS mean, max(ts) AS last FROM feedback "
        "GROUP BY metric ORDER BY metric NULLS FIRST",
    )
    found = store.rows(
        FeedbackRow,
        """
        SELECT f.id, f.ts, f.metric, f.value, f.comment, f.api_key_id, f.exchange_id,
               coalesce(f.trajectory_id, e.trajectory_id) AS trajectory_id
        FROM feedback f LEFT JOIN exchanges e ON e.id = f.exchange_id
        ORDER BY f.ts DESC, f.id LIMIT ? OFFSET ?
        """,
        [PAGE, page * PAGE],
    )
    return metrics, found


def checkpoints(store: Store) -> list[CheckpointRow]:
    """Every checkpoint, newest first: its run (lineage, groups, time, KL to the base
    model) and the production exchanges it answered."""
    return store.rows(
        CheckpointRow,
        """
        WITH served AS (
            SELECT checkpoint, count(*) AS served, count(*) FILTER (WHERE status >= 400) AS errors
            FROM exchanges WHERE source = 'production' AND checkpoint IS NOT NULL
            GROUP BY checkpoint
        )
        SELECT c.name, c.status, c.parent, c.created,
               r.config->>'lineage' AS lineage, len(r.groups_used) AS groups, r.duration_s,
               TRY_CAST(r.metrics->>'kl_to_base' AS DOUBLE) AS kl_to_base,
               coalesce(s.served, 0) AS served, coalesce(s.errors, 0) AS errors
        FROM checkpoints c
        LEFT JOIN train_runs r ON r.id = c.train_run
        LEFT JOIN served s ON s.checkpoint = c.name
        ORDER BY c.created DESC NULLS LAST, c.name LIMIT 200
        """,
    )


class TrainRunRow(msgspec.Struct, frozen=True):
    """A checkpoint with its training run (`train_runs`): `metrics` as JSON text."""

    name: str
    parent: str | None
    status: str
    created: dt.datetime | None
    duration_s: float | None
    metrics: str | None
    groups: int | None


def train_runs(store: Store) -> list[TrainRunRow]:
    return store.rows(
        TrainRunRow,
        """
        SELECT c.name, c.parent, c.status, c.created, r.duration_s, r.metrics,
               len(r.groups_used) AS groups
        FROM checkpoints c LEFT JOIN train_runs r ON r.id = c.train_run
        ORDER BY c.created DESC LIMIT 100
        """,
    )


class RewardPoint(msgspec.Struct, frozen=True):
    """One checkpoint's mean combined reward in one 5-minute bucket (`reward_curve`)."""

    bucket: dt.datetime
    checkpoint: str
    reward: float
    groups: int


def reward_curve(store: Store) -> list[RewardPoint]:
    """Mean combined reward of re-sampled groups per checkpoint and 5-minute bucket: the
    learning curve, at a size that does not grow with traffic."""
    return store.rows(
        RewardPoint,
        """
        SELECT time_bucket(INTERVAL 5 MINUTE, g.created) AS bucket,
               coalesce(g.checkpoints[1], 'base') AS checkpoint,
               avg(s.score) AS reward, count(DISTINCT g.id) AS groups
        FROM groups g JOIN scores s ON s.group_id = g.id AND s.source = 'combined'
        WHERE g.kind = 'turn' AND g.status = 'scored'
        GROUP BY ALL ORDER BY bucket
        """,
    )
