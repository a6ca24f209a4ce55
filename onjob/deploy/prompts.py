"""Which logged prompts a candidate's test may use: ones it cannot have trained on.

Every source is production turns of the alias, of the lineage's own API keys (its tenant's,
or for the shared lineage every key no tenant holds; never one in `proxy.untrained_keys`:
`Lineage.scope`), in no conversation the checkpoints' training snapshots hold
(`TRAINED_CONVERSATIONS`: an answer a checkpoint was trained towards is not evidence about
it), in no conversation the test already drew from (turns of one conversation are not
independent evidence), in no conversation any turn of which another arm answered (a
canary's, or a rolled-back sibling's, answers in its history are not live's), one turn per
conversation, any turn (tool-call turns included). Both the turn and the conversations
are drawn at random, by a hash of their ids and the test's name, so a resumed test draws
the same ones: a sample of the traffic the source holds (each scenario, hour and kind of
turn as often as it was logged), not its newest conversations. Two sources:

- `held_out`: the held-out slice's scenarios (`holdout`), whenever logged;
- `fresh`: any scenario, logged on the live arm after `since` (the candidate's training
  snapshot), which no snapshot of its lineage can hold and whose answers it did not shape.
"""

from __future__ import annotations

from datetime import datetime

from ..collector import rebuilt
from ..proxy.tenants import Lineage

# Conversations in the training snapshot of a checkpoint or any of its ancestors: the
# lineage's train runs, their groups, and every conversation those groups' members are in.
TRAINED_CONVERSATIONS = """
WITH RECURSIVE chain(name) AS (
    SELECT unnest(?::VARCHAR[])
    UNION
    SELECT c.parent FROM checkpoints c JOIN chain ON c.name = chain.name
    WHERE c.parent IS NOT NULL
), trained AS (
    SELECT unnest(t.groups_used) AS group_id
    FROM checkpoints c JOIN chain ON c.name = chain.name JOIN train_runs t ON t.id = c.train_run
)
SELECT DISTINCT m.trajectory_id FROM members m JOIN trained ON trained.group_id = m.group_id
WHERE m.trajectory_id IS NOT NULL
"""


def held_out(
    store,
    lineage: Lineage,
    scenarios: list[str],
    n: int,
    *,
    chain: list[str | None] | tuple = (),
    tests: list[str] | tuple = (),
) -> list[dict]:
    """Up to `n` of `lineage`'s prompts of the held-out `scenarios` for a test of the
    checkpoints in `chain` (live and the candidate; their ancestors are followed) that drew
    from `tests` so far."""
    if not scenarios:
        return []
    where = "list_contains(?::VARCHAR[], e.scenario_id)"
    return _choose(store, lineage, where, [scenarios], n, chain, tests)


def fresh(
    store,
    lineage: Lineage,
    since: datetime,
    n: int,
    *,
    chain: list[str | None] | tuple = (),
    tests: list[str] | tuple = (),
) -> list[dict]:
    """Up to `n` of `lineage`'s prompts logged on the live arm after `since`, any scenario."""
    where = "e.arm = 'live' AND e.ts > ?"
    return _choose(store, lineage, where, [since], n, chain, tests)


def snapshot_time(store, checkpoint: str) -> datetime | None:
    """When the checkpoint's training snapshot was taken, at the latest: its run's record
    time less the run's length (a run records after it trains). None: no train run (an
    adapter added by hand)."""
    rows = store.query(
        "SELECT t.created - to_microseconds(CAST(coalesce(t.duration_s, 0) * 1e6 AS BIGINT)) "
        "AS since FROM checkpoints c JOIN train_runs t ON t.id = c.train_run WHERE c.name = ?",
        [checkpoint],
    )
    return rows[0]["since"] if rows else None


def _choose(store, lineage: Lineage, where, params, n, chain, tests) -> list[dict]:
    key = tests[0] if tests else ""
    mine, scope = lineage.scope.sql("e.api_key_id")
    ids = f"""
        SELECT e.id, e.ts FROM exchanges e
        WHERE e.status < 400 AND e.source = 'production' AND e.model_alias = ? AND {where}
          AND {mine}
          AND e.trajectory_id NOT IN ({TRAINED_CONVERSATIONS})
          AND e.trajectory_id NOT IN (
              SELECT p.trajectory_id FROM groups g JOIN exchanges p ON p.id = g.prefix_exchange
              WHERE g.kind = 'ab' AND list_contains(?::VARCHAR[], g.test))
          AND e.trajectory_id NOT IN (
              SELECT trajectory_id FROM exchanges
              WHERE arm <> 'live' AND source = 'production' AND trajectory_id IS NOT NULL)
        QUALIFY row_number() OVER (PARTITION BY e.trajectory_id ORDER BY hash(e.id, ?)) = 1
        ORDER BY hash(e.trajectory_id, ?), e.id LIMIT ?
    """
    chain = [c for c in chain if c]
    return store.query(
        f"SELECT * FROM {rebuilt(ids)} ORDER BY ts DESC",
        [lineage.alias, *params, *scope, chain, list(tests), key, key, n],
    )
