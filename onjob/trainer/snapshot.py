"""The trainer's input: scored groups exported from DuckDB to one Parquet file.

Runs where the database is (the server, or `onjob train --db` when no server
holds it); needs no torch. A row per member: its group, reward (the `combined`
score), the checkpoint that sampled it, its origin (logged or re-sampled) and the
temperature and top-p it was sampled at, and its turns as the engine saw them
(exchange ids, prompt token ids, sampled completion token ids, the sampler's
logprobs and their definition). A turn group's member has one turn; a conversation has
its turns up to the judged one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from ..collector import Store
from ..collector.scope import EVERY_KEY, KeyScope
from .settings import TrainSettings


class Exported(msgspec.Struct, frozen=True, kw_only=True):
    """What a snapshot written by `export` holds, for the server that trains on it."""

    path: str
    groups: list[str]  # their ids, sorted
    members: int
    sha256: str  # of the Parquet file
    live: str | None  # the checkpoint whose samples it takes (None: the base model)


# `turn_of`: every exchange a member trains on, in order: a turn group's member, its own
# exchange (and choice); a conversation's member, its production turns up to the judged
# one (the trajectory's last exchange when the group was formed). Turns logged after the
# judgement were not judged: they would inherit an advantage they did not earn. Every one
# of these exchanges must be sampled by an allowed checkpoint, not only the last. Their
# prompt token ids are rebuilt whole (`exchanges_rebuilt`: linear storage keeps only what a
# turn adds); `request`'s top-level fields (temperature, top_p) are stored on every row.
# No group with a member of a key outside the lineage's scope (`KeyScope`: another
# tenant's, or one in `proxy.untrained_keys`), nor one whose members are of several keys
# (made before groups were one key's): GRPO's advantage compares a group's members, so one
# key's answers would train on another's. A re-sampled member logged
# before samples carried their source's key has none, and counts as its group's logged one.
_MEMBERS = """
WITH spread AS (
    SELECT group_id, max(score) - min(score) AS spread FROM scores
    WHERE source = 'combined' GROUP BY group_id
), candidates AS (
    SELECT g.id, g.kind, g.created FROM groups g JOIN spread s ON s.group_id = g.id
    WHERE g.status = 'scored' AND g.kind <> 'ab' AND s.spread > ?
      AND NOT list_contains(?::VARCHAR[], coalesce(g.scenario_id, ''))
      AND NOT EXISTS (SELECT 1 FROM train_runs t WHERE list_contains(t.groups_used, g.id))
      AND NOT EXISTS (
          SELECT 1 FROM members m JOIN exchanges x ON x.id = m.exchange_id
          WHERE m.group_id = g.id GROUP BY m.group_id
          HAVING count(DISTINCT x.api_key_id) > 1 OR bool_or(NOT ({scope})))
), turn_of AS (
    SELECT m.id AS member_id, m.group_id, e.id AS exchange_id, m.choice, e.turn
    FROM members m JOIN candidates g ON g.id = m.group_id JOIN exchanges e ON e.id = m.exchange_id
    WHERE g.kind = 'turn'
    UNION ALL
    SELECT m.id, m.group_id, e.id, 0, e.turn
    FROM members m JOIN candidates g ON g.id = m.group_id
    JOIN exchanges judged ON judged.id = m.exchange_id
    JOIN exchanges e ON e.trajectory_id = m.trajectory_id AND e.turn <= judged.turn
    WHERE g.kind = 'trajectory' AND e.status < 400 AND e.source = 'production'
), eligible AS (
    SELECT g.* FROM candidates g
    WHERE NOT EXISTS (
        SELECT 1 FROM turn_of t JOIN exchanges e ON e.id = t.exchange_id
        WHERE t.group_id = g.id
          -- a member's turn from outside the lineage, or one not to be trained on
          AND (NOT list_contains(?, coalesce(e.checkpoint, '')) OR e.untrainable IS NOT NULL))
    ORDER BY g.created DESC LIMIT ?
), turns AS (
    SELECT t.member_id,
           list(e.prompt_token_ids ORDER BY t.turn, e.ts) AS prompt_ids,
           list(e.completion_token_ids[t.choice + 1] ORDER BY t.turn, e.ts) AS completion_ids,
           list(e.completion_logprobs[t.choice + 1] ORDER BY t.turn, e.ts) AS logprobs,
           list(e.id ORDER BY t.turn, e.ts) AS exchange_ids,
           list(e.logprobs_mode ORDER BY t.turn, e.ts) AS logprobs_modes
    FROM turn_of t JOIN eligible g ON g.id = t.group_id
    JOIN exchanges_rebuilt((SELECT list(t.exchange_id) FROM turn_of t JOIN eligible g
                            ON g.id = t.group_id), false) e ON e.id = t.exchange_id
    GROUP BY t.member_id
)
SELECT m.group_id, g.kind, m.id AS member_id, m.position, m.origin, m.choice,
       s.score AS reward, e.checkpoint,
       coalesce(TRY_CAST(json_extract_string(e.request, '$.temperature') AS DOUBLE), 1.0)
           AS temperature,
       coalesce(TRY_CAST(json_extract_string(e.request, '$.top_p') AS DOUBLE), 1.0) AS top_p,
       t.prompt_ids, t.completion_ids, t.logprobs, t.exchange_ids, t.logprobs_modes
