"""Routing changes as `deployments` rows: set a canary, promote it, roll it back.

Each change is one transaction: a `deployments` row (alias, live, canary, fraction,
reason, actor, evidence) and the checkpoints' statuses (`canary`, `live`,
`retired`). The latest row per alias is the routing `onjob serve` starts with.
"""

from __future__ import annotations

import json

from ..collector import Store
from . import registry


class DeployError(Exception):
    pass


def current(store: Store) -> dict[str, dict]:
    """The latest routing per alias."""
    rows = store.query(
        "SELECT * FROM deployments "
        "QUALIFY row_number() OVER (PARTITION BY model_alias ORDER BY ts DESC) = 1"
    )
    return {r["model_alias"]: r for r in rows}


def routes(store: Store, defaults: dict[str, str | None]) -> dict[str, dict]:
    """Every alias's arms: its latest deployment, else its configured live checkpoint."""
    out = {
        alias: {"live": live, "canary": None, "fraction": 0.0} for alias, live in defaults.items()
    }
    for alias, row in current(store).items():
        out[alias] = {
            "live": row["live"],
            "canary": row["canary"],
            "fraction": row["fraction"] or 0.0,
        }
    return out


def history(store: Store, limit: int = 100) -> list[dict]:
    return store.query("SELECT * FROM deployments ORDER BY ts DESC LIMIT ?", [limit])


def arms_of(
    store: Store, alias: str, default_live: str | None
) -> tuple[str | None, str | None, float]:
    row = current(store).get(alias)
    if row is None:
        return default_live, None, 0.0
    return row["live"], row["canary"], row["fraction"] or 0.0


def set_canary(
    store: Store,
    alias: str,
    checkpoint: str,
    fraction: float,
    *,
    default_live,
    reason,
    actor,
    evidence=None,
) -> dict:
    if not 0 < fraction <= 1:
        raise DeployError(f"canary fraction {fraction} is not in (0, 1]")
    if registry.get(store, checkpoint) is None:
        raise DeployError(f"{checkpoint!r} is not in the checkpoints table")
    live, canary, _ = arms_of(store, alias, default_live)
    if canary and canary != checkpoint:
        raise DeployError(f"{alias} already has a canary ({canary}): promote or roll it back first")
    if checkpoint == live:
        raise DeployError(f"{checkpoint} is already live for {alias}")
    return _record(
        store,
        alias,
        live,
        checkpoint,
        fraction,
        reason,
        actor,
        evidence,
        statuses={checkpoint: "canary"},
    )


def promote(store: Store, alias: str, *, default_live, reason, actor, evidence=None) -> dict:
    live, canary, _ = arms_of(store, alias, default_live)
    if not canary:
        raise DeployError(f"{alias} has no canary to promote")
    statuses = {canary: "live"}
    if live:
        statuses[live] = "retired"
    return _record(store, alias, canary, None, 0.0, reason, actor, evidence, statuses=statuses)


def rollback(store: Store, alias: str, *, default_live, reason, actor, evidence=None) -> dict:
    live, canary, _ = arms_of(store, alias, default_live)
    if not canary:
        raise DeployError(f"{alias} has no canary to roll back")
    return _record(
        store, alias, live, None, 0.0, reason, actor, evidence, statuses={canary: "retired"}
    )


def _record(store, alias, live, canary, fraction, reason, actor, evidence, *, statuses) -> dict:
    with store.transaction() as con:
        con.execute(
            "INSERT INTO deployments VALUES (now(), ?, ?, ?, ?, ?, ?, ?)",
            [
                alias,
                live,
                canary,
                fraction,
                reason,
                actor,
                json.dumps(evidence) if evidence is not None else None,
            ],
        )
        for name, status in statuses.items():
            con.execute("UPDATE checkpoints SET status = ? WHERE name = ?", [status, name])
    return current(store)[alias]
