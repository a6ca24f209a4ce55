"""The trainer's input: scored groups exported from DuckDB to one Parquet file.

Runs where the database is (the server, or `onjob train --db` when no server
holds it); needs no torch. A row per member: its group, reward (the `combined`
score), the checkpoint that sampled it, and its turns as the engine saw them
(prompt token ids, sampled completion token ids, the sampler's logprobs). A turn
group's member has one turn; a conversation has all its turns.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.parquet as pq

from ..collector import Store
from .settings import TrainSettings

_MEMBERS = """
WITH spread AS (
    SELECT group_id, max(score) - min(score) AS spread FROM scores
    WHERE source = 'combined' GROUP BY group_id
), eligible AS (
    SELECT g.id, g.kind, g.created FROM groups g JOIN spread s ON s.group_id = g.id
    WHERE g.status = 'scored' AND g.kind <> 'ab' AND s.spread > ?
      AND NOT EXISTS (SELECT 1 FROM train_runs t WHERE list_contains(t.groups_used, g.id))
      AND NOT EXISTS (
          SELECT 1 FROM members m JOIN exchanges e ON e.id = m.exchange_id
          WHERE m.group_id = g.id AND NOT list_contains(?, coalesce(e.checkpoint, '')))
    ORDER BY g.created DESC LIMIT ?
), turns AS (
    SELECT m.id AS member_id, [e.prompt_token_ids] AS prompt_ids,
           [e.completion_token_ids[m.choice + 1]] AS completion_ids,
           [e.completion_logprobs[m.choice + 1]] AS logprobs
    FROM members m JOIN eligible g ON g.id = m.group_id JOIN exchanges e ON e.id = m.exchange_id
    WHERE g.kind = 'turn'
), conversations AS (
    SELECT m.id AS member_id,
           list(e.prompt_token_ids ORDER BY e.turn) AS prompt_ids,
           list(e.completion_token_ids[1] ORDER BY e.turn) AS completion_ids,
           list(e.completion_logprobs[1] ORDER BY e.turn) AS logprobs
    FROM members m JOIN eligible g ON g.id = m.group_id
    JOIN exchanges e ON e.trajectory_id = m.trajectory_id
    WHERE g.kind = 'trajectory' AND e.status < 400 AND e.source = 'production'
    GROUP BY m.id
)
SELECT m.group_id, g.kind, m.id AS member_id, m.position, s.score AS reward,
       e.checkpoint, t.prompt_ids, t.completion_ids, t.logprobs
FROM members m
JOIN eligible g ON g.id = m.group_id
JOIN exchanges e ON e.id = m.exchange_id
JOIN scores s ON s.member_id = m.id AND s.source = 'combined'
JOIN (SELECT * FROM turns UNION ALL SELECT * FROM conversations) t ON t.member_id = m.id
ORDER BY g.created, m.group_id, m.position
"""


def lineage(store: Store, live: str | None, staleness: int) -> list[str | None]:
    """The live checkpoint and up to `staleness` ancestors (None: the base model)."""
    chain: list[str | None] = [live]
    while chain[-1] is not None and len(chain) <= staleness:
        rows = store.query("SELECT parent FROM checkpoints WHERE name = ?", [chain[-1]])
        chain.append(rows[0]["parent"] if rows else None)
    return chain


def trainable(store: Store, s: TrainSettings, *, live: str | None = None) -> int:
    """How many groups a snapshot would take now."""
    allowed = [name or "" for name in lineage(store, live, s.max_staleness)]
    row = (  # fetchall: a DuckDB relation has no fetchone
        store.con.cursor()
        .sql(
            f"SELECT count(DISTINCT group_id) AS n FROM ({_MEMBERS})",
            params=[s.min_spread, allowed, s.max_groups],
        )
        .fetchall()
    )
    return row[0][0]


def export(store: Store, path: Path, s: TrainSettings, *, live: str | None = None) -> dict:
    """Write the snapshot; return what it holds (`groups`, `members`, `sha256`)."""
    allowed = [name or "" for name in lineage(store, live, s.max_staleness)]
    params = [s.min_spread, allowed, s.max_groups]
    table = store.con.cursor().sql(_MEMBERS, params=params).to_arrow_table()
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    groups = sorted(set(table.column("group_id").to_pylist()))
    return {
        "path": str(path),
        "groups": groups,
        "members": table.num_rows,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "live": live,
    }
