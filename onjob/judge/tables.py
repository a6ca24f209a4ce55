"""The judge's reads and writes in DuckDB, as plain functions of a collector `Store`.

Run them on the collector's database thread (`await collector.query(fn)`): inside
`onjob serve` that thread is shared with the spool loader, so each function is one
short query or one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from .. import logprobs
from ..collector import Resample, Store
from ..collector.ids import new_id
from ..collector.scope import EVERY_KEY, KeyScope
from .rollouts import json_value
from .ruler import Judgement
from .sampling import Sample
from .settings import JudgeSettings

_FRESH = "e.ts > now() - to_seconds(CAST(? AS DOUBLE))"
# The exchange `e` is of no API key in `proxy.untrained_keys` (a list parameter): their
# traffic is logged, never re-sampled, grouped or judged.
_TRAINED_KEY = "NOT coalesce(list_contains(?::VARCHAR[], e.api_key_id), false)"

# The feedback a member carries, as SQL over `m` (members) and `g` (groups): what was
# posted on its exchange (a logged answer, never a re-sampled one) or, in a trajectory
# group, on its whole conversation; per metric ('' is the unnamed feedback), the mean of
# what was posted, as a list of {metric, value} (NULL: none). The scorer and `agreement`
# read the same.
# Whether an exchange's logged answer (`e`) called a tool.
CALLED = "coalesce(json_array_length(e.response -> '$.choices[0].message.tool_calls'), 0) > 0"

MEMBER_FEEDBACK = """(SELECT list({'metric': metric, 'value': value} ORDER BY metric)
                FROM (SELECT coalesce(f.metric, '') AS metric, avg(f.value) AS value
                      FROM feedback f
                      WHERE (m.origin <> 'sampled' AND f.exchange_id = m.exchange_id)
                         OR (g.kind = 'trajectory' AND f.trajectory_id = m.trajectory_id)
                      GROUP BY 1))"""


class LoggedTurn(msgspec.Struct, frozen=True, kw_only=True):
    """A logged turn a group is made on (`turn_candidates`, a release test's draw): what
    the judge re-samples (its request rebuilt whole, its prompt's token ids), the logged
    answer, and what the re-sampled exchange copies. JSON columns as their text."""

    id: str | None  # None: a request `onjob compare --file` read, never logged
    trajectory_id: str | None
    turn: int | None
    scenario_id: str | None
    api_key_id: str | None
    model_alias: str | None
    checkpoint: str | None
    arm: str | None
    request: str | None
    response: str | None
    prompt_token_ids: list[int] | None


# Its columns, for a SELECT over `exchanges_rebuilt` (as `e`).
LOGGED_TURN = ", ".join(f"e.{name}" for name in LoggedTurn.__struct_fields__)


class Finished(msgspec.Struct, frozen=True, kw_only=True):
    """A finished conversation a trajectory group may take (`scenario_candidates`): its
    last exchange, the member that stands for it, and whose it is."""

    id: str
    scenario_id: str | None
    last_exchange: str
    api_key_id: str | None


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """A sampled group waiting for its scores (`groups_to_score`)."""

    id: str
    kind: str


class MemberRow(msgspec.Struct, frozen=True, kw_only=True):
    """A member as the scorers read it (`members_of`): its exchange's request and answer
    (JSON text), the scenario key, and the feedback posted on it, per metric ('' the
    unnamed; None: none)."""

    member_id: str
    exchange_id: str
    choice: int | None
    trajectory_id: str | None
    origin: str
    kind: str
    request: str | None
    response: str | None
    scenario_key: str | None
    feedback: list[dict[str, float | str]] | None


class ExchangeOwner(msgspec.Struct, frozen=True, kw_only=True):
    """Whose an exchange is (`owners`): its API key and its `source`."""

    api_key_id: str | None
    source: str


def feedback_source(metric: str | None) -> str:
    """The score source of feedback of `metric`: `feedback`, or `feedback:<metric>`."""
    return f"feedback:{metric}" if metric else "feedback"


def turn_candidates(
    store: Store,
    s: JudgeSettings,
    skip: list[str] = (),
    untrained: list[str] = (),
    later: list[str] = (),
    scope: KeyScope = EVERY_KEY,
) -> list[LoggedTurn]:
    """Logged turns to re-sample: answered production chat exchanges (Responses API calls
    included: they are logged as the chat they became) no group has used, recent
    first, round-robin over scenarios (the `per_scenario` most recent of each, and besides
    those its `tool_turns_per_scenario` most recent turns whose logged answer called a
    tool), in each round the scenarios in `later` (`settled.settled_scenarios`) last, then
    those with fewer groups so far first; none of the scenarios in `skip`, none of the API
    keys in `untrained`, only keys of `scope` (a lineage's: its worker's pass).

    Tool-call turns have their own quota: in a tool agent's conversations they are most
    of the turns whose alternatives differ (a right call or a wrong one), while the
    answer turn after a failed call is often wrong whatever is sampled."""
    in_scope, scoped = scope.sql("e.api_key_id")
    return store.rows(
        LoggedTurn,
        f"""
        WITH t AS (
            SELECT e.id, e.scenario_id, e.ts, {CALLED} AS called
            FROM exchanges e
            WHERE e.status < 400 AND e.source = 'production' AND {_FRESH}
              AND e.untrainable IS NULL  -- `onjob.logprobs.untrainable`: nothing to learn from
              -- re-sampled through chat: a legacy completion's prompt has no messages
              AND e.api IS DISTINCT FROM 'completions'
              AND NOT coalesce(list_contains(?::VARCHAR[], e.scenario_id), false)
              AND {_TRAINED_KEY} AND {in_scope}
              AND NOT EXISTS (
                  SELECT 1 FROM groups g WHERE g.prefix_exchange = e.id AND g.kind = 'turn')
        ), c AS (
            SELECT *,
                   row_number() OVER (PARTITION BY scenario_id ORDER BY ts DESC) AS nth,
                   row_number() OVER (PARTITION BY scenario_id, called ORDER BY ts DESC) AS nth_of
            FROM t
        ), judged AS (SELECT scenario_id, count(*) AS n FROM groups GROUP BY scenario_id)
        SELECT {LOGGED_TURN} FROM c
        JOIN exchanges_rebuilt((SELECT list(id) FROM c
                                WHERE nth <= ? OR (called AND nth_of <= ?)), false) e
          ON e.id = c.id
        LEFT JOIN judged j ON j.scenario_id = c.scenario_id
        ORDER BY c.nth, coalesce(list_contains(?::VARCHAR[], c.scenario_id), false),
                 coalesce(j.n, 0), c.ts DESC
        LIMIT ?
        """,
        [
            s.max_age_s,
            list(skip),
            list(untrained),
            *scoped,
            s.per_scenario,
            s.tool_turns_per_scenario,
            list(later),
            s.max_groups,
        ],
    )


def add_turn_group(
    store: Store, prefix: LoggedTurn, sample: Sample | None, error: str | None = None
) -> str:
    """The logged answer's choices and the sampled alternatives as one group, with the
    sample as a `resample` exchange (same trajectory, turn and scenario); or, when the
    engine could not sample, a `failed` group so the turn is not retried forever."""
    group_id = new_id("group-")
    logged = len((json_value(prefix.response) or {}).get("choices") or ()) or 1
    with store.transaction() as con:
        con.execute(
            "INSERT INTO groups (id, scenario_id, prefix_exchange, kind, checkpoints, status, "
            "reason, created) VALUES (?, ?, ?, 'turn', ?, ?, ?, now())",
            [
                group_id,
                prefix.scenario_id,
                prefix.id,
                [prefix.checkpoint],
                "sampled" if sample else "failed",
                error,
            ],
        )
        members = [(prefix.id, c, "logged") for c in range(logged)]
        if sample is not None:
            _insert_sample(store, prefix, sample, group_id, prefix.checkpoint)
            members += [(sample.id, c, "sampled") for c in range(sample.n)]
        _add_members(con, group_id, prefix.trajectory_id, members)
    return group_id


def add_ab_group(
    store: Store, prefix: LoggedTurn, samples: dict[str, tuple[str | None, Sample]], *, test: str
) -> str:
    """A paired comparison: for one logged request, each arm's samples (arm -> (checkpoint,
    sample)) in one group, judged together; members' `origin` is their arm. `test` names
    the comparison the pair is evidence for."""
    group_id = new_id("group-")
    with store.transaction() as con:
        con.execute(
            "INSERT INTO groups (id, scenario_id, prefix_exchange, kind, checkpoints, status, "
            "created, test) VALUES (?, ?, ?, 'ab', ?, 'sampled', now(), ?)",
            [
                group_id,
                prefix.scenario_id,
                prefix.id,
                [c for c, _ in samples.values()],
                test,
            ],
        )
        members = []
        for arm, (checkpoint, sample) in samples.items():
            _insert_sample(store, prefix, sample, group_id, checkpoint)
            members += [(sample.id, c, arm) for c in range(sample.n)]
        _add_members(con, group_id, prefix.trajectory_id, members)
    return group_id


def add_failed_ab_group(
    store: Store,
    prefix: LoggedTurn,
    checkpoints: list[str | None],
    *,
    test: str,
    arm: str,
    reason: str,
) -> str:
    """A pair that could not be sampled: `arm` ("a", "b", or "both") failed to answer. It
    stays in the record so the comparison can count it (`deploy.decide.pairs`)."""
    group_id = new_id("group-")
    store.con.execute(
        "INSERT INTO groups (id, scenario_id, prefix_exchange, kind, checkpoints, status, "
        "reason, created, test, failed_arm) VALUES (?, ?, ?, 'ab', ?, 'failed', ?, now(), ?, ?)",
        [group_id, prefix.scenario_id, prefix.id, checkpoints, reason, test, arm],
    )
    return group_id


@dataclass(frozen=True)
class Conversations:
    """Finished conversations of one scenario and one API key: a trajectory group to be."""

    scenario_id: str
    api_key_id: str | None
    trajectories: list[Finished]


def scenario_candidates(
    store: Store,
    s: JudgeSettings,
    skip: list[str] = (),
    untrained: list[str] = (),
    scope: KeyScope = EVERY_KEY,
) -> list[Conversations]:
    """Finished production conversations in no trajectory group yet, by scenario and API
    key (a scenario is one key's, and one made before that rule, or before a server had
    keys, may hold several keys' conversations: they are never put in one group), with at
    least `min_trajectories` in it (the most recent `max_trajectories`); none of the
    scenarios in `skip`, none of the API keys in `untrained`, only keys of `scope`."""
    in_scope, scoped = scope.sql("e.api_key_id")
    # The key is the last exchange's, looked up for the few trajectories in no group yet:
    # joined before that filter, the lookup cost a pass 206 ms CPU against 81 ms with no
    # key at all, and 84 ms materialised first (`bench/scale/tenant_queries.py`: 1M exchanges,
    # 200 conversations to group).
    rows = store.rows(
        Finished,
        f"""
        WITH t AS MATERIALIZED (
            SELECT t.id, t.scenario_id, t.last_exchange, t.last_ts FROM trajectories t
            WHERE t.source = 'production'
              AND t.last_ts < now() - to_seconds(CAST(? AS DOUBLE))
              AND NOT coalesce(list_contains(?::VARCHAR[], t.scenario_id), false)
              AND NOT EXISTS (
                  SELECT 1 FROM members m JOIN groups g ON g.id = m.group_id
                  WHERE g.kind = 'trajectory' AND m.trajectory_id = t.id)
        )
        SELECT t.id, t.scenario_id, t.last_exchange, e.api_key_id
        FROM t JOIN exchanges e ON e.id = t.last_exchange
        WHERE {_TRAINED_KEY} AND {in_scope}
        ORDER BY t.last_ts DESC
        """,
        [s.settled_s(), list(skip), list(untrained), *scoped],
    )
    by_tenant: dict[tuple[str | None, str | None], list[Finished]] = {}
    for row in rows:
        mine = by_tenant.setdefault((row.scenario_id, row.api_key_id), [])
        if len(mine) < s.max_trajectories:
            mine.append(row)
    ready = [
        Conversations(scenario_id, key, trajectories)
        for (scenario_id, key), trajectories in by_tenant.items()
        if len(trajectories) >= s.min_trajectories
    ]
    return ready[: s.max_groups]


def add_trajectory_group(store: Store, scenario_id: str, trajectories: list[Finished]) -> str:
    group_id = new_id("group-")
    with store.transaction() as con:
        con.execute(
            "INSERT INTO groups (id, scenario_id, kind, checkpoints, status, created) "
            "SELECT ?, ?, 'trajectory', list(DISTINCT checkpoint), 'sampled', now() "
            "FROM trajectories WHERE id IN (SELECT unnest(?))",
            [group_id, scenario_id, [t.id for t in trajectories]],
        )
        for position, t in enumerate(trajectories):
            con.execute(
                "INSERT INTO members VALUES (?, ?, ?, ?, 0, ?, 'production')",
                [new_id("member-"), group_id, position, t.last_exchange, t.id],
            )
    return group_id


def groups_to_score(store: Store, limit: int, scope: KeyScope = EVERY_KEY) -> list[Pending]:
    """The judge pass's work: sampled groups, never `ab` pairs, of `scope`'s keys (a group
    is its first member's key's). A pair is evidence for a release test and is judged by
    that test's referee (`deploy.decide.pairs`), which retries the ones left unscored;
    scored here with the coach's settings, it would be judged by the reward the candidate
    was trained on."""
    if scope == EVERY_KEY:
        return store.rows(
            Pending,
            "SELECT id, kind FROM groups WHERE status = 'sampled' AND kind <> 'ab' "
            "ORDER BY created LIMIT ?",
            [limit],
        )
    in_scope, scoped = scope.sql("e.api_key_id")
    return store.rows(
        Pending,
        f"""
        SELECT g.id, g.kind FROM groups g
        WHERE g.status = 'sampled' AND g.kind <> 'ab' AND EXISTS (
            SELECT 1 FROM members m JOIN exchanges e ON e.id = m.exchange_id
            WHERE m.group_id = g.id AND m.position = 0 AND {in_scope})
        ORDER BY g.created LIMIT ?
        """,
        [*scoped, limit],
    )


def members_of(store: Store, group_id: str) -> list[MemberRow]:
    """Each member with what scorers need: its exchange's request and answer, the scenario
    key, and the feedback posted on it (on the exchange; for a whole conversation, on the
    trajectory too)."""
    return store.rows(
        MemberRow,
        f"""
        SELECT m.id AS member_id, m.exchange_id, m.choice, m.trajectory_id, m.origin, g.kind,
               e.request, e.response, s.key AS scenario_key,
               {MEMBER_FEEDBACK} AS feedback
        FROM members m
        JOIN groups g ON g.id = m.group_id
        JOIN exchanges_rebuilt(
            (SELECT list(exchange_id) FROM members WHERE group_id = ?), false
        ) e ON e.id = m.exchange_id
        LEFT JOIN scenarios s ON s.id = e.scenario_id
        WHERE m.group_id = ?
        ORDER BY m.position
        """,
        [group_id, group_id],
    )


def owners(store: Store, exchange_ids: list[str]) -> list[ExchangeOwner]:
    """Whose each exchange is: its `api_key_id` and `source` (`tenants.member_keys`).

    A query of its own, the ids as constants: under 1 ms CPU on 1M exchanges, where reading
    the key in `members_of` cost +29 ms a group (each column that query reads is read for
    every exchange) and joining the group's prefix's key there +114 ms."""
    ids = sorted(set(exchange_ids))
    if not ids:
        return []
    marks = ", ".join("?" * len(ids))
    return store.rows(
        ExchangeOwner, f"SELECT api_key_id, source FROM exchanges WHERE id IN ({marks})", ids
    )


def cached_result(store: Store, cache_key: str) -> Mapping[str, tuple[float, str]] | None:
    """What the judge said of these answers before (`ruler.result_by_content`); None when
    it has not, or when the row is not one this version reads (judged again then)."""
    results = store.column(
        "SELECT result FROM judgements WHERE cache_key = ? AND status = 'ok' "
        "ORDER BY created DESC LIMIT 1",
        [cache_key],
    )
    if not results:
        return None
    try:
        return msgspec.convert(json_value(results[0]), dict[str, tuple[float, str]])
    except msgspec.ValidationError:
        return None


def save_scores(
    store: Store,
    group_id: str,
    *,
    status: str,
    reason: str | None,
    judgements: list[tuple[Judgement, dict | None]],
    scores: list[tuple[str, str, float, str | None]],
) -> None:
    """One group's outcome in one transaction: the judge calls (with what a cache hit would
    reuse), a row per (member, source, score, explanation), and the group's status."""
    with store.transaction() as con:
        # A group judged again (`deploy/pairs.rejudge`) keeps only this attempt's scores.
        con.execute("DELETE FROM scores WHERE group_id = ?", [group_id])
        judgement_ids = {}
        for j, result in judgements:
            judgement_ids[j.judge] = new_id("judgement-")
            con.execute(
                "INSERT INTO judgements VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now())",
                [
                    judgement_ids[j.judge],
                    group_id,
                    j.judge,
                    j.cache_key,
                    j.order,
                    j.status,
                    j.error,
                    j.attempts,
                    j.prompt_tokens,
                    j.completion_tokens,
                    j.cost_usd,
                    j.latency_ms,
                    j.answer,
                    json.dumps(result) if result is not None else None,
                ],
            )
        keys = {j.judge: j.cache_key for j, _ in judgements}
        for member_id, source, value, explanation in scores:
            con.execute(
                "INSERT INTO scores (id, group_id, member_id, source, score, explanation, "
                "cache_key, created, judgement_id) VALUES (?, ?, ?, ?, ?, ?, ?, now(), ?)",
                [
                    new_id("score-"),
                    group_id,
                    member_id,
                    source,
                    value,
                    explanation,
                    keys.get(source),
                    judgement_ids.get(source),
                ],
            )
        con.execute(
            "UPDATE groups SET status = ?, reason = ?, scored_at = now(), "
            "attempts = coalesce(attempts, 0) + 1 WHERE id = ?",
            [status, reason, group_id],
        )


