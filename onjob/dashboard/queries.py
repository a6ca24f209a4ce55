"""What the dashboard shows, as DuckDB queries: aggregates over a time window and pages of
rows, never whole tables, so a page stays fast with millions of exchanges."""

from __future__ import annotations

import datetime as dt

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


def per_minute(store: Store, minutes: int) -> list[dict]:
    """Requests and errors per minute and alias over the last `minutes`."""
    return store.query(
        """
        SELECT time_bucket(INTERVAL 1 MINUTE, ts) AS minute,
               coalesce(model_alias, '') AS alias,
               count(*) AS requests, count(*) FILTER (WHERE status >= 400) AS errors
        FROM exchanges
        WHERE source = 'production' AND ts >= now() - to_minutes(CAST(? AS BIGINT))
        GROUP BY ALL ORDER BY minute
        """,
        [minutes],
    )


def totals(store: Store) -> dict:
    return store.query(
        """
        SELECT (SELECT count(*) FROM exchanges WHERE source = 'production') AS exchanges,
               -- answered, logged, and kept from training (`onjob.logprobs.untrainable`)
               (SELECT count(*) FROM exchanges
                WHERE source = 'production' AND untrainable IS NOT NULL) AS untrainable,
               (SELECT count(*) FROM trajectories) AS trajectories,
               (SELECT count(*) FROM scenarios) AS scenarios,
               (SELECT count(*) FROM groups) AS groups,
               (SELECT count(*) FROM checkpoints) AS checkpoints
        """
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


def group(store: Store, group_id: str) -> dict | None:
    """A group, its members (each with the answer it is judged on and its scores by
    source, with the judge's explanation) and the judge's calls."""
    found = store.query("SELECT * FROM groups WHERE id = ?", [group_id])
    if not found:
        return None
    rows = store.query(
        """
        SELECT m.id, m.position, m.origin, m.choice, m.exchange_id,
               coalesce(m.trajectory_id, e.trajectory_id) AS trajectory_id,
               e.checkpoint, e.response
        FROM members m JOIN exchanges e ON e.id = m.exchange_id
        WHERE m.group_id = ? ORDER BY m.position
        """,
        [group_id],
    )
    scores = store.query(
        "SELECT member_id, source, score, explanation FROM scores WHERE group_id = ? "
        "ORDER BY source",
        [group_id],
    )
    members = []
    for r in rows:
        choices = (json_value(r.pop("response")) or {}).get("choices") or []
        message = next((c.get("message") for c in choices if c.get("index") == r["choice"]), {})
        mine = [s for s in scores if s["member_id"] == r["id"]]
        members.append({**r, "message": message or {}, "scores": mine})
    judgements = store.query(
        "SELECT judge, status, error, attempts, prompt_tokens, completion_tokens, cost_usd, "
        "latency_ms, created FROM judgements WHERE group_id = ? ORDER BY created",
        [group_id],
    )
    return {**found[0], "members": members, "judgements": judgements}


def trajectory(store: Store, trajectory_id: str) -> dict | None:
    """A conversation: its turns in order, and the messages of its longest request plus
    the last answer, for reading as one dialogue."""
    found = store.query("SELECT * FROM trajectories WHERE id = ?", [trajectory_id])
    if not found:
        return None
    turns = store.query(
        "SELECT id, turn, ts, checkpoint, served_model, arm, status, latency_ms, error, request, "
        "response FROM exchanges_rebuilt((SELECT list(id) FROM exchanges WHERE trajectory_id = ? "
        "AND source = 'production'), false) ORDER BY turn, ts",
        [trajectory_id],
    )
    messages: list[dict] = []
    for t in turns:
        request = json_value(t.pop("request")) or {}
        response = json_value(t.pop("response")) or {}
        asked = request.get("messages") or []
        if len(asked) >= len(messages):
            messages = list(asked)
        choices = response.get("choices") or []
        if choices and choices[0].get("message"):
            messages.append({**choices[0]["message"], "turn": t["turn"]})
        t["tools"] = request.get("tools")
    return {**found[0], "turns": turns, "messages": messages}


def train_runs(store: Store) -> list[dict]:
    return store.query(
        """
        SELECT c.name, c.parent, c.status, c.created, r.duration_s, r.metrics,
               len(r.groups_used) AS groups
        FROM checkpoints c LEFT JOIN train_runs r ON r.id = c.train_run
        ORDER BY c.created DESC LIMIT 100
        """
    )


def reward_curve(store: Store) -> list[dict]:
    """Mean combined reward of re-sampled groups per checkpoint and 5-minute bucket: the
    learning curve, at a size that does not grow with traffic."""
    return store.query(
        """
        SELECT time_bucket(INTERVAL 5 MINUTE, g.created) AS bucket,
               coalesce(g.checkpoints[1], 'base') AS checkpoint,
               avg(s.score) AS reward, count(DISTINCT g.id) AS groups
        FROM groups g JOIN scores s ON s.group_id = g.id AND s.source = 'combined'
        WHERE g.kind = 'turn' AND g.status = 'scored'
        GROUP BY ALL ORDER BY bucket
        """
    )