FROM members m
JOIN eligible g ON g.id = m.group_id
JOIN exchanges e ON e.id = m.exchange_id
JOIN scores s ON s.member_id = m.id AND s.source = 'combined'
JOIN turns t ON t.member_id = m.id
ORDER BY g.created, m.group_id, m.position
"""


def lineage(store: Store, live: str | None, staleness: int) -> list[str | None]:
    """The live checkpoint and up to `staleness` ancestors (None: the base model)."""
    chain: list[str | None] = [live]
    while chain[-1] is not None and len(chain) <= staleness:
        parents = store.column("SELECT parent FROM checkpoints WHERE name = ?", [chain[-1]])
        chain.append(parents[0] if parents else None)
    return chain


def _members(store: Store, s: TrainSettings, live, held_out, scope: KeyScope) -> tuple[str, list]:
    """The members query for a lineage (its `live`, its keys' `scope`) and its parameters."""
    allowed = [name or "" for name in lineage(store, live, s.max_staleness)]
    condition, keys = scope.sql("x.api_key_id")
    sql = _MEMBERS.replace("{scope}", condition)
    return sql, [s.min_spread, list(held_out), *keys, allowed, s.max_groups]


class Ready(msgspec.Struct, frozen=True):
    """The groups a snapshot would take now, and how long the oldest of them has waited
    (None: no group)."""

    groups: int
    oldest_s: float | None


def trainable(
    store: Store,
    s: TrainSettings,
    *,
    live: str | None = None,
    held_out: list[str] = (),
    scope: KeyScope = EVERY_KEY,
) -> Ready:
    """What a snapshot would take now (none of the `held_out` scenarios, none with traffic
    of a key outside `scope`)."""
    sql, params = _members(store, s, live, held_out, scope)
    row = (  # fetchall: a DuckDB relation has no fetchone
        store.cursor()
        .sql(
            f"SELECT count(*), epoch(now()) - epoch(min(created)) FROM groups "
            f"WHERE id IN (SELECT DISTINCT group_id FROM ({sql}))",
            params=params,
        )
        .fetchall()
    )
    n, oldest = row[0]
    return Ready(n, None if oldest is None else float(oldest))


def export(
    store: Store,
    path: Path,
    s: TrainSettings,
    *,
    live: str | None = None,
    held_out: list[str] = (),
    scope: KeyScope = EVERY_KEY,
) -> Exported:
    """Write the snapshot, no group of a `held_out` scenario in it, none with traffic of a
    key outside `scope` (the lineage's keys, never `proxy.untrained_keys`); return what it
    holds."""
    import pyarrow.parquet as pq  # here: the server pays its ~40 MiB only when it trains

    sql, params = _members(store, s, live, held_out, scope)
    table = store.cursor().sql(sql, params=params).to_arrow_table()
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    groups = sorted(set(table.column("group_id").to_pylist()))
    return Exported(
        path=str(path),
        groups=groups,
        members=table.num_rows,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        live=live,
    )