def _insert_sample(
    store: Store, prefix: LoggedTurn, sample: Sample, group_id: str, checkpoint
) -> None:
    """A re-sampled answer as a `resample` exchange in the logged turn's place, of the same
    API key (its prompt is that key's): the tenant checks read it (`tenants.refusal`)."""
    store.add_resample(
        Resample(
            id=sample.id,
            ts=sample.ts,
            trajectory_id=prefix.trajectory_id,
            turn=prefix.turn,
            scenario_id=prefix.scenario_id,
            api_key_id=prefix.api_key_id,
            model_alias=prefix.model_alias,
            checkpoint=checkpoint,
            arm=prefix.arm,
            request=json.dumps(sample.request),
            response=json.dumps(sample.response),
            prompt_token_ids=sample.prompt_token_ids,
            completion_token_ids=sample.completion_token_ids,
            completion_logprobs=sample.completion_logprobs,
            usage=json.dumps(sample.usage),
            latency_ms=sample.latency_ms,
            metadata=json.dumps({"group_id": group_id, "resample_of": prefix.id}),
            logprobs_mode=sample.logprobs_mode,
            untrainable=logprobs.untrainable(
                sample.logprobs_mode,
                sample.completion_token_ids,
                sample.completion_logprobs,
                sample.usage,
            ),
        )
    )


def _add_members(con, group_id: str, trajectory_id: str, members: list[tuple]) -> None:
    for position, (exchange_id, choice, origin) in enumerate(members):
        con.execute(
            "INSERT INTO members VALUES (?, ?, ?, ?, ?, ?, ?)",
            [new_id("member-"), group_id, position, exchange_id, choice, trajectory_id, origin],
        )
